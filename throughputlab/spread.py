"""Prediction intervals: how far a prediction of its kind has been from what was measured.

A ``Spread`` is a band of measured/predicted ratios at a stated level: a rate the model predicts
as ``v`` lies in ``[v * lo, v * hi]`` (a time in ``[t / hi, t / lo]``). Three sources:

- an analytic prediction takes the spread of predicted/published over the published points of its
  kind (phase, device family, tensor-parallel size; ``spread_data.PUBLISHED``, written by
  ``benchmarks/published.py --write-spread``), as a split-conformal band: with ``n`` ratios the
  ``k``-th smallest and largest, ``k = floor((1 - level) / 2 * (n + 1))``, hold a new point of the
  same kind with probability at least ``level`` when the points are exchangeable (Vovk et al.,
  *Algorithmic Learning in a Random World*, 2005; Lei et al. 2018, JASA 113:1094). A kind with
  fewer points than a band needs falls back to a coarser kind (device family dropped, then TP);
- decide's RL step takes the spread of predicted/published step time over published RL runs of its framework and
  placement (``spread_rl.RL_STEPS``, written by ``benchmarks/rl_runs.py --write-spread``), the same way;
- a fitted profile's band combines, in log space, the fit's leave-one-out errors (parameter
  uncertainty and form at points the fit did not see) and the run-to-run spread of the measured
  samples, each as a standard deviation, at the normal quantile of the level.

No torch, no scipy.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Optional, Sequence

from throughputlab.records.base import Record

LEVEL = 0.8


class Spread(Record):
    """measured/predicted lies in [lo, hi] with probability ``level``; ``basis`` says from what."""

    level: float = LEVEL
    lo: float
    hi: float
    basis: str

    def rate(self, value: float, level: float = LEVEL) -> tuple[float, float]:
        """The interval of a predicted rate (tokens/s)."""
        self._check(level)
        return value * self.lo, value * self.hi

    def time(self, value: float, level: float = LEVEL) -> tuple[float, float]:
        """The interval of a predicted time (a rate's inverse)."""
        self._check(level)
        return value / self.hi, value / self.lo

    def _check(self, level: float) -> None:
        if not math.isclose(level, self.level):
            raise ValueError(f"this interval is stated at {self.level:.0%}, not {level:.0%}")


def conformal_band(ratios: Sequence[float], level: float = LEVEL) -> Optional[tuple[float, float]]:
    """The split-conformal band of measured/predicted ``ratios`` (see the module docstring); None when
    there are too few for the level (fewer than 9 at 80%)."""
    r = sorted(x for x in ratios if x > 0 and math.isfinite(x))
    k = math.floor((1.0 - level) / 2.0 * (len(r) + 1) + 1e-9)  # 1 - 0.8 is 0.19999...
    if k < 1:
        return None
    return r[k - 1], r[len(r) - k]


# A datasheet row's family by the start of its key (records.peaks rows).
FAMILIES = (("MI3", "AMD CDNA3"), ("GB2", "NVIDIA Blackwell"), ("B2", "NVIDIA Blackwell"), ("H", "NVIDIA Hopper"),
            ("A", "NVIDIA Ampere"), ("RTX 3", "NVIDIA Ampere"), ("L", "NVIDIA Ada"), ("RTX 4", "NVIDIA Ada"),
            ("V100", "NVIDIA Volta"))


def device_family(device_key: Optional[str]) -> Optional[str]:
    """The family of a datasheet row's key (``peaks.lookup(...).device``), or None."""
    if not device_key:
        return None
    return next((f for prefix, f in FAMILIES if device_key.startswith(prefix)), None)


def tp_bucket(tp: int) -> str:
    return "tp1" if tp <= 1 else "tp2-4" if tp <= 4 else "tp8+"


def kind_keys(phase: str, family: Optional[str], tp: int) -> list[tuple[Optional[str], ...]]:
    """The kinds a prediction belongs to, finest first, as (phase, family, TP bucket) patterns in which
    None matches anything; the table's keys are the first, full one."""
    tpb = tp_bucket(tp)
    return [(phase, family or "unknown", tpb), (phase, None, tpb), (phase, None, None)]


def matches(key: tuple, pattern: tuple) -> bool:
    """Whether a table key belongs to a kind pattern (None: any)."""
    return all(p is None or k == p for k, p in zip(key, pattern))


def _label(pattern: tuple) -> str:
    return " ".join(p for p in pattern if p is not None)


def published_spread(phase: str, family: Optional[str], tp: int, level: float = LEVEL,
                     leave_out: Optional[float] = None, table: Optional[dict] = None) -> Optional[Spread]:
    """The band of the finest kind with enough published points. ``leave_out``: a predicted/published
    ratio to drop once from every kind (a leave-one-out check of the band on its own points); ``table``:
    other ratios by kind than ``spread_data.PUBLISHED`` (a check leaving a whole source out)."""
    from throughputlab.spread_data import PUBLISHED, SOURCE

    found = _finest_band(PUBLISHED if table is None else table, kind_keys(phase, family, tp), level, invert=True,
                         leave_out=leave_out)  # the table holds predicted/published rates: measured/predicted inverts
    if found is None:
        return None
    pattern, n, (lo, hi) = found
    return Spread(level=level, lo=lo, hi=hi, basis=f"{level:.0%} band of measured/predicted over {n} published "
                                                   f"{_label(pattern)} points (split conformal; {SOURCE})")


def _finest_band(table: dict, patterns, level: float, invert: bool = False, leave_out: Optional[float] = None):
    """The first kind pattern whose ratios (less ``leave_out`` once; inverted with ``invert``) are enough for a
    band: (pattern, count, (lo, hi)), else None."""
    for pattern in patterns:
        ratios = [r for k, rs in table.items() if matches(k, pattern) for r in rs]
        if leave_out is not None and leave_out in ratios:
            ratios.remove(leave_out)
        band = conformal_band([1.0 / r for r in ratios] if invert else ratios, level)
        if band is not None:
            return pattern, len(ratios), band
    return None


RL_PLACEMENTS = ("colocated", "split")


def rl_step_spread(framework: Optional[str], placement: str, level: float = LEVEL,
                   table: Optional[dict] = None) -> Optional[Spread]:
    """The band of decide's RL step against published runs of the finest kind with enough of them: the framework
    and placement (colocated, or split: one-step-off and asynchronous), then the placement, then every run.
    Its ratios are a step rate's measured/predicted (predicted/published step time), so ``time`` gives a step's
    interval; ``table``: other ratios than ``spread_rl.RL_STEPS``."""
    from throughputlab.spread_rl import RL_STEPS, SOURCE

    if placement not in RL_PLACEMENTS:
        raise ValueError(f"placement is one of {', '.join(RL_PLACEMENTS)}, got {placement!r}")
    found = _finest_band(RL_STEPS if table is None else table,
                         ((framework or "unknown", placement), (None, placement), (None, None)), level)
    if found is None:
        return None
    pattern, n, (lo, hi) = found
    return Spread(level=level, lo=lo, hi=hi, basis=f"{level:.0%} band of predicted/published step time over {n} "
                                                   f"published {_label(pattern) or 'RL'} runs with their response "
                                                   f"lengths (split conformal; {SOURCE})")


def fitted_spread(loo_log_errors: Sequence[float], run_log_sd: Optional[float], what: str,
                  level: float = LEVEL) -> Optional[Spread]:
    """A fitted model's band: leave-one-out log errors (predicted/measured) and the run-to-run log
    standard deviation of the samples, added in quadrature, at the normal quantile of ``level``."""
    errs = [e for e in loo_log_errors if math.isfinite(e)]
    if len(errs) < 2:
        return None
    loo_sd = math.sqrt(sum(e * e for e in errs) / len(errs))
    sd = math.hypot(loo_sd, run_log_sd or 0.0)
    z = NormalDist().inv_cdf(0.5 + level / 2.0)
    run = "no repeated samples" if run_log_sd is None else f"run-to-run {run_log_sd:.1%}"
    return Spread(level=level, lo=math.exp(-z * sd), hi=math.exp(z * sd),
                  basis=f"{level:.0%} band of the {what} fit: leave-one-out {loo_sd:.1%} over {len(errs)} points and "
                        f"{run} (log standard deviations in quadrature, normal quantile)")
