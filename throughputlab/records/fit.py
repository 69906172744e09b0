"""The parts of a stored fit (``Profile.fit``): each fitted parameter with its interval, the
fitted and held-out prediction at each point, the utilisation of each point, the peaks the
fit was bounded by, and the fits of generation, prefill, training and memory.
:class:`throughputlab.fit.schema.FitResult` holds them with the fitted throughput model.
"""

from __future__ import annotations

from typing import Literal, Optional

from throughputlab.records.base import Record

FIT_SCHEMA_VERSION = 1
CI_LEVEL = 0.95
PHI_FLOOR_NOTE = "every point is memory-bound: PHI is only bounded from below"  # the note of such a PHI


class ParamEstimate(Record):
    """One fitted parameter with its 95% interval; lo/hi None when the data cannot bound it."""

    name: str
    value: float
    unit: str
    lo: Optional[float] = None
    hi: Optional[float] = None
    identified: bool = True
    note: Optional[str] = None


class PointError(Record):
    """Fitted and held-out prediction at one measured point (x: concurrency or micro-batch)."""

    x: int
    context_len: float  # decode: mean context; prefill: prompt length; training: sequence length
    measured_tokens_per_s: Optional[float] = None
    fitted_tokens_per_s: Optional[float] = None
    loo_tokens_per_s: Optional[float] = None
    loo_rel_error: Optional[float] = None  # (loo - measured) / measured
    measured_s: Optional[float] = None  # the fitted time (decode step, prefill, micro-step)
    fitted_s: Optional[float] = None
    loo_s: Optional[float] = None


class Utilisation(Record):
    """Achieved bandwidth and FLOP/s of one measured point, as fractions of the two kinds of peak."""

    phase: Literal["decode", "prefill", "train"]
    x: int
    context_len: float
    status: str
    time_s: Optional[float] = None
    achieved_bytes_per_s: Optional[float] = None
    achieved_flops_per_s: Optional[float] = None
    mbu_datasheet: Optional[float] = None
    mfu_datasheet: Optional[float] = None
    mbu_microbench: Optional[float] = None
    mfu_microbench: Optional[float] = None


class Peaks(Record):
    dtype: str
    datasheet_device: Optional[str] = None
    datasheet_bytes_per_s: Optional[float] = None
    datasheet_flops_per_s: Optional[float] = None
    datasheet_source: Optional[str] = None
    microbench_bytes_per_s: Optional[float] = None  # the copy benchmark
    microbench_flops_per_s: Optional[float] = None
    microbench_dtype: Optional[str] = None
    microbench_gemv_bytes_per_s: Optional[float] = None  # matrix-vector reads, the decode's access pattern


class GenerationFit(Record):
    target: Literal["decode_step_s", "tokens_per_s"]  # what the decode parameters were fitted to
    form: Literal["max", "smooth", "split"]  # split: the GEMMs and the attention on rooflines of their own
    # the attention terms: fitted (split), or what stands in for them and why they are not fitted
    attention_note: Optional[str] = None
    form_loo_mean_abs_error: dict[str, Optional[float]] = {}  # per candidate form, on tokens/s
    form_loo_decode_step_error: dict[str, Optional[float]] = {}  # per candidate form, on the decode step
    params: list[ParamEstimate]
    # what the data fix where parameters are not identified (t0 + W/BW without the overhead probe)
    combinations: list[ParamEstimate] = []
    context_len: float  # the context at which the knee is stated
    knee_concurrency: Optional[float] = None  # decode step alone
    knee_note: str
    # where BW is not identified, neither is the knee: the concurrencies it lies between for BW from
    # t0 + W/BW with t0 = 0 (the highest knee; None: memory-bound at every concurrency) up to the
    # memory's measured bandwidth (the lowest; None without a micro-benchmark). Both None: identified
    knee_range: Optional[tuple[Optional[float], Optional[float]]] = None
    generation_knee_concurrency: Optional[float] = None  # whole requests, prefill compute included
    generation_knee_note: Optional[str] = None
    n_points: int
    rms_rel_residual: Optional[float] = None  # None for a prediction: nothing was fitted
    points: list[PointError]
    loo_max_abs_error: Optional[float] = None
    # the overhead probe (same network, matrix widths shrunk), fitted jointly when the profile has it
    probe_points: list[PointError] = []
    probe_weight_bytes: Optional[float] = None
    # the engine held requests back past this many at once (fit.admission): recorded, or identified from the curve
    admission_limit: Optional[int] = None
    admission_note: Optional[str] = None
    # what sets the ceiling of the measured sweep: "memory bandwidth", "compute" or "admission: <bound>"
    ceiling: Optional[str] = None


class PrefillFit(Record):
    params: list[ParamEstimate]
    combinations: list[ParamEstimate] = []  # t0 + W/BW of a memory-bound prefill whose BW is not identified
    n_points: int
    points: list[PointError]
    note: Optional[str] = None


class MemoryAtSeqLen(Record):
    """The memory at one measured sequence length: its own line and the fitted m(S) beside it."""

    seq_len: int
    n_points: int
    line_mem0_bytes: Optional[float] = None  # this length's points alone (two micro-batches or more)
    line_mem_per_sample_bytes: Optional[float] = None
    mem_per_sample_bytes: float  # m(S) from the fitted form
    max_micro_batch: Optional[int] = None  # M0 + b*m(S), capped below an OOM at this length or a shorter one
    smallest_oom_micro_batch: Optional[int] = None
    largest_ok_micro_batch: Optional[int] = None
    loo_max_abs_error: Optional[float] = None  # held-out peak memory, this length's points


class MemoryFit(Record):
    mem0_bytes: float
    mem_per_sample_bytes: float
    mem0_ci: Optional[tuple[float, float]] = None
    mem_per_sample_ci: Optional[tuple[float, float]] = None
    device_memory_bytes: Optional[float] = None
    max_micro_batch: Optional[int] = None  # from the memory line, capped below the smallest OOM
    smallest_oom_micro_batch: Optional[int] = None
    largest_ok_micro_batch: Optional[int] = None  # the largest measured micro-batch with status ok
    note: Optional[str] = None
    # several sequence lengths: M(b, S) = M0 + b*m(S), m(S) = m1*S + m2*S^2 (m2 = 0: "linear"); the
    # figures above are at seq_len; None: one length, the line M0 + b*m of that length
    activation_form: Optional[Literal["linear", "quadratic"]] = None
    seq_len: Optional[int] = None
    mem_per_token_bytes: Optional[float] = None  # m1
    mem_per_token_sq_bytes: Optional[float] = None  # m2
    mem_sq_share: float = 0.0  # m2*S^2 / m(S) at seq_len
    form_loo_mean_abs_error: dict[str, Optional[float]] = {}  # per candidate form, on peak memory
    activation_note: Optional[str] = None
    per_seq_len: list[MemoryAtSeqLen] = []


class TrainingFit(Record):
    params: list[ParamEstimate]
    seq_len: int
    n_points: int
    rms_rel_residual: float
    points: list[PointError]
    loo_max_abs_error: Optional[float] = None
    memory: Optional[MemoryFit] = None
    note: Optional[str] = None
    # single: PHI_train for every FLOP; split: the causal attention (S*a/2 per token) at PHI_attn
    form: Literal["single", "split"] = "single"
    attention_note: Optional[str] = None  # fitted, or why not and what stands in for it
    form_loo_mean_abs_error: dict[str, Optional[float]] = {}  # per candidate form, on tokens/s
    seq_lens: list[int] = []
