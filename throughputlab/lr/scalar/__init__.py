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

This package is the entry point; the code lives in its modules, and every public name is
importable from here: `data` (ScalarData and the learning-rate rules), `gd` (gradient
descent), `flow` (exact gradient flow) and `study` (the depth study and the exact-against-GD
check).
"""

from __future__ import annotations

from throughputlab.lr.scalar.data import (
                                          ScalarData,
                                          max_stable_lr,
                                          predicted_contraction,
                                          rate_equalising_lr,
                                          sharpness_at_optimum,
)
from throughputlab.lr.scalar.flow import (
                                          gradient_flow,
                                          gradient_flow_closed_form,
                                          gradient_flow_residual,
                                          integrate_flow_ode,
)
from throughputlab.lr.scalar.gd import GDTrajectory, measured_rate, simulate_gd, simulate_gd_balanced
from throughputlab.lr.scalar.study import DEFAULT_DEPTHS, DepthRow, DepthStudy, ExactCheckRow, depth_study, exact_vs_gd

__all__ = [
    "ScalarData", "sharpness_at_optimum", "max_stable_lr", "rate_equalising_lr", "predicted_contraction",
    "GDTrajectory", "simulate_gd", "simulate_gd_balanced", "measured_rate",
    "gradient_flow_closed_form", "gradient_flow", "gradient_flow_residual", "integrate_flow_ode",
    "DEFAULT_DEPTHS", "DepthRow", "DepthStudy", "depth_study", "ExactCheckRow", "exact_vs_gd",
]
