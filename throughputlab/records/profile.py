"""The Profile: versioned, validated JSON holding every measured point with its raw samples.

Written atomically after each point (temp file + rename), so a crash or ``kill -9``
loses at most the point in flight. Raw samples are stored; medians, spreads and rates are
derived here, never copied field by field. No torch import: profiles are analysed anywhere.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field, PositiveInt, ValidationError

from throughputlab.errors import UserError
from throughputlab.files import first_error, read_text
from throughputlab.models.spec import ModelSpec, dtype_bytes
from throughputlab.records import profile_frames
from throughputlab.records.base import Record, now_iso, write_atomic
from throughputlab.records.layout import SINGLE, ParallelLayout
from throughputlab.records.machine import Environment, Hardware
from throughputlab.records.settings import BenchSpec, SweepSettings

SCHEMA_VERSION = 1
Status = Literal["ok", "oom", "error", "skipped"]


def median(xs: list[float]) -> Optional[float]:
    return statistics.median(xs) if xs else None


def cv(xs: list[float]) -> Optional[float]:
    """Coefficient of variation (stdev / mean) of the samples; None with fewer than two."""
    if len(xs) < 2:
        return None
    m = statistics.fmean(xs)
    return statistics.stdev(xs) / m if m > 0 else None


# ---------------------------------------------------------------- points


class TelemetrySummary(Record):
    """Per-point summary of the background sampler (GPU through pynvml, or CPU/RSS)."""

    source: Literal["nvml", "host"]
    hz: float
    n_samples: int
    mean: dict[str, float] = {}
    max: dict[str, float] = {}
    throttled: bool = False
    throttle_reasons: list[str] = []

    def combined(self, other: "TelemetrySummary") -> "TelemetrySummary":
        """One summary over two sampling windows (a point visited twice): means weighted by
        sample count, maxima of maxima."""
        if other.source != self.source or other.n_samples == 0:
            return self if self.n_samples else other
        n = self.n_samples + other.n_samples
        mean = {k: (self.mean.get(k, v) * self.n_samples + v * other.n_samples) / n if k in self.mean else v
                for k, v in other.mean.items()}
        mean.update({k: v for k, v in self.mean.items() if k not in other.mean})
        peak = {**self.max, **{k: max(v, self.max.get(k, v)) for k, v in other.max.items()}}
        reasons = self.throttle_reasons + [r for r in other.throttle_reasons if r not in self.throttle_reasons]
        return TelemetrySummary(source=self.source, hz=(self.hz * self.n_samples + other.hz * other.n_samples) / n,
                                n_samples=n, mean=mean, max=peak, throttled=self.throttled or other.throttled,
                                throttle_reasons=reasons)


class HostProfile(Record):
    """py-spy summary for one point: the share of samples in the top functions."""

    flamegraph: Optional[str] = None  # file name next to the profile
    n_samples: int = 0
    top_functions: list[tuple[str, float]] = []  # (function, share of samples)
    process_shares: list[tuple[str, float]] = []  # (process, share of samples): which process is busy
    pids: list[int] = []
    error: Optional[str] = None


class GenSample(Record):
    """One repeat of a generation point."""

    total_s: float
    output_tokens: int
    prefill_s: Optional[float] = None
    decode_s: Optional[float] = None
    decode_step_s: list[float] = []  # each decode step, when the backend can time them
    ttft_s: list[float] = []  # per request (openai backend)
    itl_s: list[float] = []  # inter-token latencies, pooled over requests (openai backend)
    # the overhead probe (hf backend): the same requests through the same network with its matrix
    # widths shrunk (EngineInfo.overhead_probe), run right after this repeat
    probe_prefill_s: Optional[float] = None
    probe_decode_step_s: list[float] = []
    # data parallel: each replica's wall time for its own `concurrency` requests (total_s, prefill
    # and decode are the slowest replica's)
    replica_total_s: list[float] = []


class GenPrediction(Record):
    """What a model predicts at a generation point (a predicted profile holds no samples)."""

    total_s: float  # one batch of `concurrency` requests, prefill and decode
    prefill_s: float
    decode_step_s: float
    total_s_interval: Optional[tuple[float, float]] = None  # at the model's spread level (throughputlab.spread)
    tpot_s: Optional[float] = None  # a served run's time per output token (roofline.served_tpot_s); None before it
    tpot_s_interval: Optional[tuple[float, float]] = None


class TrainPrediction(Record):
    step_s: float  # one micro-step and its optimizer step
    step_s_interval: Optional[tuple[float, float]] = None  # at the model's spread level (throughputlab.spread)


class GenPoint(Record):
    kind: Literal["generation"] = "generation"
    backend: str
    concurrency: PositiveInt
    prompt_len: int
    output_len: int
    status: Status
    error: Optional[str] = None
    samples: list[GenSample] = []
    warmup_runs: int = 0
    remeasured: int = 0
    rounds: int = 1  # visits of the sweep that added `repeats` samples (re-measurements not counted)
    peak_mem_bytes: Optional[int] = None
    telemetry: Optional[TelemetrySummary] = None
    host_profile: Optional[HostProfile] = None
    predicted: Optional[GenPrediction] = None  # predicted profiles: the model's figures, no samples
    layout: Optional[ParallelLayout] = None  # None: one device (older profiles)
    measured_at: str = Field(default_factory=now_iso)

    @property
    def key(self) -> tuple:
        return ("generation", self.backend, self.concurrency, self.prompt_len, self.output_len)

    # ---- derived
    @property
    def tokens_per_s_samples(self) -> list[float]:
        return [s.output_tokens / s.total_s for s in self.samples if s.total_s > 0]

    @property
    def tokens_per_s(self) -> Optional[float]:
        """Median output tokens/s over the whole request (prefill included), like vLLM's benchmark."""
        if not self.samples and self.predicted is not None:
            return self.concurrency * self.output_len / self.predicted.total_s
        return median(self.tokens_per_s_samples)

    @property
    def decode_step_s(self) -> Optional[float]:
        """Median time of one decode step (every sequence emits one token)."""
        if not self.samples and self.predicted is not None:
            return self.predicted.decode_step_s
        steps = [x for s in self.samples for x in s.decode_step_s]
        if steps:
            return median(steps)
        per = [s.decode_s / max(self.output_len - 1, 1) for s in self.samples if s.decode_s is not None]
        return median(per)

    @property
    def decode_tokens_per_s(self) -> Optional[float]:
        t = self.decode_step_s
        return self.concurrency / t if t else None

    @property
    def parallel(self) -> ParallelLayout:
        return self.layout or SINGLE

    @property
    def aggregate_tokens_per_s(self) -> Optional[float]:
        """All engine replicas together (data parallel): every replica's tokens over the slowest one's time."""
        t = self.tokens_per_s
        return None if t is None else t * self.parallel.dp

    @property
    def replica_tokens_per_s(self) -> Optional[list[float]]:
        """Per replica (data parallel), median over samples; None for one engine."""
        rows = [s.replica_total_s for s in self.samples if s.replica_total_s]
        if not rows or len({len(r) for r in rows}) != 1:
            return None
        tokens = self.concurrency * self.output_len
        return [statistics.median(tokens / r[i] for r in rows) for i in range(len(rows[0]))]

    @property
    def prefill_s(self) -> Optional[float]:
        if not self.samples and self.predicted is not None:
            return self.predicted.prefill_s
        return median([s.prefill_s for s in self.samples if s.prefill_s is not None])

    @property
    def cv(self) -> Optional[float]:
        return cv(self.tokens_per_s_samples)

    @property
    def ttft_percentiles_s(self) -> Optional[dict[str, float]]:
        """p50/p90/p99 time to first token over every request of every sample (None if not recorded)."""
        return percentiles([x for s in self.samples for x in s.ttft_s])

    @property
    def itl_percentiles_s(self) -> Optional[dict[str, float]]:
        """p50/p90/p99 inter-token latency over every streamed token gap (None if not recorded)."""
        return percentiles([x for s in self.samples for x in s.itl_s])


