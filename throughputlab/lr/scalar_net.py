"""Deep scalar linear networks: gradient descent, exact gradient flow, and per-depth learning rates.

The model is f(x) = w_L ... w_1 x with the product p = prod_l w_l, trained on the squared
loss; only the data's second moments matter:

    loss(p) = 0.5 * (E[x^2] p^2 - 2 E[xy] p + E[y^2]),   optimum p* = E[xy] / E[x^2].

dloss/dw_l = (E[x^2] p - E[xy]) * prod_{k != l} w_k. Gradient flow keeps w_l^2 - w_k^2
constant, so a balanced start (every w_l = w0) stays balanced, w = p^(1/L), and

    dp/dt = -L p^(2 - 2/L) (E[x^2] p - E[xy]).

Closed forms: L = 1 is exponential relaxation, L = 2 is the logistic equation. For any L,
with u = p^(1/L), t(u) = int_{u0}^{u} ds / (s^(L-1) (E[xy] - E[x^2] s^L)), which we
evaluate by quadrature (its logarithmic singularity at u* taken out analytically) and
invert by Newton's method in s = log((u* - u0) / (u* - u)).

Near p* the loss along the balanced direction has curvature E[x^2] L p*^(2-2/L) (the other
directions are flat), so gradient descent with step lr contracts the error by
|1 - lr E[x^2] L p*^(2-2/L)| per step: the rate depends on the depth *and* on the data,
and the learning rate that gives the same rate r at every depth is
lr_L = r / (E[x^2] L p*^(2-2/L)). A data-agnostic lr proportional to 1/L only works when
p* = 1.

Residual variant: f(x) = prod_l (1 + beta w_l) x (beta is the branch multiplier, 1 by
default; the usual init is w_l = 0, i.e. the identity). In s_l = 1 + beta w_l it is the
plain network with gradients scaled by beta, so gradient flow in w is the plain flow in s
with time multiplied by beta^2, and the rate-equalising lr is lr_L / beta^2.

Positive products only: for depth >= 2 we need w0 > 0 (or 1 + beta w0 > 0) and
E[xy] / E[x^2] > 0, which is the case the rules are about.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from throughputlab.errors import UserError


@dataclass(frozen=True)
class ScalarData:
    """Second moments of the data: all the squared loss of a scalar linear network depends on."""

    exx: float  # E[x^2]
    exy: float  # E[xy]
    eyy: Optional[float] = None  # E[y^2]; only needed for loss values

    def __post_init__(self):
        if not (math.isfinite(self.exx) and self.exx > 0):
            raise UserError(f"E[x^2] must be a positive number, got {self.exx!r}")
        if not (math.isfinite(self.exy) and self.exy != 0):
            raise UserError(f"E[xy] must be a non-zero number, got {self.exy!r}")

    @property
    def p_star(self) -> float:
        """Optimal product E[xy] / E[x^2]."""
        return self.exy / self.exx

    @classmethod
    def from_samples(cls, x, y) -> "ScalarData":
        x = np.asarray(x, dtype=float)
        y = np.asarray(y, dtype=float)
        return cls(float(np.mean(x * x)), float(np.mean(x * y)), float(np.mean(y * y)))

    def loss(self, p):
        if self.eyy is None:
            raise UserError("loss values need E[y^2]: build ScalarData with eyy=...")
        p = np.asarray(p, dtype=float)
        return 0.5 * (self.exx * p * p - 2 * self.exy * p + self.eyy)


def _check_depth(depth) -> int:
    if int(depth) != depth or depth < 1:
        raise UserError(f"depth must be a positive integer, got {depth!r}")
    return int(depth)


def _check_positive_product(depth: int, data: ScalarData, w0: float) -> None:
    if depth >= 2 and (w0 <= 0 or data.p_star <= 0):
        raise UserError(
            f"depth {depth} needs a positive start weight and E[xy]/E[x^2] > 0 "
            f"(got w0={w0!r}, E[xy]/E[x^2]={data.p_star:.4g}); flip the sign of y to make it positive"
        )


# ---------------------------------------------------------------------------------------
# Learning-rate rules from the data
# ---------------------------------------------------------------------------------------

def sharpness_at_optimum(depth: int, data: ScalarData, branch_scale: float = 1.0) -> float:
    """Largest Hessian eigenvalue at the balanced optimum: beta^2 E[x^2] L p*^(2-2/L)."""
    depth = _check_depth(depth)
    return branch_scale**2 * data.exx * depth * abs(data.p_star) ** (2.0 - 2.0 / depth)


def max_stable_lr(depth: int, data: ScalarData, branch_scale: float = 1.0) -> float:
    """Edge of stability at the optimum (2 / sharpness): larger steps make GD oscillate away from p*."""
    return 2.0 / sharpness_at_optimum(depth, data, branch_scale)


def rate_equalising_lr(depth: int, data: ScalarData, step_rate: float = 0.1,
                       branch_scale: float = 1.0) -> float:
    """Step size whose per-step error contraction near p* is 1 - step_rate at any depth and data."""
    if not (0 < step_rate < 2):
        raise UserError(f"--step-rate must be in (0, 2) for convergence, got {step_rate!r}")
    return step_rate / sharpness_at_optimum(depth, data, branch_scale)


def predicted_contraction(depth: int, data: ScalarData, lr: float, branch_scale: float = 1.0) -> float:
    """Per-step factor |1 - lr * sharpness| by which GD shrinks |p - p*| near the optimum."""
    return abs(1.0 - lr * sharpness_at_optimum(depth, data, branch_scale))


# ---------------------------------------------------------------------------------------
# Gradient descent
# ---------------------------------------------------------------------------------------

@dataclass
class GDTrajectory:
    """Products p_k = prod_l (weights after k steps), k = 0..steps; `weights` are the last ones."""

    p: np.ndarray
    weights: np.ndarray
    lr: float
    diverged: bool


def simulate_gd(depth: int, data: ScalarData, lr: float, steps: int, w0, residual: bool = False,
                branch_scale: float = 1.0) -> GDTrajectory:
    """Full-batch gradient descent on every weight (no balancedness assumed).

    `w0` is a scalar (every layer the same) or one value per layer. Plain: f = prod w_l x.
    Residual: f = prod (1 + branch_scale * w_l) x.
    """
    depth = _check_depth(depth)
    w = np.broadcast_to(np.asarray(w0, dtype=float), (depth,)).copy()
    beta = float(branch_scale) if residual else 1.0
    p_out = np.empty(steps + 1)
    diverged = False
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(steps + 1):
            s = 1.0 + beta * w if residual else w
            # products of all other factors, without dividing (a factor may be 0)
            prefix = np.concatenate(([1.0], np.cumprod(s[:-1])))
            suffix = np.concatenate((np.cumprod(s[::-1][:-1])[::-1], [1.0]))
            others = prefix * suffix
            p = others[-1] * s[-1]
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


# ---------------------------------------------------------------------------------------
# Exact gradient flow (balanced start)
# ---------------------------------------------------------------------------------------

def gradient_flow_closed_form(depth: int, data: ScalarData, p0: float, t) -> np.ndarray:
    """p(t) in closed form for depth 1 (exponential) and 2 (logistic)."""
    t = np.asarray(t, dtype=float)
    a, b, ps = data.exx, data.exy, data.p_star
    if depth == 1:
        return ps + (p0 - ps) * np.exp(-a * t)
    if depth == 2:
        _check_positive_product(2, data, p0)
        return ps / (1.0 + (ps / p0 - 1.0) * np.exp(-2.0 * b * t))
    raise UserError(f"closed form only for depth 1 and 2, got {depth}; use gradient_flow")


class _FlowClock:
    """Time t(s) of the balanced flow u' = u^(L-1) (b - a u^L), with u(s) = u* - (u* - u0) e^(-s).

    dt/ds = 1 / (a u^(L-1) S(u)), S(u) = (u*^L - u^L) / (u* - u) = sum_k u*^(L-1-k) u^k, is
    smooth and tends to 1 / (a L u*^(2L-2)), so the integral has no singularity; S is
    evaluated as u*^(L-1) (1 - rho^L) / (1 - rho) with expm1/log1p, which stays exact as
    rho = u / u* -> 1.
    """

    def __init__(self, depth: int, data: ScalarData, u0: float):
        self.L, self.a = depth, data.exx
        self.u0 = u0
        self.us = data.p_star ** (1.0 / depth)  # positive: checked by the caller
        self.d = self.us - u0

    def u_at(self, s: float) -> float:
        return self.us - self.d * math.exp(-s)

    def rate(self, s: float) -> float:
        """dt/ds at s."""
        L = self.L
        x = self.d * math.exp(-s) / self.us  # 1 - u/u*
        q = float(L) if x == 0 else -math.expm1(L * math.log1p(-x)) / x  # (1 - rho^L) / (1 - rho)
        u = self.us * (1.0 - x)
        return 1.0 / (self.a * (u * self.us) ** (L - 1) * q)

    def time_between(self, s0: float, s1: float) -> float:
        from scipy.integrate import quad

        if s1 == s0:
            return 0.0
        val, _ = quad(self.rate, s0, s1, epsabs=0.0, epsrel=1e-13, limit=200)
        return val


def gradient_flow(depth: int, data: ScalarData, p0: float, t, method: str = "auto") -> np.ndarray:
    """Exact p(t) of gradient flow from a balanced start with product p0, for times t >= 0.

    method "auto": closed forms for depth 1 and 2, the implicit equation otherwise;
    "implicit": always solve t = int_0^s dt/ds (quadrature) for s by Newton's method, times in
    increasing order, then p = u(s)^L.
    """
    depth = _check_depth(depth)
    t = np.asarray(t, dtype=float)
    if np.any(t < 0):
        raise UserError("gradient-flow times must be >= 0")
    if method == "auto" and depth <= 2:
        return gradient_flow_closed_form(depth, data, p0, t)
    _check_positive_product(max(depth, 2), data, p0)
    if p0 == data.p_star:
        return np.full_like(t, p0)
    clock = _FlowClock(depth, data, p0 ** (1.0 / depth))
    out = np.empty_like(t)
    s_prev, t_prev = 0.0, 0.0
    for i in np.argsort(t, kind="stable"):
        target = float(t[i])
        s = s_prev + (target - t_prev) / clock.rate(s_prev)
        for _ in range(100):
            err = t_prev + clock.time_between(s_prev, s) - target
            s_new = max(s - err / clock.rate(s), 0.5 * (s + s_prev))  # Newton, never behind s_prev
            if abs(s_new - s) <= 1e-14 * max(1.0, s):
                s = s_new
                break
            s = s_new
        t_prev, s_prev = t_prev + clock.time_between(s_prev, s), s
        out[i] = clock.u_at(s) ** depth
    return out


def gradient_flow_residual(depth: int, data: ScalarData, w0: float, t, branch_scale: float = 1.0) -> np.ndarray:
    """Exact p(t) for the residual network prod (1 + beta w_l) x from a balanced start w_l = w0."""
    p0 = (1.0 + branch_scale * w0) ** depth
    return gradient_flow(depth, data, p0, np.asarray(t, dtype=float) * branch_scale**2)


def integrate_flow_ode(depth: int, data: ScalarData, w0, t, rtol: float = 1e-12) -> np.ndarray:
    """Reference: integrate the full L-weight gradient-flow ODE numerically (DOP853) at times t."""
    from scipy.integrate import solve_ivp

    depth = _check_depth(depth)
    w_init = np.broadcast_to(np.asarray(w0, dtype=float), (depth,)).copy()
    t = np.asarray(t, dtype=float)

    def rhs(_, w):
        prefix = np.concatenate(([1.0], np.cumprod(w[:-1])))
        suffix = np.concatenate((np.cumprod(w[::-1][:-1])[::-1], [1.0]))
        others = prefix * suffix
        p = others[-1] * w[-1]
        return -(data.exx * p - data.exy) * others

    sol = solve_ivp(rhs, (0.0, float(t.max())), w_init, method="DOP853", t_eval=t, rtol=rtol, atol=1e-14)
    return np.prod(sol.y, axis=0)


# ---------------------------------------------------------------------------------------
# Depth study: data-agnostic 1/L rule against the data-dependent rule
# ---------------------------------------------------------------------------------------

@dataclass
class DepthRow:
    dataset: str
    exx: float
    exy: float
    depth: int
    rule: str  # "1/depth" or "data"
    lr: float
    predicted_rate: Optional[float]  # -log|1 - lr * sharpness| per step
    measured_rate: Optional[float]  # fitted on the simulated GD trajectory; None if it diverged/stalled


@dataclass
class DepthStudy:
    step_rate: float
    p0: float
    rows: list[DepthRow] = field(default_factory=list)

    def spread(self, rule: str, dataset: Optional[str] = None) -> Optional[float]:
        """max/min of measured rates for a rule over depths (one dataset or all); None if any run failed."""
        rates = [r.measured_rate for r in self.rows if r.rule == rule and dataset in (None, r.dataset)]
        if not rates or any(r is None for r in rates):
            return None
        return max(rates) / min(rates)

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([r.__dict__ for r in self.rows])


DEFAULT_DEPTHS = (1, 2, 4, 8, 16, 32, 64, 128)


def depth_study(datasets: dict[str, ScalarData], depths: Sequence[int] = DEFAULT_DEPTHS,
                step_rate: float = 0.1, p0: float = 1.0, max_steps: int = 20000) -> DepthStudy:
    """Simulate GD at every depth with lr = lr_1/L (lr_1 the data rule at depth 1) and with the data rule.

    Every run starts balanced at product p0 (p0 = 1 is the identity start).
    """
    if not (p0 > 0):
        raise UserError(f"--p0 must be positive, got {p0!r}")
    depths = [_check_depth(d) for d in depths]
    study = DepthStudy(step_rate=step_rate, p0=p0)
    for name, data in datasets.items():
        lr1 = rate_equalising_lr(1, data, step_rate)
        runs = []
        for d in depths:
            _check_positive_product(d, data, p0 ** (1.0 / d))
            runs.append((d, "1/depth", lr1 / d))
            runs.append((d, "data", rate_equalising_lr(d, data, step_rate)))
        p = simulate_gd_balanced([r[0] for r in runs], data, [r[2] for r in runs], max_steps,
                                 [p0 ** (1.0 / r[0]) for r in runs])
        for j, (d, rule, lr) in enumerate(runs):
            c = predicted_contraction(d, data, lr)
            study.rows.append(DepthRow(
                dataset=name, exx=data.exx, exy=data.exy, depth=d, rule=rule, lr=lr,
                predicted_rate=(-math.log(c) if 0 < c < 1 else None),
                measured_rate=measured_rate(p[:, j], data.p_star),
            ))
    return study


# ---------------------------------------------------------------------------------------
# Exact solution against simulated gradient descent
# ---------------------------------------------------------------------------------------

@dataclass
class ExactCheckRow:
    depth: int
    lr: float  # the finest GD step used
    steps: int
    gd_max_rel_err: float  # plain GD at step lr against the exact flow, over the whole trajectory
    extrapolated_max_rel_err: float  # GD at lr, lr/2, lr/4 extrapolated to lr -> 0 (Richardson)
    ode_max_rel_err: float  # independent high-accuracy ODE integration of all L weights


def exact_vs_gd(depth: int, data: ScalarData, p0: float, horizon: float, lr: float = 5e-4) -> ExactCheckRow:
    """Compare the exact flow with GD at steps 4*lr, 2*lr, lr sampled on the 4*lr grid up to `horizon`.

    GD at step h follows the flow with an O(h) error (about 1e-3 relative at h = 1e-3 here), so
    reaching 1e-6 with plain GD would take ~1e7 steps; the errors of GD at h, h/2, h/4 are
    combined (Richardson: the first two orders cancel), which measures GD's h -> 0 limit.
    """
    w0 = p0 ** (1.0 / depth)
    h = 4 * lr
    n = int(round(horizon / h))
    t = np.arange(n + 1) * h
    exact = gradient_flow(depth, data, p0, t)
    g1 = simulate_gd(depth, data, h, n, w0).p
    g2 = simulate_gd(depth, data, h / 2, 2 * n, w0).p[::2]
    g4 = simulate_gd(depth, data, h / 4, 4 * n, w0).p[::4]
    r_a, r_b = 2 * g2 - g1, 2 * g4 - g2
    extrap = (4 * r_b - r_a) / 3
    ode = integrate_flow_ode(depth, data, w0, t)

    def rel(x):
        return float(np.max(np.abs(x - exact) / np.abs(exact)))

    return ExactCheckRow(depth=depth, lr=h / 4, steps=4 * n, gd_max_rel_err=rel(g4),
                         extrapolated_max_rel_err=rel(extrap), ode_max_rel_err=rel(ode))
