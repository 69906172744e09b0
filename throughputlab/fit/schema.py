"""What a fit stores in ``Profile.fit``, and reading it back: the result schema of ``throughputlab
fit`` (and of a prediction), with no scipy, so ``predict``, ``report`` and ``decide`` import it
on any machine.
"""

from __future__ import annotations

import logging
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict

from throughputlab.errors import UserError
from throughputlab.hardware.peaks import peak_flops
from throughputlab.models.spec import spec_from_config
from throughputlab.profile import Profile
from throughputlab import roofline as rf
from throughputlab.roofline import Costs
from throughputlab.throughput import ThroughputModel

log = logging.getLogger(__name__)

FIT_SCHEMA_VERSION = 1
CI_LEVEL = 0.95
DEFAULT_BOOTSTRAP = 200  # `throughputlab fit` and a report that fits a profile with no stored fit
DEFAULT_SEED = 0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ParamEstimate(_Strict):
    """One fitted parameter with its 95% interval; lo/hi None when the data cannot bound it."""

    name: str
    value: float
    unit: str
    lo: Optional[float] = None
    hi: Optional[float] = None
    identified: bool = True
    note: Optional[str] = None


class PointError(_Strict):
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


class Utilisation(_Strict):
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


class Peaks(_Strict):
    dtype: str
    datasheet_device: Optional[str] = None
    datasheet_bytes_per_s: Optional[float] = None
    datasheet_flops_per_s: Optional[float] = None
    datasheet_source: Optional[str] = None
    microbench_bytes_per_s: Optional[float] = None  # the copy benchmark
    microbench_flops_per_s: Optional[float] = None
    microbench_dtype: Optional[str] = None
    microbench_gemv_bytes_per_s: Optional[float] = None  # matrix-vector reads, the decode's access pattern


class GenerationFit(_Strict):
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


class PrefillFit(_Strict):
    params: list[ParamEstimate]
    combinations: list[ParamEstimate] = []  # t0 + W/BW of a memory-bound prefill whose BW is not identified
    n_points: int
    points: list[PointError]
    note: Optional[str] = None


class MemoryAtSeqLen(_Strict):
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


class MemoryFit(_Strict):
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


class TrainingFit(_Strict):
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


class FitResult(_Strict):
    """What ``throughputlab fit`` stores in ``Profile.fit`` (also the shape of a predicted profile's fit)."""

    schema_version: Literal[1] = FIT_SCHEMA_VERSION
    method: Literal["fit", "analytic", "calibrated"]
    created_at: str
    model: ThroughputModel
    peaks: Peaks
    generation: Optional[GenerationFit] = None
    prefill: Optional[PrefillFit] = None
    training: Optional[TrainingFit] = None
    utilisation: list[Utilisation] = []
    assumptions: list[str] = []  # analytic and calibrated predictions: what was assumed, and from where
    warnings: list[str] = []
    bootstrap_samples: int = 0


# ---------------------------------------------------------------- reading a profile


def costs_of(profile: Profile) -> Costs:
    return Costs.from_spec(profile.model, profile.bytes_per_param)


def probe_costs_of(profile: Profile) -> Optional[Costs]:
    """W, k, F, a of the overhead probe the profile was measured with, or None."""
    overrides = profile.engine.overhead_probe if profile.engine else None
    if not overrides or not profile.model.config:
        return None
    try:
        spec = spec_from_config({**profile.model.config, **overrides}, f"{profile.model.name} (overhead probe)",
                                profile.model.source)
    except UserError:
        return None
    return Costs.from_spec(spec, profile.bytes_per_param)


def engine_devices(profile: Profile) -> int:
    """Devices of the generation engine the profile measured (vLLM's tensor_parallel_size)."""
    args = profile.engine.engine_args if profile.engine else {}
    try:
        return max(int(args.get("tensor_parallel_size", 1) or 1), 1)
    except (TypeError, ValueError):
        return 1


def peaks_of(profile: Profile) -> Peaks:
    hw = profile.hardware
    ds, mb = hw.datasheet, hw.microbench
    return Peaks(
        dtype=profile.settings.dtype,
        datasheet_device=ds.device if ds else None,
        datasheet_bytes_per_s=ds.memory_bandwidth_bytes_per_s if ds else None,
        datasheet_flops_per_s=peak_flops(ds, profile.settings.dtype),
        datasheet_source=ds.source if ds else None,
        microbench_bytes_per_s=mb.copy_bandwidth_bytes_per_s if mb else None,
        microbench_flops_per_s=mb.matmul_flops_per_s if mb else None,
        microbench_dtype=mb.dtype if mb else None,
        microbench_gemv_bytes_per_s=mb.gemv_bandwidth_bytes_per_s if mb else None,
    )


PHI_FLOOR_NOTE = "every point is memory-bound: PHI is only bounded from below"


def phi_is_a_floor(gen: Optional[GenerationFit]) -> bool:
    """Whether the decode fit's PHI is only bounded from below, not identified: every measured
    point was memory-bound, so the knee and the compute-bound rates are floors too."""
    phi = next((e for e in gen.params if e.name == "phi_flops_per_s"), None) if gen is not None else None
    return phi is not None and not phi.identified and PHI_FLOOR_NOTE in (phi.note or "")


def stale_fit_reason(profile: Profile, fit: FitResult) -> Optional[str]:
    """Why a measured profile's stored fit no longer describes its points (a `bench --resume` added
    or finished points after it was made), or None. A predicted profile's fit is its source."""
    if profile.kind == "predicted":
        return None
    gen = [p for p in profile.generation if p.status == "ok" and p.samples]
    train = [p for p in profile.training if p.status == "ok" and p.samples]
    fitted = (fit.generation.n_points if fit.generation else 0, fit.training.n_points if fit.training else 0)
    if (len(gen), len(train)) != fitted:
        return (f"made from {fitted[0]} generation and {fitted[1]} training points; the profile now has "
                f"{len(gen)} and {len(train)}")
    newer = sum(p.measured_at > fit.created_at for p in gen + train)
    if newer:
        return f"{newer} point(s) measured after it"
    return None


