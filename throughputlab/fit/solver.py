"""The fitting machinery every part shares: bounded least squares in log-parameter space, its
intervals (Jacobian or bootstrap percentiles), leave-one-out and the bootstrap loop.

Parameters are fitted as logarithms (they stay positive, and a factor-of-ten error weighs the
same at every scale) to relative (log-ratio) residuals.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, TypeVar

import numpy as np
from scipy.optimize import least_squares
from scipy.stats import t as student_t

from throughputlab.errors import UserError
from throughputlab.records.fit import CI_LEVEL, ParamEstimate

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class LSQ:
    x: np.ndarray  # log parameters
    cost: float
    residuals: np.ndarray
    jac: np.ndarray
    at_bound: np.ndarray

    def values(self) -> tuple[float, ...]:
        return tuple(float(v) for v in np.exp(self.x))


def solve(resid: Callable[[np.ndarray], np.ndarray], starts: Sequence[np.ndarray], lo: np.ndarray,
          hi: np.ndarray) -> LSQ:
    """Best of several least_squares runs (the hard max has a kink where local searches can stall)."""
    best = None
    for x0 in starts:
        x0 = np.clip(np.asarray(x0, float), lo + 1e-9, hi - 1e-9)
        try:
            r = least_squares(resid, x0, bounds=(lo, hi), method="trf", x_scale=1.0, diff_step=1e-6,
                              ftol=1e-12, xtol=1e-12, gtol=1e-12, max_nfev=2000)
        except (ValueError, FloatingPointError) as e:
            log.debug("least_squares start %s failed: %s", x0, e)
            continue
        if best is None or r.cost < best.cost - 1e-15:
            best = r
    if best is None:
        raise UserError("the fit did not converge from any starting point: check the profile's points "
                        "(times must be positive and grow with load)")
    span = hi - lo
    at_bound = (np.abs(best.x - lo) < 1e-4 * span) | (np.abs(best.x - hi) < 1e-4 * span)
    return LSQ(best.x, float(best.cost), best.fun, best.jac, at_bound)


def rms(sol: LSQ) -> float:
    return float(math.sqrt(np.mean(sol.residuals ** 2)))


def leave_one_out(items: Sequence[T], min_rest: int, refit_predict: Callable[[list[T], T], Optional[float]]
                  ) -> list[Optional[float]]:
    """For every item, ``refit_predict(the others, the item)`` (its held-out relative error);
    all None when fewer than ``min_rest`` items would remain."""
    if len(items) - 1 < min_rest:
        return [None] * len(items)
    items = list(items)
    return [refit_predict(items[:i] + items[i + 1:], it) for i, it in enumerate(items)]


def can_bootstrap(what: str, sample_counts: list[int], warnings: list[str]) -> bool:
    """A bootstrap over each point's samples needs two or more at every point: a point of one
    sample is drawn identically every time, and the percentiles would narrow to nothing."""
    if min(sample_counts, default=0) >= 2:
        return True
    warnings.append(f"{what}: a point has a single sample, so resampling cannot show its spread; intervals from "
                    "the Jacobian instead of the bootstrap (measure with --repeats 2 or more --rounds)")
    return False


def bootstrap(n: int, draw: Callable[[], T], refit: Callable[[T], R]) -> list[R]:
    """``n`` refits on resampled data; a resample the fit cannot handle is dropped."""
    out: list[R] = []
    for _ in range(n):
        try:
            out.append(refit(draw()))
        except UserError:
            continue
    return out


def _svd(sol: LSQ):
    """(singular values, right vectors, which are kept, residual variance s^2, Student t quantile)
    of the Jacobian in log space, or None when nothing is left to estimate the spread from."""
    n, k = sol.jac.shape
    dof = n - k
    if dof <= 0 or not np.all(np.isfinite(sol.jac)):
        return None
    _, sv, vt = np.linalg.svd(sol.jac, full_matrices=False)
    keep = sv > 1e-8 * max(sv.max(), 1e-300)
    s2 = float(np.sum(sol.residuals ** 2)) / dof
    return sv, vt, keep, s2, float(student_t.ppf(0.5 + CI_LEVEL / 2, dof))


def jacobian_ci(sol: LSQ) -> list[tuple[Optional[float], Optional[float], bool]]:
    """95% intervals of exp(x) from the Jacobian: cov = s^2 (J'J)^-1 in log space, Student t quantile.

    Directions the data do not constrain (near-zero singular values of J) make every parameter
    that loads on them "not identified", instead of the zero variance a pseudo-inverse would give."""
    k = sol.jac.shape[1]
    svd = _svd(sol)
    if svd is None:
        return [(None, None, False) for _ in range(k)]
    sv, vt, keep, s2, q = svd
    loose = np.zeros(k, bool)
    for j in np.flatnonzero(~keep):
        loose |= np.abs(vt[j]) > 0.05
    cov = (vt[keep].T / sv[keep] ** 2) @ vt[keep] * s2
    out: list[tuple[Optional[float], Optional[float], bool]] = []
    for i in range(k):
        var = cov[i, i]
        half = q * math.sqrt(var) if var >= 0 else math.inf
        if loose[i] or sol.at_bound[i] or not math.isfinite(half) or half > 20:  # e^20: not a bound worth printing
            out.append((None, None, False))
            continue
        out.append((math.exp(sol.x[i] - half), math.exp(sol.x[i] + half), True))
    return out


def log_combination_half_width(sol: LSQ, grad: np.ndarray) -> Optional[float]:
    """Half-width of the 95% interval of log g for a function g of the parameters whose gradient
    d(log g)/dx at the solution is ``grad`` (delta method, as :func:`jacobian_ci`); None when g
    loads on a direction the data do not constrain. Summed over singular directions rather than
    through the covariance, so a combination that is fixed while its parts are not comes out
    with its own (small) spread instead of a difference of huge variances."""
    svd = _svd(sol)
    if svd is None:
        return None
    sv, vt, keep, s2, q = svd
    proj = vt @ np.asarray(grad, float)
    if np.any(np.abs(proj[~keep]) > 0.05 * max(float(np.linalg.norm(grad)), 1e-300)):
        return None
    half = q * math.sqrt(s2 * float(np.sum((proj[keep] / sv[keep]) ** 2)))
    return half if math.isfinite(half) and half <= 20 else None


def percentile_ci(draws: np.ndarray) -> list[tuple[float, float]]:
    lo = np.percentile(draws, 100 * (1 - CI_LEVEL) / 2, axis=0)
    hi = np.percentile(draws, 100 * (1 + CI_LEVEL) / 2, axis=0)
    return [(float(a), float(b)) for a, b in zip(lo, hi)]


def estimates(names, units, sol: LSQ, boot: Optional[np.ndarray], notes: dict[str, str]) -> list[ParamEstimate]:
    """The fitted parameters with intervals: bootstrap percentiles when there are enough draws
    and the Jacobian says the parameter is identified, else the Jacobian's."""
    ci = jacobian_ci(sol)
    bci = percentile_ci(boot) if boot is not None and len(boot) >= 10 else None
    out = []
    for i, (name, unit) in enumerate(zip(names, units)):
        lo, hi, ident = ci[i]
        if bci is not None and ident:
            lo, hi = bci[i]
        note = notes.get(name)
        if sol.at_bound[i]:
            note = (note + "; " if note else "") + "at the bound of its search range"
        out.append(ParamEstimate(name=name, value=float(math.exp(sol.x[i])), unit=unit, lo=lo, hi=hi,
                                 identified=ident, note=note))
    return out
