"""The settings of `throughputlab lr scale`, `lr fit` and `lr depth`, one validated tree each,
layered like every command's (defaults < ``--spec FILE`` < flags < ``--set KEY=VALUE``). Each
field's description is the help of its flag. Numbers may come as text (a flag, or a YAML value
such as ``1e-6`` that YAML reads as a string): they are parsed here, and a bad one is named."""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Optional

from pydantic import BeforeValidator, Field

from throughputlab.records.base import SettingsRecord

Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Beta = Annotated[float, Field(ge=0, lt=1)]


def _rule(value: Any) -> Any:
    from throughputlab.lr.rules import RULES

    if isinstance(value, str) and value not in RULES:
        close = difflib.get_close_matches(value, RULES, n=1)
        raise ValueError(f"use one of {', '.join(RULES)}" + (f"; did you mean {close[0]!r}?" if close else ""))
    return value


def _depths(value: Any) -> Any:
    """``1,2,4`` (a flag), one integer, or a list: positive depths, in the order given."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if not parts or not all(p.isdigit() for p in parts):
            raise ValueError(f"takes comma-separated positive integers, got {value!r}")
        return [int(p) for p in parts]
    return [value] if isinstance(value, int) and not isinstance(value, bool) else value


def _moments(value: Any) -> Any:
    """``EXX:EXY`` (a flag) or a pair ``[EXX, EXY]``."""
    if isinstance(value, str):
        parts = value.split(":")
        if len(parts) != 2:
            raise ValueError(f"takes EXX:EXY (E[x^2]:E[xy]), got {value!r}")
        return parts
    if isinstance(value, (int, float)):  # YAML reads an unquoted 1:30 as a base-60 number
        raise ValueError(f"takes EXX:EXY (E[x^2]:E[xy]) as quoted text, or a pair [EXX, EXY]; got {value!r}")
    return value


def _columns(value: Any) -> Any:
    """``params=N,tokens=D`` (a flag) or a mapping; every name one of the sweep's canonical columns."""
    if value is None:
        return {}
    if isinstance(value, str):
        out = {}
        for part in filter(str.strip, value.split(",")):
            if "=" not in part:
                raise ValueError(f"entries must be canonical=csv_name, got {part.strip()!r}")
            k, v = (s.strip() for s in part.split("=", 1))
            out[k] = v
        value = out
    if isinstance(value, dict):
        from throughputlab.lr.law.sweep import COLUMNS

        unknown = [k for k in value if k not in COLUMNS]
        if unknown:
            raise ValueError(f"unknown name {unknown[0]!r}; use one of {', '.join(COLUMNS)}")
    return value


class ScaleSpec(SettingsRecord):
    """`lr scale`: a learning rate tuned at one batch size, moved to another."""

    lr: Optional[Positive] = Field(None, description="Learning rate tuned at --from-batch.")
    from_batch: Optional[Positive] = Field(None, description="Batch size (sequences or tokens) the lr was tuned at.")
    to_batch: Optional[Positive] = Field(None, description="Batch size to run at (same unit as --from-batch).")
    rule: Annotated[str, BeforeValidator(_rule)] = Field(
        "sqrt", description="sqrt: lr*sqrt(B/B0), for Adam-family optimizers; linear: lr*B/B0, for SGD; none: keep lr.")
    beta1: Beta = Field(0.9, description="Adam beta1, for the SDE rule shown beside.")
    beta2: Beta = Field(0.999, description="Adam beta2, for the SDE rule shown beside.")
    eps: Positive = Field(1e-8, description="Adam epsilon, for the SDE rule shown beside.")


class FitSpec(SettingsRecord):
    """`lr fit`: the sweep CSV and how its lr law is fitted."""

    sweep: Optional[str] = Field(None, description="The sweep CSV, one row per run.")
    columns: Annotated[dict[str, str], BeforeValidator(_columns)] = Field(
        {}, description="Map CSV columns onto params,tokens,lr,loss[,weight_norm,update_norm | effective_lr], "
                        "e.g. params=N,tokens=D,loss=eval_loss. Unmapped names are read as they are.")
    window: Annotated[int, Field(ge=1)] = Field(
        2, description="Points on each side of the lowest loss used in the quadratic fit in log lr.")
    alpha: Annotated[float, Field(gt=0, lt=1)] = Field(0.05, description="Significance level of the curvature test.")


Moments = Annotated[tuple[Finite, Finite], BeforeValidator(_moments)]


class DepthSpec(SettingsRecord):
    """`lr depth`: the deep scalar linear network study."""

    depths: Annotated[list[Annotated[int, Field(gt=0)]], BeforeValidator(_depths), Field(min_length=1)] = Field(
        [1, 2, 4, 8, 16, 32, 64, 128], description="Depths L to simulate.")
    data: Annotated[list[Moments], Field(min_length=1)] = Field(
        [(1.0, 0.25), (1.0, 1.5), (2.0, 6.0)], description="Data second moments E[x^2]:E[xy]; repeat for several.")
    step_rate: Finite = Field(
        0.1, description="Target per-step contraction 1 - r of |p - p*| for the data-dependent rule.")
    p0: Finite = Field(1.0, description="Start product (balanced layers; 1 = identity).")
    steps: Annotated[int, Field(ge=10)] = Field(20000, description="Most gradient-descent steps per run.")
    check_exact: bool = Field(
        True, description="Also compare the exact gradient-flow solution with simulated GD at depths 1, 2, 3, 8.")
