"""Batch-size learning-rate rules: pure functions, shared by `lr scale` and `decide`.

Square root for Adam-family optimizers, linear for SGD (Goyal et al. 2017), none to keep
the rate. The stochastic-differential-equation (SDE) rule for Adam also moves beta and
epsilon with the batch scale k = B/B0 (Malladi et al. 2022, "On the SDEs and Scaling
Rules for Adaptive Gradient Algorithms"): lr*sqrt(k), 1-beta scaled by k, eps/sqrt(k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from throughputlab.errors import UserError

RULES = ("sqrt", "linear", "none")


def _check_batch(name: str, value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be a positive number, got {value!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise UserError(f"{name} must be a positive number, got {value!r}")
    return v


def _check_rule(rule: str) -> str:
    if rule not in RULES:
        import difflib

        close = difflib.get_close_matches(str(rule), RULES, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UserError(f"unknown lr rule {rule!r}: use one of {', '.join(RULES)}{hint}")
    return rule


def scale_lr(lr: float, from_batch: float, to_batch: float, rule: str = "sqrt") -> float:
    """Learning rate for batch `to_batch`, given `lr` tuned at `from_batch`.

    sqrt: lr * sqrt(B/B0) (Adam family); linear: lr * B/B0 (SGD); none: lr.
    """
    lr_v = _check_batch("--lr", lr)
    b0 = _check_batch("--from-batch", from_batch)
    b1 = _check_batch("--to-batch", to_batch)
    _check_rule(rule)
    k = b1 / b0
    if rule == "sqrt":
        return lr_v * math.sqrt(k)
    if rule == "linear":
        return lr_v * k
    return lr_v


@dataclass(frozen=True)
class AdamSDEScaling:
    """Adam hyper-parameters after the SDE scaling rule for a batch scale k = B/B0."""

    k: float
    lr: float
    beta1: float
    beta2: float
    eps: float


def scale_adam_sde(lr: float, from_batch: float, to_batch: float, beta1: float = 0.9,
                   beta2: float = 0.999, eps: float = 1e-8) -> AdamSDEScaling:
    """Malladi et al. 2022 SDE rule: lr*sqrt(k), 1-beta -> k*(1-beta), eps -> eps/sqrt(k).

    For k > 1 the scaled 1-beta can exceed 1; it is clipped to beta >= 0, which means
    the rule no longer holds there (the paper's rule is meant for moderate k).
    """
    lr_v = _check_batch("--lr", lr)
    b0 = _check_batch("--from-batch", from_batch)
    b1 = _check_batch("--to-batch", to_batch)
    for name, beta in (("--beta1", beta1), ("--beta2", beta2)):
        if not (0.0 <= float(beta) < 1.0):
            raise UserError(f"{name} must be in [0, 1), got {beta!r}")
    if not (float(eps) > 0):
        raise UserError(f"--eps must be positive, got {eps!r}")
    k = b1 / b0
    return AdamSDEScaling(
        k=k,
        lr=lr_v * math.sqrt(k),
        beta1=max(0.0, 1.0 - k * (1.0 - beta1)),
        beta2=max(0.0, 1.0 - k * (1.0 - beta2)),
        eps=eps / math.sqrt(k),
    )
