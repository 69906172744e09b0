"""What `decide --against` and `--calibrate-from` record and print: each phase of a run log beside the
model's, the comparison of one log, and the per-phase calibration factors (decide.against computes them)."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict

from throughputlab.imports.runlog import Spread

APPLIES_TO = ("each factor multiplies its phase's whole predicted time at every batch size (the model keeps "
              "how the phase scales with the batch)")
DEFAULT_DEVICES = "the profile's devices"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PhaseCheck(_Model):
    """One phase: the log's time over steps beside the model's, and their ratio."""

    phase: str
    log_key: Optional[str] = None
    logged: Optional[Spread] = None  # seconds over the logged steps; None: not logged
    predicted_s: Optional[float] = None  # None: the model has no such phase
    ratio: Optional[float] = None  # logged median / predicted (the median over steps of logged / predicted)
    calibrated_s: Optional[float] = None
    calibrated_ratio: Optional[float] = None  # logged median / calibrated
    status: str = "compared"  # compared | not logged | not in the model: why


class LogCheck(_Model):
    log: str
    format: str
    steps: int
    prompts: int
    group: int
    responses: int
    batch_from: str  # which flag gave the log's batch
    response_lengths: str
    response_lengths_from: str
    placement: Optional[str] = None
    overlap: str
    phases: list[PhaseCheck]
    notes: list[str] = []
    calibrated_from: Optional[str] = None
    sync_in_gen: bool = False  # the log's generation timer holds the weight sync (veRL colocated)


class Calibration(_Model):
    """Per-phase factors (logged / predicted) that the decision's step times are multiplied by."""

    log: str
    factors: dict[str, float]
    uncalibrated: dict[str, str]  # phase -> why it keeps factor 1
    step_only: bool = False  # only the whole step is logged: its factor scales every phase
    sync_in_gen: bool = False  # the gen factor was fitted on generation + sync: the sync is inside it
    applies_to: str = APPLIES_TO

    def factor(self, phase: str) -> float:
        return self.factors.get("step" if self.step_only else phase, 1.0)

    def describe(self) -> str:
        if self.step_only:
            text = (f"calibrated from {self.log}: step x{self.factors['step']:.3g} (only the whole step is logged, "
                    "so it scales every phase)")
        else:
            text = f"calibrated from {self.log}: " + ", ".join(f"{k} x{v:.3g}" for k, v in self.factors.items())
        if self.uncalibrated:
            text += "; uncalibrated (factor 1): " + ", ".join(f"{k} ({why})" for k, why in self.uncalibrated.items())
        return f"{text}; {APPLIES_TO}"


# ---------------------------------------------------------------- the comparison as text


def _s(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3g}"


def check_text(c: LogCheck) -> str:
    """The comparison as a terminal table, with its batch, lengths and devices above it."""
    what = "fitted from" if c.calibrated_from == c.log else "against"
    lines = [f"{what} {c.log} ({c.format}, {c.steps} step(s)): {c.prompts} prompts x {c.group} = {c.responses} "
             f"responses per step ({c.batch_from}); {c.placement or DEFAULT_DEVICES}"
             + (", one-step off-policy" if c.overlap == "off-policy" else ""),
             f"response lengths: {c.response_lengths} (from {c.response_lengths_from})"]
    cal = c.calibrated_from is not None
    head = ["phase", "log key", "steps", "logged s", "p10-p90 s", "predicted s", "logged/predicted"]
    head += ["calibrated s", "logged/calibrated"] if cal else []
    table = []
    for p in c.phases:
        g = p.logged
        row = [p.phase, p.log_key or "-", str(g.n) if g else "-", _s(g.median) if g else "not logged",
               f"{g.p10:.3g}-{g.p90:.3g}" if g else "-", _s(p.predicted_s), _r(p.ratio)]
        row += [_s(p.calibrated_s), _r(p.calibrated_ratio)] if cal else []
        table.append(row + ([p.status] if p.status.startswith(("not in", "in gen")) else []))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *table)]
    fmt = lambda cells: "  ".join(str(x).ljust(w) if i < 2 else str(x).rjust(w)  # noqa: E731
                                  for i, (x, w) in enumerate(zip(cells, widths)))
    lines += [fmt(head), fmt(["-" * w for w in widths])]
    lines += [fmt(r) + (f"  {r[len(head)]}" if len(r) > len(head) else "") for r in table]
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines)


def _r(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.2f}"
