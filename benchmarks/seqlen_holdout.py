"""Does the training model predict tokens/s across sequence lengths?

Measures the tiny (or demo) model's training micro-steps at sequence lengths 128 to 1,024 (a few
micro-batches each) with the torch backend, fits, and prints every point's held-out tokens/s
error (the point left out of the fit), the form the fit chose (one PHI_train for every FLOP, or
the causal attention at its own rate PHI_attn) beside the other form's errors, and the activation
memory per sequence at each length. Target: held-out error at most 5% at every point.

    python benchmarks/seqlen_holdout.py [--model tiny|demo] [--profile existing.json] [--out seqlen_holdout.json]
        [--rounds N --repeats N] [--compare another.json]

Run it alone (two CPU-bound processes on two cores slow each other several times over).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

SEQ_LENS = (128, 256, 512, 1024)
MICRO_BATCHES = (1, 2, 4)
# (rounds, repeats): tiny's steps take 40 ms to 1 s on two cores, and single samples spread by 5-10%
# (another process on one of the cores), so 24 samples a point; demo's take 0.5 to 18 s, so 3
ROUNDS_REPEATS = {"tiny": (8, 3), "demo": (3, 1)}
TARGET = 0.05


def measure(out: Path, model: str, rounds: int, repeats: int) -> None:
    cmd = [sys.executable, "-m", "throughputlab", "bench", "-m", model, "--only", "train",
           "--seq-lens", ",".join(map(str, SEQ_LENS)), "-b", ",".join(map(str, MICRO_BATCHES)),
           "--rounds", str(rounds), "--repeats", str(repeats), "--no-telemetry", "-o", str(out)]
    if out.exists():
        cmd.append("--resume")
    print("$ python", " ".join(cmd[1:]), flush=True)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    print(f"measured in {time.perf_counter() - t:.0f} s", flush=True)


def leave_one_length_out(prof) -> None:
    """Each sequence length predicted by a fit of the others, against that fit's 80% interval."""
    from throughputlab.fit import fit_profile

    ok = [p for p in prof.training if p.status == "ok"]
    lengths = sorted({p.seq_len for p in ok})
    if len(lengths) < 3:
        return
    print("\nleave one sequence length out (fit on the other lengths; 80% interval of that fit):")
    print("  seq len  micro-batch  measured tok/s  predicted  error  80% interval      inside  interval vs seen")
    inside = n = 0
    for length in lengths:
        sub = prof.model_copy(deep=True)
        sub.training = [p for p in prof.training if p.seq_len != length]
        r = fit_profile(sub, bootstrap=0)
        sp = r.model.train_spread
        seen = max((abs(e.loo_rel_error) for e in r.training.points if e.loo_rel_error is not None), default=0.0)
        for p in sorted((p for p in ok if p.seq_len == length), key=lambda p: p.micro_batch):
            pred = r.model.train_tokens_per_s(p.micro_batch, length)
            band = r.model.train_tokens_per_s_interval(p.micro_batch, length)
            meas = p.tokens_per_s
            hit = band is not None and band[0] <= meas <= band[1]
            inside, n = inside + hit, n + 1
            iv = "-" if band is None else f"{band[0]:.1f} - {band[1]:.1f}"
            width = "-" if sp is None else f"+{100 * (sp.hi - 1):.1f}% vs {100 * seen:.1f}%"
            print(f"  {length:>7}  {p.micro_batch:>11}  {meas:>14.1f}  {pred:>9.1f}  {100 * (pred / meas - 1):+5.1f}%  "
                  f"{iv:>15}  {'yes' if hit else 'no':>6}  {width}")
    print(f"held-out points inside the 80% interval: {inside}/{n}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=None, help="use this profile instead of measuring")
    ap.add_argument("--out", type=Path, default=Path("seqlen_holdout.json"))
    ap.add_argument("--model", choices=sorted(ROUNDS_REPEATS), default="tiny",
                    help="tiny: about two minutes on a 2-core CPU; demo: about four")
    ap.add_argument("--rounds", type=int, default=None, help="passes over the grid (default: by model)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs a point gets per pass (default: by model)")
    ap.add_argument("--compare", type=Path, default=None,
                    help="another profile of the same grid: print both fits' residuals side by side, to tell "
                         "errors that repeat from run to run (the kernels' own shape effects) from noise")
    args = ap.parse_args()
    path = args.profile or args.out
    if args.profile is None:
        rounds, repeats = ROUNDS_REPEATS[args.model]
        measure(path, args.model, args.rounds or rounds, args.repeats or repeats)

    import throughputlab.fit.training as training
    from throughputlab.fit import fit_profile
    from throughputlab.records.profile import Profile

    prof = Profile.load(path)
    fits = {"chosen": fit_profile(prof, bootstrap=0)}
    ratio = training.SPLIT_SEQ_RATIO
    training.SPLIT_SEQ_RATIO = float("inf")  # one PHI_train for every FLOP
    try:
        fits["one PHI_train"] = fit_profile(prof, bootstrap=0)
    finally:
        training.SPLIT_SEQ_RATIO = ratio
    tr = fits["chosen"].training
    errors = ", ".join(f"{k} {100 * v:.2f}%" for k, v in tr.form_loo_mean_abs_error.items() if v is not None)
    print(f"\n{prof.model.name}, device {prof.settings.device}, dtype {prof.settings.dtype}: {tr.n_points} points at "
          f"sequence lengths {', '.join(map(str, tr.seq_lens))} x micro-batches {MICRO_BATCHES}")
    print(f"form chosen: {tr.form} (mean held-out error by form: {errors})")
    print(f"attention term: {tr.attention_note}")
    for e in tr.params:
        print(f"  {e.name:<28} {e.value:.4g} {e.unit}")
    print("\nheld-out tokens/s (each point left out of the fit):")
    print("  seq len  micro-batch  measured tok/s  " + "  ".join(f"{k + ' pred':>20} {'err':>6}" for k in fits))
    worst = 0.0
    rows = {k: {(p.context_len, p.x): p for p in r.training.points} for k, r in fits.items()}
    for key in sorted(rows["chosen"]):
        p = rows["chosen"][key]
        cells = []
        for k in fits:
            q = rows[k][key]
            cells.append(f"{q.loo_tokens_per_s:>20.1f} {100 * q.loo_rel_error:>+5.1f}%")
        worst = max(worst, abs(p.loo_rel_error))
        print(f"  {key[0]:>7.0f}  {key[1]:>11}  {p.measured_tokens_per_s:>14.1f}  " + "  ".join(cells))
    verdict = "met" if worst <= TARGET else "NOT met"
    print(f"max held-out error, chosen form: {100 * worst:.1f}% (target {100 * TARGET:.0f}%: {verdict}); "
          f"one PHI_train: {100 * fits['one PHI_train'].training.loo_max_abs_error:.1f}%")

    leave_one_length_out(prof)
    if args.compare is not None:
        compare(fits["chosen"], fit_profile(Profile.load(args.compare), bootstrap=0), args.compare)

    mem = tr.memory
    if mem is None:
        print("\nno memory fit (peak memory not recorded)")
        return
    mib = 2 ** 20
    print(f"\nmemory: M0 {mem.mem0_bytes / mib:.1f} MiB + b x m(S); {mem.activation_note}")
    print(f"  m(S) = {mem.mem_per_token_bytes / 1024:.3g} KiB x S"
          + (f" + {mem.mem_per_token_sq_bytes:.3g} B x S^2" if mem.activation_form == "quadratic" else ""))
    print("  seq len  m(S) MiB  own line MiB/seq (M0 MiB)  held-out max  largest micro-batch that fits")
    for a in mem.per_seq_len:
        own = (f"{a.line_mem_per_sample_bytes / mib:>12.2f} ({a.line_mem0_bytes / mib:>7.1f})"
               if a.line_mem_per_sample_bytes is not None else f"{'n/a':>22}")
        held = f"{100 * a.loo_max_abs_error:.1f}%" if a.loo_max_abs_error is not None else "n/a"
        print(f"  {a.seq_len:>7}  {a.mem_per_sample_bytes / mib:>8.2f}  {own:>25}  {held:>12}  {a.max_micro_batch}")


def compare(this, other, other_path: Path) -> None:
    """Each point's residual (measured over fitted tokens/s, all points in the fit) in both runs, and
    their correlation: residuals that repeat are the machine's kernels, which no smooth term follows."""
    import numpy as np

    mine = {(p.context_len, p.x): p for p in this.training.points}
    theirs = {(p.context_len, p.x): p for p in other.training.points}
    keys = sorted(set(mine) & set(theirs))
    if len(keys) < 3:
        print(f"\n--compare: {other_path} shares {len(keys)} point(s) with this profile, too few to compare")
        return
    a = np.array([mine[k].measured_tokens_per_s / mine[k].fitted_tokens_per_s - 1 for k in keys])
    b = np.array([theirs[k].measured_tokens_per_s / theirs[k].fitted_tokens_per_s - 1 for k in keys])
    print(f"\nresiduals of the full fit (measured / fitted tokens/s - 1), this profile and {other_path}:")
    print("  seq len  micro-batch    this   other")
    for k, x, y in zip(keys, a, b):
        print(f"  {k[0]:>7.0f}  {k[1]:>11}  {100 * x:+5.1f}%  {100 * y:+5.1f}%")
    r = float(np.corrcoef(a, b)[0, 1])
    print(f"correlation {r:+.2f} over {len(keys)} points; rms {100 * np.sqrt(np.mean(a ** 2)):.1f}% and "
          f"{100 * np.sqrt(np.mean(b ** 2)):.1f}%, rms of their difference {100 * np.sqrt(np.mean((a - b) ** 2)):.1f}%")


if __name__ == "__main__":
    main()
