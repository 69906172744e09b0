"""Would a KV term that does not shrink with fewer sequences predict the long-context decode step?

An experiment on profiles written by ``benchmarks/context_holdout.py`` (decode steps at prompts of
64 to 512 tokens and at 2,048, at a few concurrencies), not the fit. Past 512 tokens vLLM's CPU
attention read the KV cache at about 8 GB/s with one sequence and 25 GB/s with sixteen: a rate
that grows with the concurrency, which one KV bandwidth cannot follow. Two linear shapes of the
decode step are fitted (non-negative least squares on relative residuals) on the contexts up to
512 only and asked for the held-out 2,048-token steps:

- ``t0 + B*c + C*c*s``: the weights' constant part, per-sequence work, and every cached token read
  at one rate (the shape of the product's fit, without its ceilings);
- ``t0 + B*c + C*c*s + D*s``: plus a per-step cost that grows with the context but not with the
  number of sequences, as when one sequence's KV is read by one worker at a time (what split-KV
  kernels such as FlashDecoding remove on GPUs). Its KV rate per cached token is then
  ``k / (C + D/c)``.

``c`` is the concurrency and ``s`` the mean context of a decode step.

    python benchmarks/kv_concurrency_fit.py PROFILE [PROFILE ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from throughputlab import roofline as rf
from throughputlab.fit.schema import costs_of
from throughputlab.records.profile import Profile

FIT_MAX_CONTEXT = 1000  # mean contexts up to 520 are fitted; the 2,056-token points are held out
SHAPES = {"t0 + B*c + C*c*s": 3, "t0 + B*c + C*c*s + D*s": 4}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", type=Path, nargs="+")
    args = ap.parse_args()
    for path in args.profiles:
        prof = Profile.load(path)
        pts = [g for g in prof.generation if g.status == "ok" and g.decode_step_s]
        c = np.array([g.concurrency for g in pts], float)
        s = np.array([rf.mean_context(g.prompt_len, g.output_len) for g in pts])
        y = np.array([g.decode_step_s for g in pts])
        fit, held = s < FIT_MAX_CONTEXT, s >= FIT_MAX_CONTEXT
        cols = np.column_stack([np.ones_like(c), c, c * s, s])
        k = costs_of(prof).kv_bytes_per_token
        print(f"{path} ({prof.settings.gen_backend}, {prof.settings.dtype}): fitted on {int(fit.sum())} points, "
              f"held out {int(held.sum())}")
        for name, n in SHAPES.items():
            w = 1 / y[fit]
            x, _ = nnls(cols[fit, :n] * w[:, None], y[fit] * w)
            pred = cols[:, :n] @ x
            errs = "  ".join(f"c={ci:.0f}: {100 * (p / m - 1):+5.1f}%" for ci, p, m in zip(c[held], pred[held], y[held]))
            rate = "  KV rate " + ", ".join(
                f"c={ci:.0f}: {k / (x[2] + (x[3] if n > 3 else 0.0) / ci) / 1e9:.3g} GB/s"
                for ci in sorted(set(c[held]))) if x[2] > 0 else "  KV rate: no KV term fitted"
            print(f"  {name:<24} {errs}{rate}")
        meas = []
        for ci in sorted(set(c)):
            at = sorted(((si, yi) for si, yi, cc in zip(s, y, c) if cc == ci))
            (s0, y0), (s1, y1) = [a for a in at if a[0] < FIT_MAX_CONTEXT][-1], at[-1]
            if s1 > s0:
                meas.append(f"c={ci:.0f}: {k * ci * (s1 - s0) / (y1 - y0) / 1e9:.3g} GB/s" if y1 > y0 else
                            f"c={ci:.0f}: no growth")
        print("  measured past the fit range (longest fitted context to the held-out one): " + ", ".join(meas))


if __name__ == "__main__":
    main()
