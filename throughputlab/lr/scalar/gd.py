"""Deep scalar linear networks: gradient descent on every weight, and its measured convergence rate.

`simulate_gd` runs full-batch GD on L weights (plain or residual, any start);
`simulate_gd_balanced` runs many balanced starts at once on one scalar each; `measured_rate`
fits the per-step linear rate of a trajectory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from throughputlab.lr.scalar.data import ScalarData, check_depth


@dataclass
class GDTrajectory:
    """Products p_k = prod_l (weights after k steps), k = 0..steps; `weights` are the last ones."""

    p: np.ndarray
    weights: np.ndarray
    lr: float
    diverged: bool


def others_and_product(s: np.ndarray) -> tuple[np.ndarray, float]:
    """For factors s_l: the product of all factors but s_l, for each l, and the product of all.

    Prefix and suffix products, without dividing (a factor may be 0).
    """
    prefix = np.concatenate(([1.0], np.cumprod(s[:-1])))
    suffix = np.concatenate((np.cumprod(s[::-1][:-1])[::-1], [1.0]))
    others = prefix * suffix
    return others, others[-1] * s[-1]


def simulate_gd(depth: int, data: ScalarData, lr: float, steps: int, w0, residual: bool = False,
                branch_scale: float = 1.0) -> GDTrajectory:
    """Full-batch gradient descent on every weight (no balancedness assumed).

    `w0` is a scalar (every layer the same) or one value per layer. Plain: f = prod w_l x.
    Residual: f = prod (1 + branch_scale * w_l) x.
    """
    depth = check_depth(depth)
    w = np.broadcast_to(np.asarray(w0, dtype=float), (depth,)).copy()
    beta = float(branch_scale) if residual else 1.0
    p_out = np.empty(steps + 1)
    diverged = False
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(steps + 1):
            s = 1.0 + beta * w if residual else w
            others, p = others_and_product(s)
            p_out[k] = p
            if not math.isfinite(p) or abs(p) > 1e150:
                p_out[k:] = np.nan
                diverged = True
                break
            if k == steps:
                break
            w = w - lr * (data.exx * p - data.exy) * beta * others
    return GDTrajectory(p=p_out, weights=w, lr=lr, diverged=diverged)


def simulate_gd_balanced(depths: Sequence[int], data: ScalarData, lrs: Sequence[float], steps: int,
                         w0: Sequence[float]) -> np.ndarray:
    """GD from balanced starts for many (depth, lr, w0) at once; returns p with shape (steps+1, n).

    A balanced start stays balanced under GD (each layer gets the same update), so one scalar
    per run suffices: w <- w - lr (E[x^2] w^L - E[xy]) w^(L-1).
    """
    L = np.asarray(depths, dtype=float)
    lr = np.asarray(lrs, dtype=float)
    w = np.asarray(w0, dtype=float).copy()
    out = np.empty((steps + 1, len(L)))
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(steps + 1):
            wl1 = w ** (L - 1)
            p = wl1 * w
            out[k] = p
            if k < steps:
                w = w - lr * (data.exx * p - data.exy) * wl1
                w = np.where(np.isfinite(w) & (np.abs(w) < 1e100), w, np.nan)
    return out


def measured_rate(p: np.ndarray, p_star: float, lo: float = 1e-11, hi: float = 1e-5) -> Optional[float]:
    """Per-step linear convergence rate -d log|p_k - p*| / dk, fitted where the error is in [lo, hi]*|p*|.

    None when the run diverged or never reached that window.
    """
    err = np.abs(np.asarray(p, dtype=float) - p_star) / abs(p_star)
    if not np.all(np.isfinite(err)):
        return None
    idx = np.nonzero((err <= hi) & (err >= lo))[0]
    if idx.size < 3:
        return None
    # only the first contiguous stretch: rounding noise near lo must not enter
    first = idx[0]
    stop = first
    while stop + 1 < len(err) and lo <= err[stop + 1] <= hi:
        stop += 1
    if stop - first < 2:
        return None
    k = np.arange(first, stop + 1)
    slope = np.polyfit(k, np.log(err[first:stop + 1]), 1)[0]
    return float(-slope)