def load_fit(profile: Profile) -> Optional[FitResult]:
    """The stored fit of a profile, or None when it has none (or an older, unreadable one).

    The model constants are taken from the profile's own model spec, so a fit stored by an
    earlier version gets the constants it lacked (the total weight bytes), and the measured OOM
    cap travels with the memory line."""
    if not profile.fit:
        return None
    try:
        fit = FitResult.model_validate(profile.fit)
    except Exception as e:  # a fit written by another version: refit rather than fail
        log.info("stored fit is unreadable (%s); refitting", e)
        return None
    stale = stale_fit_reason(profile, fit)
    if stale:
        log.warning("the stored fit is out of date (%s): fitted again now; `throughputlab fit PROFILE` stores it",
                    stale)
        return None
    model = fit.model.model_copy(update={"costs": costs_of(profile)})
    mem = fit.training.memory if fit.training else None
    if model.train is not None and mem is not None and model.train.smallest_oom_micro_batch is None:
        model.train = model.train.model_copy(update={"smallest_oom_micro_batch": mem.smallest_oom_micro_batch})
    if model.train is not None and model.train.seq_len is None and fit.training is not None:
        model.train = model.train.model_copy(update={"seq_len": fit.training.seq_len})
    return fit.model_copy(update={"model": model})


def load_model(profile: Profile) -> ThroughputModel:
    """The ThroughputModel of a profile: its stored fit (or prediction), else a fit made now."""
    stored = load_fit(profile)
    if stored is not None:
        return stored.model
    from throughputlab.fit.run import fit_profile

    return fit_profile(profile, bootstrap=0).model


def memory_statement(mem: MemoryFit, seq_len: Optional[int] = None) -> str:
    """The largest micro-batch from a fitted memory line, beside what the sweep observed; with
    several sequence lengths measured, at ``seq_len`` (default: the fit's reference length)."""
    gib = 2 ** 30
    if mem.activation_form is not None and mem.seq_len:
        return _memory_statement_at(mem, seq_len or mem.seq_len)
    if mem.max_micro_batch is not None:
        text = (f"largest micro-batch that fits: {mem.max_micro_batch} (memory line M0 + b*m within "
                f"{mem.device_memory_bytes / gib:.3g} GiB")
        capped = mem.smallest_oom_micro_batch is not None and mem.max_micro_batch == mem.smallest_oom_micro_batch - 1
        text += f", capped below the OOM at {mem.smallest_oom_micro_batch})" if capped else ")"
    else:
        text = "largest micro-batch that fits: unknown from the memory line" + (f" ({mem.note})" if mem.note else "")
    seen = [f"largest ok {mem.largest_ok_micro_batch}" if mem.largest_ok_micro_batch is not None else None,
            f"smallest OOM {mem.smallest_oom_micro_batch}" if mem.smallest_oom_micro_batch is not None else "no OOM"]
    return text + "; measured: " + ", ".join(x for x in seen if x)


def _memory_statement_at(mem: MemoryFit, seq_len: int) -> str:
    at = next((m for m in mem.per_seq_len if m.seq_len == seq_len), None)
    per = rf.activations_at(mem.mem_per_sample_bytes, seq_len, mem.seq_len, mem.mem_sq_share)
    oom = min((m.smallest_oom_micro_batch for m in mem.per_seq_len if m.seq_len <= seq_len
               and m.smallest_oom_micro_batch is not None), default=None)
    max_b = rf.max_micro_batch(mem.mem0_bytes, per, mem.device_memory_bytes, oom)
    head = f"largest micro-batch that fits at seq len {seq_len}: "
    if max_b is None:
        text = head + "unknown from the memory line" + (f" ({mem.note})" if mem.note else "")
    else:
        text = (head + f"{max_b} (memory M0 + b*m(S), m(S) {mem.activation_form} in S, within "
                f"{mem.device_memory_bytes / 2 ** 30:.3g} GiB" + (f", capped below the OOM at {oom})" if
                                                                   oom is not None and max_b == oom - 1 else ")"))
    if at is None:
        return text + f"; not measured at this length (measured: {', '.join(str(m.seq_len) for m in mem.per_seq_len)})"
    seen = [f"largest ok {at.largest_ok_micro_batch}" if at.largest_ok_micro_batch is not None else None,
            f"smallest OOM {at.smallest_oom_micro_batch}" if at.smallest_oom_micro_batch is not None else "no OOM"]
    return text + f"; measured at {seq_len}: " + ", ".join(x for x in seen if x)


def micro_batch_statement(result: FitResult, seq_len: Optional[int] = None) -> Optional[str]:
    """The one sentence every command prints about the largest micro-batch: the memory line's
    answer, and beside it what the sweep observed (largest ok, smallest OOM), each labelled;
    at ``seq_len`` where the fit has several sequence lengths (default: its reference length)."""
    m = result.model
    if m.train is None:
        return None
    mem = result.training.memory if result.training else None
    if mem is not None:
        return memory_statement(mem, seq_len)
    line = m.max_micro_batch(seq_len)
    if line is None:
        return "largest micro-batch that fits: unknown (no memory line)"
    src = "predicted memory" if result.method != "fit" else "memory line M0 + b*m"
    return f"largest micro-batch that fits: {line} ({src} within {m.train.device_memory_bytes / 2 ** 30:.3g} GiB)"
