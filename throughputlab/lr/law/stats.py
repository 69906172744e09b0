"""Statistics of `lr fit`: the optimum per (N, D) group, the power law, its curvature, held-out error.

Small least-squares fits on numpy arrays (scipy for t and F quantiles); the steps are those of
the `throughputlab.lr.law` docstring. Optima that cannot be located carry a note and stay out
of the law.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional, Sequence

import numpy as np

from throughputlab.lr.law.models import Coef, Curvature, Holdout, LawFit, Optimum


def _t_quantile(dof: int) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.975, dof)) if dof > 0 else float("nan")


def _quad_fit(x: np.ndarray, y: np.ndarray):
    """Least-squares y = q0 + q1 x + q2 x^2 (x centered); returns (coef, cov/sigma^2, rss, center)."""
    c = float(np.mean(x))
    X = np.column_stack([np.ones_like(x), x - c, (x - c) ** 2])
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    rss = float(np.sum((y - X @ coef) ** 2))
    xtx_inv = np.linalg.pinv(X.T @ X)
    return coef, xtx_inv, rss, c


def find_optima(df, x_col: str = "lr", window: int = 2) -> list[Optimum]:
    """Optimal x_col per (params, tokens) group by a quadratic in log(x_col) around the lowest loss."""
    groups = []
    for (n, d), g in df.groupby(["params", "tokens"], sort=True):
        g = g.sort_values(x_col)
        ok = np.isfinite(g["loss"].to_numpy()) & np.isfinite(g[x_col].to_numpy()) & (g[x_col].to_numpy() > 0)
        x = np.log(g[x_col].to_numpy()[ok])
        y = g["loss"].to_numpy()[ok]
        groups.append((float(n), float(d), len(g), int((~ok).sum()), x, y))

    fits = []
    for n, d, n_runs, n_div, x, y in groups:
        base = dict(params=n, tokens=d, n_runs=n_runs, n_diverged=n_div)
        if len(x) < 3:
            fits.append((base, None, f"only {len(x)} finished runs; need 3 or more"))
            continue
        i = int(np.argmin(y))
        if i == 0 or i == len(x) - 1:
            side = "smallest" if i == 0 else "largest"
            fits.append((base, None, f"lowest loss at the {side} lr of the grid: extend the sweep past it"))
            continue
        lo, hi = max(0, i - window), min(len(x), i + window + 1)
        xs, ys = x[lo:hi], y[lo:hi]
        coef, xtx_inv, rss, c = _quad_fit(xs, ys)
        if coef[2] <= 0:
            fits.append((base, None, "no minimum in the quadratic fit (loss not convex around the lowest point)"))
            continue
        fits.append((base, (xs, ys, coef, xtx_inv, rss, c), ""))

    # residual variance: the group's own when it has spare points, else pooled over groups
    pooled_rss = sum(f[1][4] for f in fits if f[1] is not None and len(f[1][0]) > 3)
    pooled_dof = sum(len(f[1][0]) - 3 for f in fits if f[1] is not None and len(f[1][0]) > 3)
    out = []
    for base, fit, note in fits:
        if fit is None:
            out.append(Optimum(**base, n_used=0, lr_opt=None, lr_lo=None, lr_hi=None, log_lr_se=None,
                               loss_at_opt=None, note=note))
            continue
        xs, ys, coef, xtx_inv, rss, c = fit
        q0, q1, q2 = coef
        xstar_c = -q1 / (2 * q2)
        xstar = c + xstar_c
        own_dof = len(xs) - 3
        if own_dof > 0:
            s2, dof = rss / own_dof, own_dof
        elif pooled_dof > 0:
            s2, dof = pooled_rss / pooled_dof, pooled_dof
        else:
            s2, dof = None, 0
        grad = np.array([0.0, -1 / (2 * q2), q1 / (2 * q2**2)])
        se = math.sqrt(max(float(grad @ xtx_inv @ grad) * s2, 0.0)) if s2 is not None else None
        t = _t_quantile(dof) if se is not None else None
        if not (xs.min() <= xstar <= xs.max()):
            note = "fitted optimum outside the points used: take more lr values around it"
        out.append(Optimum(
            **base, n_used=len(xs), lr_opt=math.exp(xstar),
            lr_lo=math.exp(xstar - t * se) if se is not None else None,
            lr_hi=math.exp(xstar + t * se) if se is not None else None,
            log_lr_se=se, loss_at_opt=float(q0 + q1 * xstar_c + q2 * xstar_c**2), note=note,
        ))
    return out


@dataclass
class _OLS:
    names: list[str]
    coef: np.ndarray
    cov: Optional[np.ndarray]
    dof: int
    rss: float
    s2: Optional[float]


def _design(logn, logd, quadratic: bool, centers=None):
    """Columns for the law; a term is dropped when its axis has too few distinct values."""
    cn, cd = centers if centers is not None else (float(np.mean(logn)), float(np.mean(logd)))
    cols, names = [np.ones_like(logn)], ["c0"]
    if len(np.unique(logn)) >= 2:
        cols.append(logn)
        names.append("alpha")
    if len(np.unique(logd)) >= 2:
        cols.append(logd)
        names.append("beta")
    if quadratic:
        if len(np.unique(logn)) >= 3:
            cols.append((logn - cn) ** 2)
            names.append("gamma_N")
        if len(np.unique(logd)) >= 3:
            cols.append((logd - cd) ** 2)
            names.append("gamma_D")
    return np.column_stack(cols), names, (cn, cd)


def _row(names, logn, logd, centers):
    cn, cd = centers
    vals = {"c0": 1.0, "alpha": logn, "beta": logd, "gamma_N": (logn - cn) ** 2, "gamma_D": (logd - cd) ** 2}
    return np.array([vals[n] for n in names])


def _ols(X, y, names) -> _OLS:
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    rss = float(np.sum((y - X @ coef) ** 2))
    dof = len(y) - X.shape[1]
    s2 = rss / dof if dof > 0 else None
    cov = np.linalg.pinv(X.T @ X) * s2 if s2 is not None else None
    return _OLS(names, coef, cov, dof, rss, s2)


def _coefs(fit: _OLS, only: Optional[Sequence[str]] = None) -> list[Coef]:
    from scipy import stats

    out = []
    for i, name in enumerate(fit.names):
        if only is not None and name not in only:
            continue
        v = float(fit.coef[i])
        if fit.cov is not None:
            se = math.sqrt(max(float(fit.cov[i, i]), 0.0))
            t = _t_quantile(fit.dof)
            p = float(2 * stats.t.sf(abs(v) / se, fit.dof)) if se > 0 else 0.0
            out.append(Coef(name=name, value=v, se=se, lo=v - t * se, hi=v + t * se, p_value=p))
        else:
            out.append(Coef(name=name, value=v, se=None, lo=None, hi=None, p_value=None))
    return out


def _located(optima: Sequence[Optimum]) -> list[Optimum]:
    return [o for o in optima if o.lr_opt is not None]


def _logs(pts: Sequence[Optimum]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log N, log D and log lr* of located optima."""
    return (np.log([o.params for o in pts]), np.log([o.tokens for o in pts]), np.log([o.lr_opt for o in pts]))


