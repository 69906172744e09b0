"""The spread of RL response lengths below their cap, fitted to published veRL logs: the figure behind decide's
default lognormal sigma (decide.lengths.CAPPED_SIGMA, decide.runconfig.RESPONSE_SIGMA).

    python benchmarks/length_tail_fit.py [--data benchmarks/data/response_lengths]

Where a run publishes its mean response length but not the share at the cap, decide takes the lengths as a
lognormal of spread sigma whose mean after the cut is the published one; the share at the cap, and so how long
the slowest engine decodes, follows from sigma. The logs in the data folder print, every step, the mean after
the cut, the longest response and the share at the cap (three decimals). For a sigma, each step's share at the
cap is p = decide.lengths.censored_clip(mean, sigma, cap), and the log's figures are a draw of N responses:
the count at the cap is binomial(N, p), within the printed share's rounding, zero where the step's longest
response is below the cap and at least one where it is at it. The script prints the maximum-likelihood sigma per
log and over all of them, and how sigma 0.6 and the fitted one reproduce the logs' mean share at the cap and the
share of steps whose longest response reaches the cap.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import minimize_scalar
from scipy.stats import binom

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from throughputlab.decide.lengths import censored_clip  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "response_lengths"
ROUNDING = 0.0005  # the logs print the share with three decimals


def load(folder: Path) -> list[dict]:
    index = yaml.safe_load((folder / "sources.yaml").read_text())
    runs = []
    for entry in index["logs"]:
        with open(folder / entry["file"], newline="") as f:
            rows = [(float(r["mean"]), float(r["max"]), float(r["clip_ratio"])) for r in csv.DictReader(f)]
        runs.append({**entry, "rows": rows})
    return runs


def _bounds(n: int, cap: int, longest: float, clip: float) -> tuple[int, int]:
    """The counts at the cap a step's printed figures allow."""
    lo = max(0, math.ceil(n * (clip - ROUNDING) - 1e-9))
    hi = min(n, math.floor(n * (clip + ROUNDING) + 1e-9))
    if longest < cap:
        return 0, 0
    return max(lo, 1), max(hi, 1)


def log_likelihood(run: dict, sigma: float) -> float:
    n, cap = int(run["responses"]), int(run["cap"])
    total = 0.0
    for mean, longest, clip in run["rows"]:
        if not 1 <= mean < cap:
            continue
        p = min(max(censored_clip(mean, sigma, cap), 1e-15), 1 - 1e-12)
        lo, hi = _bounds(n, cap, longest, clip)
        prob = binom.cdf(hi, n, p) - (binom.cdf(lo - 1, n, p) if lo > 0 else 0.0)
        total += math.log(max(prob, 1e-300))
    return total


def fit(runs: list[dict]) -> float:
    res = minimize_scalar(lambda s: -sum(log_likelihood(r, s) for r in runs), bounds=(0.2, 1.5), method="bounded",
                          options={"xatol": 1e-3})
    return float(res.x)


def reproduced(run: dict, sigma: float) -> tuple[float, float]:
    """The mean share at the cap and the share of steps whose longest response reaches it, as sigma gives them."""
    n, cap = int(run["responses"]), int(run["cap"])
    shares, reach = [], []
    for mean, _, _ in run["rows"]:
        p = censored_clip(mean, sigma, cap) if 1 <= mean < cap else 0.0
        shares.append(p)
        reach.append(1 - (1 - p) ** n)
    return float(np.mean(shares)), float(np.mean(reach))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="folder of sources.yaml and the per-step CSVs")
    a = ap.parse_args(argv)
    runs = load(a.data)
    pooled = fit(runs)
    print("Response lengths below the cap: maximum-likelihood lognormal sigma from published veRL logs")
    print(f"{'log':<36} {'steps':>5} {'N':>5} {'mean/cap':>8} {'sigma':>6}   share at cap: log / 0.6 / "
          f"fit    steps reaching the cap: log / 0.6 / fit")
    for r in runs:
        s = fit([r])
        ratio = float(np.median([m / r["cap"] for m, _, _ in r["rows"]]))
        obs_share = float(np.mean([c for _, _, c in r["rows"]]))
        obs_reach = float(np.mean([mx >= r["cap"] for _, mx, _ in r["rows"]]))
        d_share, d_reach = reproduced(r, 0.6)
        f_share, f_reach = reproduced(r, pooled)
        print(f"{r['file'][:-4]:<36} {len(r['rows']):>5} {r['responses']:>5} {ratio:>8.3f} {s:>6.3f}   "
              f"{obs_share:.4f} / {d_share:.4f} / {f_share:.4f}    {obs_reach:.2f} / {d_reach:.2f} / {f_reach:.2f}")
    print(f"all logs together: sigma {pooled:.3f} (log-likelihood {sum(log_likelihood(r, pooled) for r in runs):.1f}; "
          f"at 0.6: {sum(log_likelihood(r, 0.6) for r in runs):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
