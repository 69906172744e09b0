"""Learning-rate laws from sweeps: optimal lr per (N, D), the power law, curvature, effective lr.

Input: one row per training run with model parameters N, training tokens D, learning rate,
final loss and, optionally, weight and update norms (or an effective learning rate
directly). Steps:

1. Per (N, D), the optimum: a quadratic in x = log(lr) through the points around the lowest
   loss (the minimum and `window` neighbours on each side); x* = -q1 / (2 q2) with a
   delta-method interval. An optimum at the edge of the grid, or a fit without a minimum,
   is recorded with a note and left out of the law.
2. The law log lr* = c0 + alpha log N + beta log D by least squares, with t intervals.
3. Curvature: the same fit plus (log N - mean)^2 and (log D - mean)^2 terms; their t tests and
   a joint F test. Upward curvature (positive terms) means lr* falls more slowly at scale
   than the power law says. Held out: the groups at the largest N (then the largest D) are
   predicted from the rest; the error, in factors of lr and in prediction standard errors,
   compares extrapolating in N with extrapolating in D.
4. With norms, the same on the effective learning rate ||dW|| / ||W|| (per step), and
   whether the curvature goes away there.

This package runs the steps (`analyse`, `fit_sweep`); the parts are its modules: `sweep`
(the CSV's columns, loading, synthetic sweeps), `stats` (the fits), `models` (the result
schema) and `summary` (the printed lines). Their public names are importable from here.

Unknown values are None, never inf.
"""

from __future__ import annotations

from typing import Literal

from throughputlab.errors import UserError
from throughputlab.lr.law.models import (
    SCHEMA_VERSION,
    Coef,
    Curvature,
    Holdout,
    LawAnalysis,
    LawFit,
    LRFitReport,
    Optimum,
)
from throughputlab.lr.law.stats import check_curvature, find_optima, fit_law, holdout
from throughputlab.lr.law.summary import summarize
from throughputlab.lr.law.sweep import COLUMNS, REQUIRED, load_sweep, parse_column_map, prepare_sweep, synthetic_sweep

__all__ = [
    "SCHEMA_VERSION", "COLUMNS", "REQUIRED", "Coef", "Curvature", "Holdout", "LawAnalysis", "LawFit", "LRFitReport",
    "Optimum", "analyse", "check_curvature", "find_optima", "fit_law", "fit_sweep", "holdout", "load_sweep",
    "parse_column_map", "prepare_sweep", "summarize", "synthetic_sweep",
]


def analyse(df, quantity: Literal["lr", "effective_lr"] = "lr", window: int = 2,
            alpha_level: float = 0.05) -> LawAnalysis:
    optima = find_optima(df, quantity, window)
    hs = [h for h in (holdout(optima, "N"), holdout(optima, "D")) if h is not None]
    pref = None
    if len(hs) == 2:
        pref = min(hs, key=lambda h: h.mean_abs_log_error).axis
    return LawAnalysis(quantity=quantity, optima=optima, law=fit_law(optima),
                       curvature=check_curvature(optima, alpha_level), holdouts=hs, preferred_extrapolation=pref)


def fit_sweep(df, window: int = 2, alpha_level: float = 0.05, source: str = "sweep") -> LRFitReport:
    """The whole `lr fit`: optima, law, curvature and held-out extrapolation, on lr and on effective lr."""
    if window < 1:
        raise UserError(f"--window must be at least 1, got {window}")
    if not (0 < alpha_level < 1):
        raise UserError(f"--alpha must be in (0, 1), got {alpha_level}")
    raw = analyse(df, "lr", window, alpha_level)
    eff = analyse(df, "effective_lr", window, alpha_level) if "effective_lr" in df.columns else None
    rep = LRFitReport(source=source, n_runs=len(df), columns=dict(df.attrs.get("columns", {})), window=window,
                      alpha_level=alpha_level, lr=raw, effective=eff, summary=[])
    rep.summary = summarize(rep)
    return rep
