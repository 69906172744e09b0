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

Unknown values are None, never inf.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from throughputlab.errors import UserError

SCHEMA_VERSION = 1

# canonical name -> meaning; the CSV's own names map onto these (`--columns`)
COLUMNS = {
    "params": "model parameters N",
    "tokens": "training tokens D",
    "lr": "learning rate",
    "loss": "final loss (NaN or inf: the run diverged)",
    "weight_norm": "optional: weight norm ||W||",
    "update_norm": "optional: per-step update norm ||dW||",
    "effective_lr": "optional: ||dW|| / ||W|| directly (instead of the two norms)",
}
REQUIRED = ("params", "tokens", "lr", "loss")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Optimum(_Model):
    """Optimal (effective) learning rate of one (N, D) group."""

    params: float
    tokens: float
    n_runs: int
    n_diverged: int
    n_used: int  # points in the quadratic fit
    lr_opt: Optional[float]  # None when the optimum could not be located
    lr_lo: Optional[float]  # 95% interval
    lr_hi: Optional[float]
    log_lr_se: Optional[float]
    loss_at_opt: Optional[float]
    note: str = ""


class Coef(_Model):
    name: str
    value: float
    se: Optional[float]
    lo: Optional[float]  # 95% interval
    hi: Optional[float]
    p_value: Optional[float]  # for the hypothesis value == 0


class LawFit(_Model):
    """log lr* = c0 + alpha log N + beta log D (alpha or beta None when N or D takes one value)."""

    coefs: list[Coef]
    n_groups: int
    dof: int
    residual_sd: Optional[float]  # in log lr
    r2: Optional[float]

    def coef(self, name: str) -> Optional[Coef]:
        return next((c for c in self.coefs if c.name == name), None)


class Holdout(_Model):
    """The largest value of one axis held out and predicted by the law fitted on the rest."""

    axis: Literal["N", "D"]
    held_out: float
    n_train_groups: int
    n_test_groups: int
    mean_abs_log_error: float  # natural-log units of lr
    error_factor: float  # exp(mean_abs_log_error): how many times off lr* is
    max_abs_z: Optional[float]  # error in prediction standard errors (law + group interval)
    mean_signed_log_error: float  # measured - predicted; > 0: the law undershoots lr*


class Curvature(_Model):
    testable: bool
    coefs: list[Coef]  # gamma_N, gamma_D on centered logs
    f_stat: Optional[float]
    p_value: Optional[float]  # joint test of all quadratic terms
    detected: bool
    direction: Optional[Literal["upward", "downward", "mixed"]]
    note: str = ""


class LawAnalysis(_Model):
    quantity: Literal["lr", "effective_lr"]
    optima: list[Optimum]
    law: Optional[LawFit]
    curvature: Optional[Curvature]
    holdouts: list[Holdout]
    preferred_extrapolation: Optional[Literal["N", "D"]]


class LRFitReport(_Model):
    schema_version: int = SCHEMA_VERSION
    source: str
    n_runs: int
    columns: dict[str, str]  # canonical -> CSV column
    window: int
    alpha_level: float
    lr: LawAnalysis
    effective: Optional[LawAnalysis]
    summary: list[str]


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------

def parse_column_map(spec: Optional[str]) -> dict[str, str]:
    """'params=N,tokens=D' -> {'params': 'N', 'tokens': 'D'} (canonical=csv name)."""
    out: dict[str, str] = {}
    if not spec:
        return out
    for part in spec.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise UserError(f"--columns entries must be canonical=csv_name, got {part.strip()!r}")
        k, v = (s.strip() for s in part.split("=", 1))
        if k not in COLUMNS:
            raise UserError(f"--columns: unknown name {k!r}; use one of {', '.join(COLUMNS)}")
        out[k] = v
    return out


def load_sweep(path: str, column_map: Optional[dict[str, str]] = None):
    """Read a sweep CSV into a frame with canonical column names; UserError on anything unusable."""
    import pandas as pd

    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise UserError(f"sweep file {path!r} not found") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path!r} as CSV: {str(e).splitlines()[0]}") from None
    return prepare_sweep(df, column_map, source=path)


