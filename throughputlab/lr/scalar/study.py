"""Deep scalar linear networks: the studies `throughputlab lr depth` prints.

`depth_study` runs GD at every depth under the data-agnostic lr_1 / L rule and under the
data-dependent rule and measures their rates; `exact_vs_gd` compares the exact flow with
simulated GD (plain, Richardson-extrapolated) and an ODE solver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from throughputlab.errors import UserError
from throughputlab.lr.scalar.data import (
    ScalarData,
    check_depth,
    check_positive_product,
    predicted_contraction,
    rate_equalising_lr,
)
from throughputlab.lr.scalar.flow import gradient_flow, integrate_flow_ode
from throughputlab.lr.scalar.gd import measured_rate, simulate_gd, simulate_gd_balanced


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
    depths = [check_depth(d) for d in depths]
    study = DepthStudy(step_rate=step_rate, p0=p0)
    for name, data in datasets.items():
        lr1 = rate_equalising_lr(1, data, step_rate)
        runs = []
        for d in depths:
            check_positive_product(d, data, p0 ** (1.0 / d))
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
