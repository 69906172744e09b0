"""Deep scalar linear networks: the data's second moments and the learning-rate rules they give.

`ScalarData` holds E[x^2], E[xy] (and E[y^2] for loss values); the rules are the sharpness
at the balanced optimum, the edge of stability, and the rate-equalising step of the
`throughputlab.lr.scalar` docstring. The depth and sign checks shared by the simulations
live here too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

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


def check_depth(depth) -> int:
    if int(depth) != depth or depth < 1:
        raise UserError(f"depth must be a positive integer, got {depth!r}")
    return int(depth)


def check_positive_product(depth: int, data: ScalarData, w0: float) -> None:
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
    depth = check_depth(depth)
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