def prepare_sweep(df, column_map: Optional[dict[str, str]] = None, source: str = "sweep"):
    import pandas as pd

    column_map = dict(column_map or {})
    names = {k: column_map.get(k, k) for k in COLUMNS}
    missing = [f"{k}" + (f" (as {names[k]!r})" if names[k] != k else "") for k in REQUIRED
               if names[k] not in df.columns]
    if missing:
        raise UserError(
            f"{source}: missing column(s) {', '.join(missing)}; found {', '.join(map(str, df.columns)) or 'none'}; "
            "rename them or map them with --columns params=N,tokens=D,lr=...,loss=..."
        )
    out = pd.DataFrame({k: df[names[k]] for k in COLUMNS if names[k] in df.columns})
    for k in out.columns:
        out[k] = pd.to_numeric(out[k], errors="coerce")
    for k in ("params", "tokens", "lr"):
        bad = ~(out[k] > 0) | ~np.isfinite(out[k])
        if bad.any():
            row = int(np.nonzero(bad.to_numpy())[0][0])
            raise UserError(f"{source}: column {names[k]!r} must be positive numbers; row {row + 2} has "
                            f"{df[names[k]].iloc[row]!r}")
    if len(out) == 0:
        raise UserError(f"{source}: no rows")
    if "weight_norm" in out and "update_norm" in out and "effective_lr" not in out:
        out["effective_lr"] = out["update_norm"] / out["weight_norm"]
    elif ("weight_norm" in out) != ("update_norm" in out) and "effective_lr" not in out:
        have = "weight_norm" if "weight_norm" in out else "update_norm"
        raise UserError(f"{source}: column {have!r} needs its partner "
                        f"({'update_norm' if have == 'weight_norm' else 'weight_norm'}) for the effective lr")
    out.attrs["columns"] = {k: names[k] for k in out.columns if k in names and names[k] in df.columns}
    return out


# ---------------------------------------------------------------------------------------
# Step 1: optimum per group
# ---------------------------------------------------------------------------------------

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


# ---------------------------------------------------------------------------------------
# Steps 2 and 3: the law, curvature, held-out extrapolation
# ---------------------------------------------------------------------------------------

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


def fit_law(optima: Sequence[Optimum]) -> Optional[LawFit]:
    pts = [o for o in optima if o.lr_opt is not None]
    if len(pts) < 2:
        return None
    logn = np.log([o.params for o in pts])
    logd = np.log([o.tokens for o in pts])
    y = np.log([o.lr_opt for o in pts])
    X, names, _ = _design(logn, logd, quadratic=False)
    fit = _ols(X, y, names)
    tss = float(np.sum((y - y.mean()) ** 2))
    return LawFit(coefs=_coefs(fit), n_groups=len(pts), dof=fit.dof,
                  residual_sd=math.sqrt(fit.s2) if fit.s2 is not None else None,
                  r2=(1 - fit.rss / tss) if tss > 0 else None)


def check_curvature(optima: Sequence[Optimum], alpha_level: float = 0.05) -> Curvature:
    from scipy import stats

    pts = [o for o in optima if o.lr_opt is not None]
    logn = np.log([o.params for o in pts]) if pts else np.array([])
    logd = np.log([o.tokens for o in pts]) if pts else np.array([])
    y = np.log([o.lr_opt for o in pts]) if pts else np.array([])
    if not pts:
        return Curvature(testable=False, coefs=[], f_stat=None, p_value=None, detected=False, direction=None,
                         note="no located optima")
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
    pts = [o for o in optima if o.lr_opt is not None]
    key = (lambda o: o.params) if axis == "N" else (lambda o: o.tokens)
    if not pts:
        return None
    top = max(key(o) for o in pts)
    train = [o for o in pts if key(o) < top]
    test = [o for o in pts if key(o) == top]
    logn = np.log([o.params for o in train])
    logd = np.log([o.tokens for o in train])
    if len(train) < 2:
        return None
    X, names, centers = _design(logn, logd, quadratic=False)
    needed = "alpha" if axis == "N" else "beta"
    if needed not in names:
        return None  # one value left on that axis: no slope to extrapolate with
    fit = _ols(X, np.log([o.lr_opt for o in train]), names)
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


# ---------------------------------------------------------------------------------------
# Words
# ---------------------------------------------------------------------------------------

def _fmt_coef(c: Optional[Coef]) -> str:
    if c is None:
        return "n/a (one value on that axis)"
    if c.lo is None:
        return f"{c.value:+.3f} (no interval: too few groups)"
    return f"{c.value:+.3f} [{c.lo:+.3f}, {c.hi:+.3f}]"


