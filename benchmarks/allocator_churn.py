"""Training steps of a model on the CPU under glibc malloc and under a caching allocator, side by side.

    python benchmarks/allocator_churn.py [--model demo] [--batches 1,2,4,8] [--seq-len 128] [--steps 3]

Runs the torch training backend in fresh processes, one with the system allocator and one with
each caching allocator found (tcmalloc/jemalloc from the system, mimalloc from the
cmeel-mimalloc package), interleaved over `--rounds`, and prints
per micro-batch: median forward, backward and optimizer times, forward+backward per sample,
minor page faults per step and peak RSS, then each allocator's step time over glibc's (median
over the rounds). Exit code 2 when no caching allocator is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import json, resource, statistics, sys
from throughputlab.backends.torch_train import TorchTrainingBackend
from throughputlab.models import resolve_model
model, seq, steps, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), [int(b) for b in sys.argv[4].split(",")]
b = TorchTrainingBackend(resolve_model(model), dtype=sys.argv[5], device="cpu")
b.start()
rows = []
for mb in batches:
    b.reset_peak_memory()
    b.run(mb, seq)  # warm-up at this size
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    s = [b.run(mb, seq) for _ in range(steps)]
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / steps
    med = lambda k: statistics.median(getattr(x, k) for x in s)
    rows.append({"b": mb, "fwd": med("forward_s"), "bwd": med("backward_s"), "opt": med("optimizer_s"),
                 "faults": faults, "peak": b.peak_memory_bytes()})
print(json.dumps(rows))
"""


def run(args, preload: str | None) -> list[dict]:
    from throughputlab.allocator import preload_env

    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env = preload_env(preload, env)  # as bench preloads it
    out = subprocess.run([sys.executable, "-c", WORKER, args.model, str(args.seq_len), str(args.steps), args.batches,
                          args.dtype], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    from throughputlab.allocator import packaged_mimalloc
    from throughputlab.hardware.probe import resolve_dtype

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    args.dtype = resolve_dtype(args.dtype, "cpu")
    libs = [lib for lib in (find_library_system(), packaged_mimalloc()) if lib]
    if not libs:
        print("no caching allocator installed (pip install cmeel-mimalloc, or Debian: apt install "
              "libtcmalloc-minimal4)", file=sys.stderr)
        return 2
    print(f"{args.model}, seq {args.seq_len}, {args.dtype}, median of {args.steps} steps after one warm-up per size, "
          f"{args.rounds} interleaved round(s)")
    names = ["glibc", *libs]
    results: dict[str, list[list[dict]]] = {n: [] for n in names}
    for _ in range(args.rounds):
        for n in names:
            results[n].append(run(args, None if n == "glibc" else n))
    for name, runs in results.items():
        for rows in runs:
            for r in rows:
                fb = (r["fwd"] + r["bwd"]) * 1e3
                print(f"{Path(name).name:>26}  b {r['b']:>3}  fwd {r['fwd'] * 1e3:7.0f} ms  bwd {r['bwd'] * 1e3:7.0f} ms  "
                      f"opt {r['opt'] * 1e3:5.0f} ms  fwd+bwd per sample {fb / r['b']:6.0f} ms  "
                      f"faults/step {r['faults']:8.0f}  peak {(r['peak'] or 0) / 1e9:5.2f} GB")

    def step(r):
        return r["fwd"] + r["bwd"] + r["opt"]

    for lib in libs:
        ratios = []
        for i in range(len(results["glibc"][0])):
            ratios.append(statistics.median(step(o[i]) / step(b[i]) for o, b in zip(results[lib], results["glibc"])))
        print(f"step time under {Path(lib).name} / glibc, by micro-batch: "
              + ", ".join(f"{g['b']}: {r:.2f}" for g, r in zip(results["glibc"][0], ratios)))
    return 0


def find_library_system():
    import ctypes.util

    from throughputlab.allocator import CANDIDATES

    return next((lib for lib in map(ctypes.util.find_library, CANDIDATES) if lib), None)


if __name__ == "__main__":
    sys.exit(main())