def percentiles(xs: list[float], qs: tuple[int, ...] = (50, 90, 99)) -> Optional[dict[str, float]]:
    """Linear-interpolation percentiles (numpy's default), as {"p50": ..., ...}."""
    if not xs:
        return None
    ys = sorted(xs)
    out = {}
    for q in qs:
        pos = (len(ys) - 1) * q / 100
        lo = int(pos)
        hi = min(lo + 1, len(ys) - 1)
        out[f"p{q}"] = ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)
    return out


class TrainSample(Record):
    step_s: float
    forward_s: Optional[float] = None
    backward_s: Optional[float] = None
    optimizer_s: Optional[float] = None


class TrainPoint(Record):
    kind: Literal["training"] = "training"
    backend: str
    micro_batch: PositiveInt
    seq_len: PositiveInt
    status: Status
    error: Optional[str] = None
    samples: list[TrainSample] = []
    warmup_runs: int = 0
    remeasured: int = 0
    rounds: int = 1  # visits of the sweep that added `repeats` samples (re-measurements not counted)
    peak_mem_bytes: Optional[int] = None
    telemetry: Optional[TelemetrySummary] = None
    host_profile: Optional[HostProfile] = None
    effective_lr: Optional[dict[str, float]] = None  # ||dW||/||W|| per parameter group, last step
    predicted: Optional[TrainPrediction] = None  # predicted profiles: the model's figures, no samples
    layout: Optional[ParallelLayout] = None  # None: one device (older profiles)
    measured_at: str = Field(default_factory=now_iso)

    @property
    def parallel(self) -> ParallelLayout:
        return self.layout or SINGLE

    @property
    def key(self) -> tuple:
        return ("training", self.backend, self.micro_batch, self.seq_len)

    @property
    def tokens_per_s_samples(self) -> list[float]:
        return [self.micro_batch * self.seq_len / s.step_s for s in self.samples if s.step_s > 0]

    @property
    def tokens_per_s(self) -> Optional[float]:
        if not self.samples and self.predicted is not None:
            return self.micro_batch * self.seq_len / self.predicted.step_s
        return median(self.tokens_per_s_samples)

    @property
    def step_s(self) -> Optional[float]:
        if not self.samples and self.predicted is not None:
            return self.predicted.step_s
        return median([s.step_s for s in self.samples])

    @property
    def cv(self) -> Optional[float]:
        return cv(self.tokens_per_s_samples)


