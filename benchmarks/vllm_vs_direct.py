"""Does `throughputlab bench --backend vllm` report the engine's real tokens/s?

    python benchmarks/vllm_vs_direct.py                    # tiny model, -c 1,4,16,64 (about 4 min on 2 CPU cores)
    python benchmarks/vllm_vs_direct.py --model demo -c 1,8,32
    python benchmarks/vllm_vs_direct.py --profile prof.json  # compare an existing bench profile
    python benchmarks/vllm_vs_direct.py --interleaved      # one engine, alternating repeat by repeat (1 min)

Side by side, in one run: an independent timing of ``vllm.LLM.generate`` on the same
requests (c prompts of random token ids, exactly output-len tokens with EOS ignored,
temperature 1), then ``throughputlab bench``, then the independent timing again. Each runs in
its own process with its own engine, so no idle engine competes for the cores. The direct
timing uses plain ``vllm.LLM`` with vLLM's defaults except what the shape needs; it shares
no code with the backend. Prints, per concurrency, bench tokens/s over direct tokens/s
(medians, and best runs, which a shared machine's background load disturbs least).
Target: within 10%; exit code 1 when a median ratio misses it.

On a machine shared with other work, rounds minutes apart see different background load
(two OpenMP threads on two cores wait for the slower one, so one busy neighbour can halve
tokens/s); the table shows the other load during each bench point. ``--interleaved``
alternates the two timings repeat by repeat in one engine, so both sides see the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 0.10


def direct_round(args) -> None:
    """One engine, every concurrency: warm-up, then `repeats` timed generate calls each."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import numpy as np
    from vllm import LLM, SamplingParams

    from throughputlab.models import resolve_model

    cfg = {k: v for k, v in resolve_model(args.model).config.items() if not k.startswith("_")}
    conc = [int(x) for x in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "config.json").write_text(json.dumps(cfg))
        llm = LLM(model=folder, load_format="dummy", skip_tokenizer_init=True, dtype=args.dtype, seed=0,
                  max_num_seqs=max(conc), max_model_len=args.prompt_len + args.output_len,
                  **dict(_engine_args(args.engine_arg)))
        params = SamplingParams(temperature=1.0, max_tokens=args.output_len, min_tokens=args.output_len,
                                ignore_eos=True, detokenize=False)
        rng = np.random.default_rng(123)
        result = {}
        for c in conc:
            samples = []
            for i in range(args.repeats + 1):
                ids = rng.integers(10, cfg["vocab_size"], size=(c, args.prompt_len)).tolist()
                t = time.perf_counter()
                outs = llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
                dt = time.perf_counter() - t
                if i:  # the first call is the warm-up
                    samples.append(sum(len(o.outputs[0].token_ids) for o in outs) / dt)
            result[str(c)] = samples
        llm.llm_engine.engine_core.shutdown()
    Path(args.direct_round).write_text(json.dumps(result))


