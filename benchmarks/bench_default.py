"""Issue check for the measurement core: run the default `throughputlab bench` (demo model, both
sweeps) as a user would, time it, and print the two-regime figures from the profile it writes.

    python benchmarks/bench_default.py [-o reports/cpu-demo.json]
    python benchmarks/bench_default.py --compare-rounds 2,3 --runs 8

The second form alternates the default run at each `--rounds` value (side by side, as the
machine's speed wanders) and prints, per run, the wall time and the fit's largest held-out
tokens/s error of each sweep, then the medians and how many runs stay within 8% (generation)
and 10% (training).

Prints: wall time; per concurrency the decode step time and tokens/s; the growth of the decode
step time per doubling from concurrency 1 to 4 (memory-bound: small), and the growth of
tokens/s over the top doubling of the sweep (compute-bound: small).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this working tree's library

from throughputlab.fit.run import fit_profile  # noqa: E402
from throughputlab.records.profile import Profile  # noqa: E402


def regimes(profile: Profile) -> dict:
    pts = sorted((p for p in profile.generation if p.status == "ok"), key=lambda p: p.concurrency)
    by_c = {p.concurrency: p for p in pts}
    step_growth = [by_c[2 * c].decode_step_s / by_c[c].decode_step_s - 1 for c in (1, 2) if c in by_c and 2 * c in by_c]
    top = pts[-1]
    half = by_c.get(top.concurrency // 2)
    top_gain = top.tokens_per_s / half.tokens_per_s - 1 if half else None
    return {"step_growth_1_to_4": step_growth, "top_doubling_tps_gain": top_gain, "top_c": top.concurrency}


def held_out(path: Path) -> tuple[float, float]:
    """The fit's largest held-out tokens/s error (leave one point out) of generation and training."""
    res = fit_profile(Profile.load(path))
    return res.generation.loo_max_abs_error, res.training.loo_max_abs_error


def compare_rounds(values: list[int], runs: int) -> None:
    rows: dict[int, list[tuple[float, float, float]]] = {r: [] for r in values}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(runs):
            for r in values:
                out = Path(tmp) / f"r{r}_{i}.json"
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "throughputlab", "bench", "--force", "--rounds", str(r),
                                "-o", str(out)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                wall = time.perf_counter() - t
                gen, train = held_out(out)
                rows[r].append((wall, gen, train))
                print(f"run {i + 1} --rounds {r}: {wall:5.1f} s, held-out max generation {100 * gen:4.1f}%, "
                      f"training {100 * train:4.1f}%", flush=True)
    for r, got in rows.items():
        walls, gens, trains = zip(*got)
        print(f"--rounds {r}: wall median {statistics.median(walls):.1f} s ({min(walls):.1f}-{max(walls):.1f}); "
              f"held-out max generation median {100 * statistics.median(gens):.1f}%, within 8% in "
              f"{sum(g <= 0.08 for g in gens)}/{len(gens)}; training median {100 * statistics.median(trains):.1f}%, "
              f"within 10% in {sum(t <= 0.10 for t in trains)}/{len(trains)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", type=Path, default=Path("reports/cpu-demo.json"))
    ap.add_argument("--existing", action="store_true", help="only analyse an existing profile")
    ap.add_argument("--compare-rounds", metavar="A,B", help="alternate default runs at these --rounds values")
    ap.add_argument("--runs", type=int, default=4, help="runs per value with --compare-rounds (default 4)")
    args = ap.parse_args()
    if args.compare_rounds:
        compare_rounds([int(v) for v in args.compare_rounds.split(",")], args.runs)
        return
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
