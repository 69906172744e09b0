"""What the telemetry sampler costs: tokens/s with the sampler on against off, side by side.

    python benchmarks/telemetry_overhead.py                      # hf backend, tiny model, c=4, 60 rounds (about 2 min on 2 cores)
    python benchmarks/telemetry_overhead.py --backend vllm -c 16
    python benchmarks/telemetry_overhead.py --model demo        # a 100M model, slower
    python benchmarks/telemetry_overhead.py --hz 50 --rounds 30

One backend, one model load. Each round measures the same point twice, once with a
TelemetrySampler running (as the sweep runs it) and once without, in alternating order so
drift and background load fall on both. Prints the median of the per-round ratios
(on / off), the medians of each side, and the sampler thread's own CPU time as a share of
one core, which background load does not disturb. Target: the sampler costs under 2% of
tokens/s; exit code 1 when the median ratio says otherwise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

TARGET = 0.02


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="hf", choices=["hf", "vllm"])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("-c", "--concurrency", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=60, help="rounds; single rounds scatter by several percent")
    ap.add_argument("--runs", type=int, default=3, help="runs of the point per side per round")
    ap.add_argument("--hz", type=float, default=20.0)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()

    from throughputlab.backends import load_backend_class
    from throughputlab.hardware.probe import resolve_device, resolve_dtype
    from throughputlab.models import resolve_model
    from throughputlab.telemetry import TelemetrySampler

    device = resolve_device(args.device)
    cls = load_backend_class("generation", args.backend)
    backend = cls(resolve_model(args.model), dtype=resolve_dtype("auto", device), device=device, seed=0,
                  max_concurrency=args.concurrency, max_len=args.prompt_len + args.output_len)
    backend.start()
    try:
        def point(sampled: bool) -> tuple[float, float, float]:
            sampler = TelemetrySampler(backend.pids, hz=args.hz) if sampled else None
            if sampler:
                sampler.start()
            tokens = 0
            t = time.perf_counter()
            for _ in range(args.runs):
                tokens += backend.run(args.concurrency, args.prompt_len, args.output_len).output_tokens
            wall = time.perf_counter() - t
            if sampler:
                summary = sampler.stop()
                return tokens / wall, sampler.cpu_s / wall, summary.hz
            return tokens / wall, 0.0, 0.0

        for _ in range(3):  # warm-up
            backend.run(args.concurrency, args.prompt_len, args.output_len)
        on, off, ratios, cpu_share, rates = [], [], [], [], []
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            got = {}
            for sampled in order:
                got[sampled] = point(sampled)
            on.append(got[True][0])
            off.append(got[False][0])
            ratios.append(got[True][0] / got[False][0])
            cpu_share.append(got[True][1])
            rates.append(got[True][2])
            print(f"round {r + 1:>2}: on {got[True][0]:9.1f} tok/s, off {got[False][0]:9.1f} tok/s, "
                  f"ratio {ratios[-1]:.3f}", flush=True)
    finally:
        backend.close()

    ratio = statistics.median(ratios)
    print(f"\n{args.backend} backend, {args.model}, c={args.concurrency}, sampler at {args.hz:g} Hz "
          f"(achieved {statistics.median(rates):.1f} Hz), {args.rounds} rounds")
    print(f"tokens/s median: on {statistics.median(on):.1f}, off {statistics.median(off):.1f}")
    print(f"sampler thread CPU: {100 * statistics.median(cpu_share):.2f}% of one core")
    print(f"ratio on/off (median of rounds): {ratio:.4f} -> overhead {100 * (1 - ratio):+.2f}% "
          f"(target < {100 * TARGET:.0f}%): {'PASS' if 1 - ratio < TARGET else 'FAIL'}")
    return 0 if 1 - ratio < TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
