"""Issue check for the measurement core: run the default `throughputlab bench` (demo model, both
sweeps) as a user would, time it, and print the two-regime figures from the profile it writes.

    python benchmarks/bench_default.py [-o reports/cpu-demo.json]

Prints: wall time; per concurrency the decode step time and tokens/s; the growth of the decode
step time per doubling from concurrency 1 to 4 (memory-bound: small), and the growth of
tokens/s over the top doubling of the sweep (compute-bound: small).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from throughputlab.records.profile import Profile


def regimes(profile: Profile) -> dict:
    pts = sorted((p for p in profile.generation if p.status == "ok"), key=lambda p: p.concurrency)
    by_c = {p.concurrency: p for p in pts}
    step_growth = [by_c[2 * c].decode_step_s / by_c[c].decode_step_s - 1 for c in (1, 2) if c in by_c and 2 * c in by_c]
    top = pts[-1]
    half = by_c.get(top.concurrency // 2)
    top_gain = top.tokens_per_s / half.tokens_per_s - 1 if half else None
    return {"step_growth_1_to_4": step_growth, "top_doubling_tps_gain": top_gain, "top_c": top.concurrency}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", type=Path, default=Path("reports/cpu-demo.json"))
    ap.add_argument("--existing", action="store_true", help="only analyse an existing profile")
    args = ap.parse_args()
    if not args.existing:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "throughputlab", "bench", "--force", "-o", str(args.output)], check=True)
        print(f"\nwall time of `throughputlab bench` (defaults): {time.perf_counter() - t:.0f} s")
    prof = Profile.load(args.output)
    ok_gen = [p for p in prof.generation if p.status == "ok"]
    ok_train = [p for p in prof.training if p.status == "ok"]
    print(f"generation points ok: {len(ok_gen)}/{len(prof.generation)}; training points ok: {len(ok_train)}/{len(prof.training)}")
    print(f"{'c':>4} {'decode step ms':>15} {'tokens/s':>10}")
    for p in sorted(ok_gen, key=lambda p: p.concurrency):
        print(f"{p.concurrency:>4} {p.decode_step_s * 1e3:15.2f} {p.tokens_per_s:10.1f}")
    r = regimes(prof)
    print("decode step growth per doubling, c=1->2, 2->4: "
          + ", ".join(f"{100 * g:.1f}%" for g in r["step_growth_1_to_4"]) + "  (memory-bound if < 30%)")
    if r["top_doubling_tps_gain"] is not None:
        print(f"tokens/s gain over the top doubling (c={r['top_c'] // 2}->{r['top_c']}): "
              f"{100 * r['top_doubling_tps_gain']:.1f}%  (compute-bound if < 25%)")


if __name__ == "__main__":
    main()
