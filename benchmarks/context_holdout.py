"""Does the decode model fitted on short contexts predict a long one?

Measures the demo model on the hf backend at prompt lengths 64..512 and at 2,048 (three
concurrencies each), fits on the contexts up to 512 only, and prints the predicted decode step at
2,048 beside the measured one, for the form the fit chose and for today's single-roofline form.

    python benchmarks/context_holdout.py [--backend hf|vllm] [--rounds 2] [--profile existing.json]
        [--out reports/.../context_holdout.json]

Run it alone (two CPU-bound processes on two cores slow each other several times over).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

FIT_CONTEXTS = (64, 128, 256, 512)
HELD_OUT = 2048
CONCURRENCY = (1, 4, 16)
OUTPUT_LEN = 16


def measure(out: Path, backend: str, rounds: int) -> None:
    cmd = [sys.executable, "-m", "throughputlab", "bench", "-m", "demo", "--only", "gen", "--backend", backend,
           "--contexts", ",".join(map(str, (*FIT_CONTEXTS, HELD_OUT))), "-c", ",".join(map(str, CONCURRENCY)),
           "--output-len", str(OUTPUT_LEN), "--rounds", str(rounds), "--repeats", "1", "--no-telemetry", "-o", str(out)]
    if out.exists():
        cmd.append("--resume")
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=None, help="use this profile instead of measuring")
    ap.add_argument("--out", type=Path, default=Path("context_holdout.json"))
    ap.add_argument("--backend", choices=("hf", "vllm"), default="hf")
    ap.add_argument("--rounds", type=int, default=2, help="passes over the grid (each adds a run to every point)")
    args = ap.parse_args()
    path = args.profile or args.out
    if args.profile is None:
        measure(path, args.backend, args.rounds)

    import throughputlab.fit.generation as generation
    from throughputlab.fit import fit_profile
    from throughputlab.records.profile import Profile

    prof = Profile.load(path)
    short = prof.model_copy(deep=True)
    short.generation = [p for p in prof.generation if p.prompt_len in FIT_CONTEXTS]
    held = sorted((p for p in prof.generation if p.prompt_len == HELD_OUT and p.status == "ok"),
                  key=lambda p: p.concurrency)
    fits = {"chosen": fit_profile(short, bootstrap=0)}
    ratio = generation.SPLIT_CONTEXT_RATIO
    generation.SPLIT_CONTEXT_RATIO = float("inf")  # today's form only
    try:
        fits["single roofline"] = fit_profile(short, bootstrap=0)
    finally:
        generation.SPLIT_CONTEXT_RATIO = ratio
    print(f"\n{prof.settings.gen_backend} backend; fitted on prompts {', '.join(map(str, FIT_CONTEXTS))} x concurrency {CONCURRENCY} "
          f"(output {OUTPUT_LEN}); held out: prompt {HELD_OUT}")
    for name, r in fits.items():
        g = r.generation
        print(f"\n{name}: {g.form} form; held-out error of the fit points max "
              f"{100 * (g.loo_max_abs_error or 0):.1f}%")
        print(f"  attention terms: {g.attention_note}")
        print("  concurrency  context  measured step ms  predicted ms  error  attention share  80% interval ms  inside")
        inside = 0
        for p in held:
            s = p.prompt_len + p.output_len / 2
            pred = r.model.decode_step_s(p.concurrency, s)
            meas = p.decode_step_s
            share = r.model.attention_share(p.concurrency, s)
            band = r.model.decode_step_s_interval(p.concurrency, s)
            ok = band is not None and band[0] <= meas <= band[1]
            inside += ok
            iv = "-" if band is None else f"{1e3 * band[0]:.2f} - {1e3 * band[1]:.2f}"
            print(f"  {p.concurrency:>11}  {s:>7.0f}  {1e3 * meas:>16.2f}  {1e3 * pred:>12.2f}  "
                  f"{100 * (pred / meas - 1):+5.1f}%  {100 * share:>14.0f}%  {iv:>15}  {'yes' if ok else 'no':>6}")
        sp = r.model.gen_spread
        if sp is not None:
            seen = max(abs(e.loo_rel_error) for e in g.points if e.loo_rel_error is not None)
            print(f"  held-out decode steps inside the 80% interval: {inside}/{len(held)}; the interval "
                  f"-{100 * (1 - sp.lo):.1f}%/+{100 * (sp.hi - 1):.1f}% against the largest held-out error the fit "
                  f"has seen, {100 * seen:.1f}% ({'no wider' if sp.hi - 1 <= seen else 'WIDER'}); {sp.basis}")


if __name__ == "__main__":
    main()
