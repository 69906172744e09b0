"""Result schema of `lr fit`: per-group optima, the fitted law, curvature test, held-out checks, the report.

Versioned pydantic models with ``extra="forbid"``; a saved JSON report loads back into them.
Unknown values are None, never inf.
"""

from __future__ import annotations

from typing import Literal, Optional

from throughputlab.records.base import Record

SCHEMA_VERSION = 1


class Optimum(Record):
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


class Coef(Record):
    name: str
    value: float
    se: Optional[float]
    lo: Optional[float]  # 95% interval
    hi: Optional[float]
    p_value: Optional[float]  # for the hypothesis value == 0


class LawFit(Record):
    """log lr* = c0 + alpha log N + beta log D (alpha or beta None when N or D takes one value)."""

    coefs: list[Coef]
    n_groups: int
    dof: int
    residual_sd: Optional[float]  # in log lr
    r2: Optional[float]

    def coef(self, name: str) -> Optional[Coef]:
        return next((c for c in self.coefs if c.name == name), None)


class Holdout(Record):
    """The largest value of one axis held out and predicted by the law fitted on the rest."""

    axis: Literal["N", "D"]
    held_out: float
    n_train_groups: int
    n_test_groups: int
    mean_abs_log_error: float  # natural-log units of lr
    error_factor: float  # exp(mean_abs_log_error): how many times off lr* is
    max_abs_z: Optional[float]  # error in prediction standard errors (law + group interval)
    mean_signed_log_error: float  # measured - predicted; > 0: the law undershoots lr*


class Curvature(Record):
    testable: bool
    coefs: list[Coef]  # gamma_N, gamma_D on centered logs
    f_stat: Optional[float]
    p_value: Optional[float]  # joint test of all quadratic terms
    detected: bool
    direction: Optional[Literal["upward", "downward", "mixed"]]
    note: str = ""


class LawAnalysis(Record):
    quantity: Literal["lr", "effective_lr"]
    optima: list[Optimum]
    law: Optional[LawFit]
    curvature: Optional[Curvature]
    holdouts: list[Holdout]
    preferred_extrapolation: Optional[Literal["N", "D"]]


class LRFitReport(Record):
    schema_version: int = SCHEMA_VERSION
    source: str
    n_runs: int
    columns: dict[str, str]  # canonical -> CSV column
    window: int
    alpha_level: float
    lr: LawAnalysis
    effective: Optional[LawAnalysis]
    summary: list[str]
