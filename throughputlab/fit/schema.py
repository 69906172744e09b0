"""What a fit stores in ``Profile.fit``, and reading it back: :class:`FitResult`, the result of
``throughputlab fit`` (and of a prediction), holding the fitted throughput model and the fit's
parts (:mod:`throughputlab.records.fit`); no scipy, so ``predict``, ``report`` and ``decide``
import it on any machine.
"""

from __future__ import annotations

import logging
from typing import Literal, Optional

from throughputlab import roofline as rf
from throughputlab.errors import UserError
from throughputlab.models.spec import spec_from_config
from throughputlab.records.base import Record
from throughputlab.records.fit import (
    FIT_SCHEMA_VERSION,
    PHI_FLOOR_NOTE,
    GenerationFit,
    MemoryFit,
    Peaks,
    PrefillFit,
    TrainingFit,
    Utilisation,
)
from throughputlab.records.peaks import peak_flops
from throughputlab.records.profile import Profile
from throughputlab.roofline import Costs
from throughputlab.throughput import ThroughputModel

log = logging.getLogger(__name__)

DEFAULT_BOOTSTRAP = 200  # `throughputlab fit`, and a fit made now where none is stored (throughputlab.fit.load)
DEFAULT_SEED = 0


class FitResult(Record):
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
    """The model constants of a profile, with the KV-cache dtype its engine recorded (``engine_args``
    kv_cache_dtype: an fp8 cache halves k, as the engine sized it)."""
    args = profile.engine.engine_args if profile.engine else {}
    kv = rf.kv_value_bytes(profile.bytes_per_param, str(args.get("kv_cache_dtype") or "auto"))
    return Costs.from_spec(profile.model, profile.bytes_per_param, kv)


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