def interleaved(args) -> int:
    """One engine (the backend's), each repeat timed twice back to back: once through the
    backend's run(), once by a plain llm.generate call on equivalent requests. Background load
    on a shared machine then falls on both sides alike."""
    import numpy as np
    from vllm import SamplingParams

    from throughputlab.backends.vllm_gen import VLLMGenerationBackend
    from throughputlab.models import resolve_model

    conc = [int(x) for x in args.concurrency.split(",")]
    resolved = resolve_model(args.model)
    backend = VLLMGenerationBackend(resolved, dtype=args.dtype, device="cpu" if args.dtype == "float32" else "cuda",
                                    seed=0, max_concurrency=max(conc), max_len=args.prompt_len + args.output_len,
                                    engine_args=dict(_engine_args(args.engine_arg)))
    backend.start()
    params = SamplingParams(temperature=1.0, max_tokens=args.output_len, min_tokens=args.output_len,
                            ignore_eos=True, detokenize=False)
    rng = np.random.default_rng(123)
    vocab = resolved.spec.vocab_size
    print(f"\n{args.model}, prompt {args.prompt_len}, output {args.output_len}, {args.dtype}; interleaved in one engine")
    print(f"{'c':>5} {'backend tok/s':>14} {'direct tok/s':>13} {'ratio':>7}")
    worst = 0.0
    try:
        for c in conc:
            ours, direct = [], []
            for i in range(3 * args.repeats + 1):  # short runs: more pairs to even out bursts of load
                for side in ((0, 1) if i % 2 else (1, 0)):
                    if side == 0:
                        s = backend.run(c, args.prompt_len, args.output_len)
                        tps = s.output_tokens / s.total_s
                        (ours.append(tps) if i else None)
                    else:
                        ids = rng.integers(10, vocab, size=(c, args.prompt_len)).tolist()
                        t = time.perf_counter()
                        outs = backend.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
                        dt = time.perf_counter() - t
                        (direct.append(sum(len(o.outputs[0].token_ids) for o in outs) / dt) if i else None)
            ratio = statistics.median(a / b for a, b in zip(ours, direct))  # per pair: both saw the same load
            worst = max(worst, abs(ratio - 1))
            print(f"{c:>5} {statistics.median(ours):>14,.1f} {statistics.median(direct):>13,.1f} {ratio:>7.3f}", flush=True)
    finally:
        backend.close()
    ok = worst <= TARGET
    print(f"largest deviation: {100 * worst:.1f}% (target {100 * TARGET:.0f}%): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def _other_load(point) -> str:
    """CPU busy outside the measured process tree during the point, in cores (host telemetry)."""
    t = point.telemetry
    if t is None or "host_cpu_pct" not in t.mean or "proc_cpu_pct" not in t.mean:
        return "-"
    cores = os.cpu_count() or 1
    return f"{max(t.mean['host_cpu_pct'] * cores - t.mean['proc_cpu_pct'], 0) / 100:.2f} cores"


def _engine_args(items):
    for item in items or []:
        k, v = item.split("=", 1)
        try:
            yield k, json.loads(v)
        except ValueError:
            yield k, v


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("-c", "--concurrency", default="1,4,16,64")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--engine-arg", action="append", help="KEY=VALUE, passed to both engines")
    ap.add_argument("--profile", type=Path, help="compare this bench profile instead of running bench")
    ap.add_argument("--interleaved", action="store_true",
                    help="one engine: backend runs and direct generate calls alternate, repeat by repeat")
    ap.add_argument("--direct-round", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.direct_round:
        direct_round(args)
        return 0
    if args.interleaved:
        return interleaved(args)

    from throughputlab.profile import Profile

    if args.profile:  # take the shape from the profile so both sides time the same requests
        prof = Profile.load(args.profile)
        args.concurrency = ",".join(str(p.concurrency) for p in prof.generation if p.status == "ok")
        args.prompt_len, args.output_len = prof.settings.prompt_len, prof.settings.output_len
        args.dtype = prof.settings.dtype

    work = Path(tempfile.mkdtemp(prefix="vllm-vs-direct-"))
    base = [sys.executable, __file__, "--model", args.model, "-c", args.concurrency, "--prompt-len",
            str(args.prompt_len), "--output-len", str(args.output_len), "--repeats", str(args.repeats),
            "--dtype", args.dtype, *[f"--engine-arg={e}" for e in args.engine_arg or []]]
    direct: dict[str, list[float]] = {}

    def run_direct(tag: str) -> None:
        out = work / f"direct-{tag}.json"
        print(f"direct vllm.LLM.generate, round {tag} ...", flush=True)
        subprocess.run([*base, "--direct-round", str(out)], check=True)
        for c, xs in json.loads(out.read_text()).items():
            direct.setdefault(c, []).extend(xs)

    run_direct("1")
    if args.profile is None:
        args.profile = work / "bench.json"
        cmd = [sys.executable, "-m", "throughputlab", "bench", "--backend", "vllm", "--model", args.model,
               "--only", "gen", "-c", args.concurrency, "--prompt-len", str(args.prompt_len), "--output-len",
               str(args.output_len), "--repeats", str(args.repeats), "--dtype", args.dtype,
               "-o", str(args.profile), *[f"--engine-arg={e}" for e in args.engine_arg or []]]
        print("throughputlab bench ...", " ".join(cmd[2:]), flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    run_direct("2")

    prof = Profile.load(args.profile)
    print(f"\n{args.model}, prompt {args.prompt_len}, output {args.output_len}, {args.dtype}; "
          f"bench: {args.profile}")
    print(f"{'c':>5} {'bench tok/s':>12} {'direct tok/s':>13} {'ratio':>7} {'best ratio':>11} {'other load':>11}")
    worst = 0.0
    for p in sorted(prof.generation, key=lambda p: p.concurrency):
        d = direct.get(str(p.concurrency))
        if p.status != "ok" or not d:
            continue
        ratio = p.tokens_per_s / statistics.median(d)
        best = max(p.tokens_per_s_samples) / max(d)
        worst = max(worst, abs(ratio - 1))
        print(f"{p.concurrency:>5} {p.tokens_per_s:>12,.1f} {statistics.median(d):>13,.1f} {ratio:>7.3f} {best:>11.3f}"
              f" {_other_load(p):>11}")
    ok = worst <= TARGET
    print(f"largest deviation of the median ratio: {100 * worst:.1f}% (target {100 * TARGET:.0f}%): "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