def fit_law(optima: Sequence[Optimum]) -> Optional[LawFit]:
    pts = _located(optima)
    if len(pts) < 2:
        return None
    logn, logd, y = _logs(pts)
    X, names, _ = _design(logn, logd, quadratic=False)
    fit = _ols(X, y, names)
    tss = float(np.sum((y - y.mean()) ** 2))
    return LawFit(coefs=_coefs(fit), n_groups=len(pts), dof=fit.dof,
                  residual_sd=math.sqrt(fit.s2) if fit.s2 is not None else None,
                  r2=(1 - fit.rss / tss) if tss > 0 else None)


def check_curvature(optima: Sequence[Optimum], alpha_level: float = 0.05) -> Curvature:
    from scipy import stats

    pts = _located(optima)
    if not pts:
        return Curvature(testable=False, coefs=[], f_stat=None, p_value=None, detected=False, direction=None,
                         note="no located optima")
    logn, logd, y = _logs(pts)
    Xq, names_q, _ = _design(logn, logd, quadratic=True)
    Xl, names_l, _ = _design(logn, logd, quadratic=False)
    extra = [n for n in names_q if n.startswith("gamma")]
    if not extra or len(y) - Xq.shape[1] < 1:
        return Curvature(testable=False, coefs=[], f_stat=None, p_value=None, detected=False, direction=None,
                         note="needs 3+ distinct N or D and more groups than terms")
    fq, fl = _ols(Xq, y, names_q), _ols(Xl, y, names_l)
    q = len(extra)
    if fq.rss <= 0:
        f_stat, p = float("inf"), 0.0
    else:
        f_stat = ((fl.rss - fq.rss) / q) / (fq.rss / fq.dof)
        p = float(stats.f.sf(f_stat, q, fq.dof))
    coefs = _coefs(fq, only=extra)
    detected = p < alpha_level
    direction = None
    if detected:
        signs = {("upward" if c.value > 0 else "downward") for c in coefs
                 if c.p_value is not None and c.p_value < alpha_level} or \
                {("upward" if c.value > 0 else "downward") for c in coefs}
        direction = signs.pop() if len(signs) == 1 else "mixed"
    return Curvature(testable=True, coefs=coefs, f_stat=f_stat if math.isfinite(f_stat) else None,
                     p_value=p, detected=detected, direction=direction)


def holdout(optima: Sequence[Optimum], axis: Literal["N", "D"]) -> Optional[Holdout]:
    """Fit on all but the largest N (or D), predict the held-out groups."""
    pts = _located(optima)
    key = (lambda o: o.params) if axis == "N" else (lambda o: o.tokens)
    if not pts:
        return None
    top = max(key(o) for o in pts)
    train = [o for o in pts if key(o) < top]
    test = [o for o in pts if key(o) == top]
    if len(train) < 2:
        return None
    logn, logd, y = _logs(train)
    X, names, centers = _design(logn, logd, quadratic=False)
    needed = "alpha" if axis == "N" else "beta"
    if needed not in names:
        return None  # one value left on that axis: no slope to extrapolate with
    fit = _ols(X, y, names)
    errs, zs = [], []
    for o in test:
        r = _row(names, math.log(o.params), math.log(o.tokens), centers)
        pred = float(r @ fit.coef)
        e = math.log(o.lr_opt) - pred
        errs.append(e)
        var = 0.0
        if fit.cov is not None:
            var += float(r @ fit.cov @ r) + fit.s2
        if o.log_lr_se is not None:
            var += o.log_lr_se**2
        zs.append(abs(e) / math.sqrt(var) if var > 0 and fit.cov is not None else None)
    mae = float(np.mean(np.abs(errs)))
    z_known = [z for z in zs if z is not None]
    return Holdout(axis=axis, held_out=top, n_train_groups=len(train), n_test_groups=len(test),
                   mean_abs_log_error=mae, error_factor=math.exp(mae),
                   max_abs_z=max(z_known) if z_known else None, mean_signed_log_error=float(np.mean(errs)))
