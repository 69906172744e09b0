"""Samples-to-target: from learning curves, or from a parametric form of N*(B).

Curves: one CSV row per logged step (as experiment trackers export them) with a run, its
batch size, learning rate, cumulative samples (or the step), and the metric. Each run is
smoothed on the sample axis (an exponential moving average whose time constant is a number of
samples, the same for every run: an average over logged steps lags by more samples when a step
holds more samples, which would count against larger batches), its first crossing of the target is
interpolated between the two logged points around it, and runs with the same batch size
and learning rate are seeds of one configuration: median and range over seeds. Curves
are compared at equal cumulative samples to say whether they are batch-size invariant.

Parametric: ``N*(B) = N_min * (1 + B/B_noise)`` (McCandlish et al. 2018, "An Empirical
Model of Large-Batch Training") or flat (optionally over a range of batch sizes).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Literal, Optional

import numpy as np
from pydantic import Field

from throughputlab.decide.lengths import parse_kv
from throughputlab.errors import UserError
from throughputlab.records.base import Record, SettingsRecord

Direction = Literal["max", "min"]


class CurveColumns(Record):
    """Column names in the curves CSV; ``samples`` wins over ``step`` (then samples = step x batch)."""

    run: str = "run"
    batch: str = "batch_size"
    lr: Optional[str] = "lr"
    samples: Optional[str] = "samples"
    step: Optional[str] = "step"
    metric: str = "metric"


class CurvesSpec(SettingsRecord):
    path: str = Field(description="Learning curves, one row per logged step.")
    columns: CurveColumns = Field(CurveColumns(), description=(
        "Curves column names, KEY in run, batch, lr, samples, step, metric (repeatable)."))
    smoothing: float = 0.6  # EMA weight on the past per logged step of the smallest batch, 0 = none (as in TensorBoard)
    smoothing_samples: Optional[float] = None  # the time constant in samples; default: from `smoothing` at the smallest batch
    invariance_tol: float = 0.05  # curves within this share of the metric's range count as invariant


class RunCurve(Record):
    run: str
    batch: float
    lr: Optional[float]
    samples: list[float]
    metric: list[float]
    smoothed: list[float]
    crossing_samples: Optional[float]  # None: target never reached
    best_metric: float


class ConfigResult(Record):
    """One (batch size, learning rate) configuration: its seeds aggregated."""

    batch: float
    lr: Optional[float]
    runs: list[str]
    reached: int  # seeds that reached the target
    nstar_samples: Optional[float]  # median over seeds (unreached counted as never); None: not reached
    nstar_low: Optional[float]  # range over seeds
    nstar_high: Optional[float]
    best_metric: float
    gap_to_baseline: Optional[float] = None  # largest |difference| at equal samples, share of the metric range
    invariant: Optional[bool] = None  # within tolerance of the baseline curve at equal samples

    @property
    def label(self) -> str:
        lr = f", lr {self.lr:.3g}" if self.lr is not None else ""
        return f"batch {self.batch:g}{lr}"

    @property
    def status(self) -> str:
        if self.nstar_samples is not None:
            return "reached" if self.reached == len(self.runs) else f"reached by {self.reached}/{len(self.runs)} seeds"
        return "not reached" if self.reached == 0 else f"not reached by most seeds ({self.reached}/{len(self.runs)})"


class CurvesResult(Record):
    source: str
    target: float
    direction: Direction
    configs: list[ConfigResult]
    runs: list[RunCurve]
    baseline_index: Optional[int] = None
    smoothing_samples: float = 0.0  # the time constant of the sample-axis smoothing every run got

    def for_batch(self, batch: float) -> list[ConfigResult]:
        return [c for c in self.configs if math.isclose(c.batch, batch, rel_tol=1e-9)]


def ema_samples(x: np.ndarray, y: np.ndarray, tau: float) -> np.ndarray:
    """Exponential smoothing on the sample axis: ds/dx = (y(x) - s)/tau over the curve drawn
    linearly between its logged points, solved exactly on each segment, starting at the first
    point. A trend of slope m then lags by m*tau whatever the logging interval, so runs logged
    every 64 or every 1,024 samples are smoothed alike."""
    y = np.asarray(y, dtype=float)
    if tau <= 0 or len(y) < 2:
        return y.copy()
    out = np.empty(len(y))
    out[0] = y[0]
    for i in range(1, len(y)):
        dx = float(x[i] - x[i - 1])
        if dx <= 0:
            out[i] = out[i - 1]
            continue
        m = (y[i] - y[i - 1]) / dx
        decay = math.exp(-dx / tau)
        out[i] = y[i] - m * tau + (out[i - 1] - y[i - 1] + m * tau) * decay
    return out


def default_smoothing_samples(weight: float, smallest_batch: float) -> float:
    """The sample-axis time constant of a per-step EMA of ``weight`` at the smallest batch size:
    weight/(1 - weight) steps of that batch."""
    if weight <= 0:
        return 0.0
    return weight / (1.0 - weight) * smallest_batch


def first_crossing(x: np.ndarray, y: np.ndarray, target: float, direction: Direction) -> Optional[float]:
    """Samples at which ``y`` first reaches ``target``, linear between the logged points; None if never."""
    hit = y >= target if direction == "max" else y <= target
    idx = np.flatnonzero(hit)
    if len(idx) == 0:
        return None
    i = int(idx[0])
    if i == 0:
        return float(x[0])
    x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
    return float(x0 + (target - y0) * (x1 - x0) / (y1 - y0))


def _median_or_none(values: list[float]) -> Optional[float]:
    m = statistics.median(values)
    return None if math.isinf(m) else float(m)


def read_curves_csv(spec: Optional[CurvesSpec]):
    """The curves file as a frame with the columns the spec names (None without one); every
    problem is one line."""
    from throughputlab.files import read_csv

    if spec is None:
        return None
    df = read_csv(spec.path, "a learning-curves CSV, one row per logged step", f"--curves {spec.path}")
    cols = spec.columns
    missing = [c for c in (cols.run, cols.batch, cols.metric) if c not in df.columns]
    if not (cols.samples and cols.samples in df.columns) and not (cols.step and cols.step in df.columns):
        missing.append(f"{cols.samples or 'samples'} (or {cols.step or 'step'})")
    if missing:
        raise UserError(f"{Path(spec.path).name} lacks column(s) {', '.join(missing)}; it has "
                        f"{', '.join(map(str, df.columns)) or 'none'}: map them with --column KEY=NAME (keys: run, "
                        "batch, lr, samples, step, metric) or samples.curves.columns in the spec")
    return df


def load_curves(spec: CurvesSpec, target: float, direction: Direction,
                baseline_batch: Optional[float] = None) -> CurvesResult:
    """Read, validate and analyse a learning-curves CSV; every problem is one UserError line."""
    import pandas as pd

    if direction not in ("max", "min"):
        raise UserError(f"--direction must be max or min, got {direction!r}")
    if not math.isfinite(target):
        raise UserError(f"--target must be a finite number, got {target!r}")
    df = read_curves_csv(spec)
    name = Path(spec.path).name
    cols = spec.columns
    x_col = cols.samples if cols.samples and cols.samples in df.columns else None
    step_col = cols.step if cols.step and cols.step in df.columns else None
    lr_col = cols.lr if cols.lr and cols.lr in df.columns else None
    numeric = [cols.batch, cols.metric, x_col or step_col] + ([lr_col] if lr_col else [])
    for c in numeric:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    df = df.dropna(subset=[cols.metric, x_col or step_col])
    if df.empty:
        raise UserError(f"{name} has no rows with numeric {cols.metric} and {x_col or step_col}")
    if df[cols.batch].isna().any() or (df[cols.batch] <= 0).any():
        raise UserError(f"{name}: column {cols.batch} must hold positive batch sizes on every row")

    if not 0 <= spec.smoothing < 1:
        raise UserError(f"samples.curves.smoothing must be in [0, 1), got {spec.smoothing}")
    tau = spec.smoothing_samples if spec.smoothing_samples is not None else default_smoothing_samples(
        spec.smoothing, float(df[cols.batch].min()))
    if tau < 0:
        raise UserError(f"samples.curves.smoothing_samples must be zero or more, got {tau}")
    runs: list[RunCurve] = []
    for run, g in df.groupby(cols.run, sort=False):
        batches = g[cols.batch].unique()
        if len(batches) != 1:
            raise UserError(f"{name}: run {run!r} has several batch sizes ({', '.join(map(str, batches[:4]))}); "
                            "give each configuration its own run name")
        b = float(batches[0])
        x = g[x_col].to_numpy(float) if x_col else g[step_col].to_numpy(float) * b
        order = np.argsort(x, kind="stable")
        x, y = x[order], g[cols.metric].to_numpy(float)[order]
        lr = float(g[lr_col].iloc[0]) if lr_col and not g[lr_col].isna().all() else None
        sm = ema_samples(x, y, tau)
        runs.append(RunCurve(run=str(run), batch=b, lr=lr, samples=x.tolist(), metric=y.tolist(),
                             smoothed=sm.tolist(), crossing_samples=first_crossing(x, sm, target, direction),
                             best_metric=float(sm.max() if direction == "max" else sm.min())))
    if len(runs) < 2:
        raise UserError(f"{name} holds one run only ({runs[0].run!r}): need runs at two or more batch sizes "
                        "to compare, or use --nstar for a parametric samples-to-target")
    if not any(r.crossing_samples is not None for r in runs):
        best = max(r.best_metric for r in runs) if direction == "max" else min(r.best_metric for r in runs)
        raise UserError(f"target {target:g} ({direction}) is never reached by any run in {name} "
                        f"(best smoothed value {best:.4g}): choose a target the runs reach")

    groups: dict[tuple, list[RunCurve]] = {}
    for r in runs:
        key = (r.batch, None if r.lr is None else round(r.lr, 15))
        groups.setdefault(key, []).append(r)
    if len(groups) < 2:
        raise UserError(f"{name}: all runs share one batch size and learning rate ({runs[0].batch:g}); "
                        "need two or more configurations to compare")
    configs = []
    for (b, lr), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0.0)):
        cross = [r.crossing_samples if r.crossing_samples is not None else math.inf for r in rs]
        finite = [c for c in cross if math.isfinite(c)]
        best = [r.best_metric for r in rs]
        configs.append(ConfigResult(
            batch=b, lr=lr, runs=[r.run for r in rs], reached=len(finite), nstar_samples=_median_or_none(cross),
            nstar_low=min(finite) if finite else None,
            nstar_high=max(cross) if finite and all(math.isfinite(c) for c in cross) else None,
            best_metric=float(statistics.median(best))))
    result = CurvesResult(source=str(spec.path), target=target, direction=direction, configs=configs, runs=runs,
                          smoothing_samples=tau)
    _invariance(result, spec.invariance_tol, baseline_batch)
    return result


def _mean_curve(runs: list[RunCurve], grid: np.ndarray) -> np.ndarray:
    return np.mean([np.interp(grid, r.samples, r.smoothed) for r in runs], axis=0)


def _invariance(res: CurvesResult, tol: float, baseline_batch: Optional[float]) -> None:
    """Compare each configuration's mean curve with the baseline's at equal cumulative samples."""
    by_label = {(c.batch, c.lr): [r for r in res.runs if r.run in c.runs] for c in res.configs}
    if baseline_batch is not None and res.for_batch(baseline_batch):
        base = res.for_batch(baseline_batch)[0]
    else:
        base = res.configs[0]
    res.baseline_index = res.configs.index(base)
    base_runs = by_label[(base.batch, base.lr)]
    lo_b = max(r.samples[0] for r in base_runs)
    hi_b = min(r.samples[-1] for r in base_runs)
    span = max(max(r.smoothed) for r in base_runs) - min(min(r.smoothed) for r in base_runs)
    for c in res.configs:
        if c is base:
            c.gap_to_baseline, c.invariant = 0.0, True
            continue
        rs = by_label[(c.batch, c.lr)]
        lo = max(lo_b, max(r.samples[0] for r in rs))
        hi = min(hi_b, min(r.samples[-1] for r in rs))
        if not hi > lo or span <= 0:
            continue  # no overlap in samples: nothing to compare
        grid = np.linspace(lo, hi, 64)
        gap = float(np.max(np.abs(_mean_curve(rs, grid) - _mean_curve(base_runs, grid)))) / span
        c.gap_to_baseline, c.invariant = gap, gap <= tol


# ---------------------------------------------------------------- parametric N*


class NStarParam(Record):
    """``flat`` (optionally ``N``, ``lo``, ``hi``) or ``mcandlish`` (``N_min``, ``B_noise``); batch in samples."""

    kind: Literal["flat", "mcandlish"]
    n: Optional[float] = None  # flat: samples to target, when known (else only ratios are known)
    lo: Optional[float] = None
    hi: Optional[float] = None
    n_min: Optional[float] = None
    b_noise: Optional[float] = None

    def nstar(self, batch: float) -> tuple[Optional[float], str]:
        """(N*, status); N* None when unknown. A flat form without N returns 1.0 (a relative unit)."""
        if self.kind == "mcandlish":
            return self.n_min * (1.0 + batch / self.b_noise), "parametric (McCandlish)"
        if (self.lo is not None and batch < self.lo) or (self.hi is not None and batch > self.hi):
            return None, f"outside the flat range [{self.lo or 0:g}, {self.hi or math.inf:g}]"
        return (self.n if self.n is not None else 1.0), "flat"

    def describe(self) -> str:
        if self.kind == "mcandlish":
            return f"N*(B) = {self.n_min:g} * (1 + B/{self.b_noise:g})"
        rng = f" over [{self.lo or 0:g}, {self.hi if self.hi is not None else math.inf:g}]" if (
            self.lo is not None or self.hi is not None) else ""
        return f"N* flat{rng}" + (f" at {self.n:g} samples" if self.n is not None else " (relative)")


def parse_nstar(text: str) -> NStarParam:
    """``flat`` | ``flat:N=2e6,lo=64,hi=1024`` | ``mcandlish:N_min=1e6,B_noise=2048``."""
    kind, _, rest = str(text).strip().partition(":")
    kind = kind.strip().lower()
    kv = parse_kv(rest, "--nstar", text)
    allowed = {"flat": {"N", "lo", "hi"}, "mcandlish": {"N_min", "B_noise"}}
    if kind not in allowed:
        raise UserError(f"--nstar {text!r}: use flat[:N=..,lo=..,hi=..] or mcandlish:N_min=..,B_noise=..")
    unknown = set(kv) - allowed[kind]
    if unknown:
        raise UserError(f"--nstar {text!r}: unknown key(s) {', '.join(sorted(unknown))}; "
                        f"{kind} takes {', '.join(sorted(allowed[kind]))}")
    vals: dict[str, float] = {}
    for k, v in kv.items():
        try:
            vals[k] = float(v)
        except ValueError:
            raise UserError(f"--nstar {text!r}: {k} must be a number, got {v!r}") from None
        if not (math.isfinite(vals[k]) and vals[k] > 0):
            raise UserError(f"--nstar {text!r}: {k} must be a positive number, got {v!r}")
    if kind == "mcandlish":
        if set(kv) != allowed[kind]:
            raise UserError(f"--nstar {text!r}: mcandlish needs both N_min and B_noise")
        return NStarParam(kind="mcandlish", n_min=vals["N_min"], b_noise=vals["B_noise"])
    if "lo" in vals and "hi" in vals and vals["hi"] < vals["lo"]:
        raise UserError(f"--nstar {text!r}: hi must be at least lo")
    return NStarParam(kind="flat", n=vals.get("N"), lo=vals.get("lo"), hi=vals.get("hi"))
