"""Deep scalar linear networks: exact gradient flow from a balanced start, and an ODE reference.

Closed forms for depth 1 and 2; for any depth the implicit time integral of the
`throughputlab.lr.scalar` docstring, solved by quadrature and Newton's method;
`integrate_flow_ode` integrates all L weights numerically as an independent check.
"""

from __future__ import annotations

import math

import numpy as np

from throughputlab.errors import UserError
from throughputlab.lr.scalar.data import ScalarData, check_depth, check_positive_product
from throughputlab.lr.scalar.gd import others_and_product


def gradient_flow_closed_form(depth: int, data: ScalarData, p0: float, t) -> np.ndarray:
    """p(t) in closed form for depth 1 (exponential) and 2 (logistic)."""
    t = np.asarray(t, dtype=float)
    a, b, ps = data.exx, data.exy, data.p_star
    if depth == 1:
        return ps + (p0 - ps) * np.exp(-a * t)
    if depth == 2:
        check_positive_product(2, data, p0)
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
    depth = check_depth(depth)
    t = np.asarray(t, dtype=float)
    if np.any(t < 0):
        raise UserError("gradient-flow times must be >= 0")
    if method == "auto" and depth <= 2:
        return gradient_flow_closed_form(depth, data, p0, t)
    check_positive_product(max(depth, 2), data, p0)
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

    depth = check_depth(depth)
    w_init = np.broadcast_to(np.asarray(w0, dtype=float), (depth,)).copy()
    t = np.asarray(t, dtype=float)

    def rhs(_, w):
        others, p = others_and_product(w)
        return -(data.exx * p - data.exy) * others

    sol = solve_ivp(rhs, (0.0, float(t.max())), w_init, method="DOP853", t_eval=t, rtol=rtol, atol=1e-14)
    return np.prod(sol.y, axis=0)
