"""The decision's records: one row per candidate batch (its step time, samples/s, samples-to-target
and the ratio test against the baseline), the recommendation, and the whole decision as
`throughputlab decide` prints and saves it."""

from __future__ import annotations

from typing import Literal, Optional

from throughputlab.decide.curves import CurvesResult
from throughputlab.decide.steptime import StepTime
from throughputlab.records.base import Record
from throughputlab.spread import Spread

SampleUnit = Literal["responses", "prompts"]


class Row(Record):
    """One candidate configuration (batch size, and the learning rate its curve used)."""

    label: str
    prompts: int
    group: int
    batch_samples: float  # batch size in the sample unit
    step: Optional[StepTime] = None  # None when samples/s were given directly
    step_s: Optional[float] = None
    samples_per_s: float
    lr: Optional[float] = None  # the learning rate of this row's curve, or the rule's
    lr_recommended: Optional[float] = None
    lr_retuned: Optional[bool] = None  # the row's lr matches the rule's within 5%
    nstar_samples: Optional[float] = None  # None: unknown or not reached (see nstar_status)
    nstar_low: Optional[float] = None
    nstar_high: Optional[float] = None
    nstar_status: str = ""
    nstar_relative: bool = False  # a flat N* without a value: only ratios are meaningful
    time_to_target_s: Optional[float] = None
    time_ratio: Optional[float] = None  # T / T(baseline)
    throughput_gain: Optional[float] = None  # q / q(baseline)
    samples_penalty: Optional[float] = None  # N* / N*(baseline)
    beats_baseline: Optional[bool] = None  # gain > penalty
    is_baseline: bool = False
    invariant: Optional[bool] = None  # its curve matches the baseline's at equal samples


class Recommendation(Record):
    label: str
    prompts: int
    lr: Optional[float]
    time_ratio: Optional[float]  # vs the baseline
    runner_up: Optional[str]
    margin: Optional[float]  # T(runner-up)/T(best) - 1
    what_would_change: list[str]


class Decision(Record):
    rows: list[Row]
    baseline: str
    sample_unit: SampleUnit
    recommendation: Optional[Recommendation]
    notes: list[str] = []
    overlap: Optional[str] = None
    placement: Optional[str] = None
    nstar_source: str = ""
    lr_rule: str = "sqrt"
    curves: Optional[CurvesResult] = None
    step_spread: Optional[Spread] = None  # the analytic step's band against published RL runs (decide/notes.py)