class EngineInfo(Record):
    """What the generation engine reports about itself (vLLM: KV-cache capacity)."""

    name: str
    version: Optional[str] = None
    kv_cache_tokens: Optional[int] = None
    max_concurrency: Optional[float] = None  # for the sweep's request length (prompt + output)
    max_num_seqs: Optional[int] = None
    engine_args: dict[str, Any] = {}
    overhead_probe: Optional[dict[str, int]] = None  # config overrides of the overhead probe model (hf backend)


class Profile(Record):
    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["measured", "predicted", "imported"] = "measured"  # imported: another tool's benchmark
    model: ModelSpec
    hardware: Hardware
    environment: Environment
    settings: SweepSettings
    spec: Optional[BenchSpec] = None  # the resolved spec of a `bench` run (absent in older profiles)
    engine: Optional[EngineInfo] = None
    generation: list[GenPoint] = []
    training: list[TrainPoint] = []
    fit: Optional[dict[str, Any]] = None  # written by `throughputlab fit` (throughputlab.fit owns its shape)
    notes: list[str] = []

    @property
    def bytes_per_param(self) -> int:
        return dtype_bytes(self.settings.dtype)

    # ---- points
    def add_point(self, point: GenPoint | TrainPoint) -> None:
        """Add or replace (same key) a point."""
        target = self.generation if isinstance(point, GenPoint) else self.training
        for i, p in enumerate(target):
            if p.key == point.key:
                target[i] = point
                return
        target.append(point)

    def find(self, key: tuple) -> Optional[GenPoint | TrainPoint]:
        for p in [*self.generation, *self.training]:
            if p.key == key:
                return p
        return None

    # ---- pandas views (throughputlab.records.profile_frames; pandas is imported when one is asked for)
    def generation_df(self):
        return profile_frames.generation_df(self)

    def training_df(self):
        return profile_frames.training_df(self)

    def samples_df(self):
        """One row per raw sample (generation and training), for your own statistics."""
        return profile_frames.samples_df(self)

    # ---- persistence
    def save(self, path: str | os.PathLike) -> None:
        """Atomic write: the file on disk is always a complete profile."""
        path = Path(path)
        self.environment.updated_at = now_iso()
        try:
            write_atomic(path, self.model_dump_json(indent=1))
        except OSError as e:
            raise UserError(f"cannot write profile {path}: {e.strerror or e}; choose another --output") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Profile":
        path = Path(path)
        if not path.exists():
            raise UserError(f"profile {path} does not exist; check the path, or measure one with "
                            f"`throughputlab bench -o {path}`")
        what = "a throughputlab profile (JSON written by `bench`, `predict` or `import`)"
        text = read_text(path, what, f"profile {path}")
        try:
            raw = json.loads(text)
        except ValueError as e:
            raise UserError(f"profile {path} is not valid JSON ({e.msg}: line {e.lineno}, column {e.colno}): it was "
                            "cut short or edited (bench writes it whole each time); restore a copy, or measure "
                            f"again with `throughputlab bench --force -o {path}`") from None
        if not isinstance(raw, dict):
            raise UserError(f"profile {path} is not a throughputlab profile (expected a JSON object, got "
                            f"{type(raw).__name__}); give the profile JSON that `bench`, `predict` or `import` wrote")
        version = raw.get("schema_version")
        if version != SCHEMA_VERSION:
            if version is None:
                raise UserError(f"profile {path} is not a throughputlab profile (no schema_version): another "
                                "tool's JSON? bring its numbers in with `throughputlab import`")
            raise UserError(f"profile {path} has schema_version {version!r}, this throughputlab reads "
                            f"{SCHEMA_VERSION}: re-measure it or use a matching throughputlab version")
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            raise UserError(f"profile {path} is malformed {first_error(e)}: fix the file or measure again") \
                from None