def _analysis_lines(a: LawAnalysis, label: str) -> list[str]:
    lines = []
    located = [o for o in a.optima if o.lr_opt is not None]
    lines.append(f"{label}: optimum located in {len(located)} of {len(a.optima)} (N, D) groups")
    for o in a.optima:
        if o.lr_opt is None:
            lines.append(f"  N={o.params:.3g} D={o.tokens:.3g}: no optimum ({o.note})")
        elif o.note:
            lines.append(f"  N={o.params:.3g} D={o.tokens:.3g}: {o.note}")
    if a.law is None:
        lines.append(f"  law: not fitted (needs 2+ located optima)")
        return lines
    lines.append(f"  log {label}* = c0 + alpha log N + beta log D over {a.law.n_groups} groups: "
                 f"alpha {_fmt_coef(a.law.coef('alpha'))}, beta {_fmt_coef(a.law.coef('beta'))}"
                 + (f", residual sd {a.law.residual_sd:.3f} (log units)" if a.law.residual_sd is not None else ""))
    c = a.curvature
    if c is not None and c.testable:
        terms = ", ".join(f"{k.name} {k.value:+.3f} (p={k.p_value:.2g})" if k.p_value is not None
                          else f"{k.name} {k.value:+.3f}" for k in c.coefs)
        verdict = f"{c.direction} curvature detected" if c.detected else "no significant curvature"
        lines.append(f"  curvature: {verdict} (joint p={c.p_value:.2g}; {terms})")
    elif c is not None:
        lines.append(f"  curvature: not testable ({c.note})")
    for h in a.holdouts:
        z = f", {h.max_abs_z:.1f} standard errors" if h.max_abs_z is not None else ""
        lines.append(f"  extrapolating in {h.axis} to {h.held_out:.3g} (fit on {h.n_train_groups} groups): "
                     f"lr* off by x{h.error_factor:.3f}{z}")
    if a.preferred_extrapolation:
        lines.append(f"  extrapolation in {a.preferred_extrapolation} was more accurate here")
    return lines


def summarize(rep: LRFitReport) -> list[str]:
    lines = _analysis_lines(rep.lr, "lr")
    if rep.effective is not None:
        lines += _analysis_lines(rep.effective, "effective_lr")
        c_raw, c_eff = rep.lr.curvature, rep.effective.curvature
        if c_raw and c_eff and c_raw.testable and c_eff.testable:
            if c_raw.detected and not c_eff.detected:
                lines.append("the curvature in lr* goes away in the effective learning rate: "
                             "extrapolate the effective lr, then convert back with the norms")
            elif c_raw.detected and c_eff.detected:
                lines.append("the curvature stays in the effective learning rate too")
            elif not c_raw.detected and c_eff.detected:
                lines.append("the effective learning rate is curved while lr* is not")
    else:
        lines.append("no weight/update norms in the sweep: effective-lr analysis skipped")
    return lines


# ---------------------------------------------------------------------------------------
# Synthetic sweeps with a known law (tests, examples)
# ---------------------------------------------------------------------------------------

def synthetic_sweep(params: Sequence[float], tokens: Sequence[float], c0: float = -2.0, alpha: float = -0.3,
                    beta: float = -0.1, gamma_n: float = 0.0, gamma_d: float = 0.0, lr_points: int = 9,
                    lr_span_decades: float = 2.0, sharpness: float = 0.05, noise: float = 0.0005,
                    seed: int = 0, norms: bool = True):
    """Runs from a known law, loss = E(N, D) + sharpness * (log lr - log lr*)^2 + noise.

    log lr* = c0 + alpha log N + beta log D + gamma_n (log N - mean)^2 + gamma_d (log D - mean)^2.
    With `norms`, the curvature is put in the norms: the effective lr ||dW||/||W|| is lr times
    exp(-curvature terms), so the effective optimum follows the plain power law exactly.
    The lr grid is centred on each group's optimum with a random offset.
    """
    import pandas as pd

    rng = np.random.default_rng(seed)
    logn_c = float(np.mean(np.log(params)))
    logd_c = float(np.mean(np.log(tokens)))
    rows = []
    for n in params:
        for d in tokens:
            ln, ld = math.log(n), math.log(d)
            curv = gamma_n * (ln - logn_c) ** 2 + gamma_d * (ld - logd_c) ** 2
            log_opt = c0 + alpha * ln + beta * ld + curv
            centre = log_opt + rng.uniform(-0.3, 0.3)
            half = lr_span_decades * math.log(10) / 2
            base_loss = 2.0 + 400 * n**-0.34 + 400 * d**-0.28
            wnorm = math.sqrt(n) * 0.02
            for x in np.linspace(centre - half, centre + half, lr_points):
                loss = base_loss + sharpness * (x - log_opt) ** 2 + rng.normal(0, noise)
                row = dict(params=n, tokens=d, lr=math.exp(x), loss=loss)
                if norms:
                    eff = math.exp(x - curv)
                    row.update(weight_norm=wnorm, update_norm=eff * wnorm)
                rows.append(row)
    return pd.DataFrame(rows)
