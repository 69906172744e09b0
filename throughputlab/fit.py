"""Fitting the throughput model of DESIGN.md to a measured profile; owns the shape of ``Profile.fit``.

Generation: the decode step ``t0 + max((W + c*s*k)/BW, c*(F + s*a)/PHI)`` (or its smooth
maximum, kept only when its leave-one-out error is lower) is fitted to the measured decode
step times, plus a per-sequence cost ``c*t_seq`` fitted jointly with the overhead probe's step
times when the profile has them (hf backend: the same network with its widths shrunk); the
prefill ``t0' + max(W/BW, c*p*(F + p*a/2)/PHI')`` to the prefill times, with BW shared with
decode. When a profile has no step timings (a published curve, an HTTP
engine), the same parameters are fitted to the end-to-end tokens/s instead. Training: the
micro-step line ``t0 + 3*b*S*(F + S*a/2)/PHI_train`` and the memory line ``M0 + b*m``.

Every fit is a ``scipy.optimize.least_squares`` in log-parameter space (so the parameters
stay positive and a factor-of-ten error weighs the same at every scale) with relative (log
ratio) residuals. Intervals come from the Jacobian (and, on request, a bootstrap over the
raw samples); every measured point also gets its leave-one-out prediction error.
No torch: a profile is analysed anywhere.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Literal, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict
from scipy.optimize import least_squares
from scipy.stats import linregress
from scipy.stats import t as student_t

from throughputlab.errors import UserError
from throughputlab.hardware.peaks import peak_flops
from throughputlab.models.spec import spec_from_config
from throughputlab.profile import GenPoint, Profile, TrainPoint, now_iso
from throughputlab.roofline import (
    Costs, DecodeParams, PrefillParams, ThroughputModel, TrainParams, decode_step_s, first_crossing, prefill_s,
    train_step_s,
)

log = logging.getLogger(__name__)

FIT_SCHEMA_VERSION = 1
CI_LEVEL = 0.95


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- result schema


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
    form: Literal["max", "smooth"]
    form_loo_mean_abs_error: dict[str, Optional[float]] = {}  # per candidate form, on tokens/s
    params: list[ParamEstimate]
    context_len: float  # the context at which the knee is stated
    knee_concurrency: Optional[float] = None  # decode step alone (DESIGN.md formula)
    knee_note: str
    generation_knee_concurrency: Optional[float] = None  # whole requests, prefill compute included
    generation_knee_note: Optional[str] = None
    n_points: int
    rms_rel_residual: float
    points: list[PointError]
    loo_max_abs_error: Optional[float] = None
    # the overhead probe (same network, matrix widths shrunk), fitted jointly when the profile has it
    probe_points: list[PointError] = []
    probe_weight_bytes: Optional[float] = None


class PrefillFit(_Strict):
    params: list[ParamEstimate]
    n_points: int
    points: list[PointError]
    note: Optional[str] = None


class MemoryFit(_Strict):
    mem0_bytes: float
    mem_per_sample_bytes: float
    mem0_ci: Optional[tuple[float, float]] = None
    mem_per_sample_ci: Optional[tuple[float, float]] = None
    device_memory_bytes: Optional[float] = None
    max_micro_batch: Optional[int] = None
    smallest_oom_micro_batch: Optional[int] = None
    note: Optional[str] = None


class TrainingFit(_Strict):
    params: list[ParamEstimate]
    seq_len: int
    n_points: int
    rms_rel_residual: float
    points: list[PointError]
    loo_max_abs_error: Optional[float] = None
    memory: Optional[MemoryFit] = None
    note: Optional[str] = None


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


# ---------------------------------------------------------------- public entry points


def load_fit(profile: Profile) -> Optional[FitResult]:
    """The stored fit of a profile, or None when it has none (or an older, unreadable one)."""
    if not profile.fit:
        return None
    try:
        return FitResult.model_validate(profile.fit)
    except Exception as e:  # a fit written by another version: refit rather than fail
        log.info("stored fit is unreadable (%s); refitting", e)
        return None


def load_model(profile: Profile) -> ThroughputModel:
    """The ThroughputModel of a profile: its stored fit (or prediction), else a fit made now."""
    stored = load_fit(profile)
    if stored is not None:
        return stored.model
    return fit_profile(profile).model


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


def fit_profile(profile: Profile, *, bootstrap: int = 0, seed: int = 0) -> FitResult:
    """Fit every part the profile has measured. ``bootstrap`` > 0 adds percentile intervals
    from refits on raw samples resampled within each point (Jacobian intervals otherwise)."""
    if profile.kind == "predicted":
        raise UserError("this profile is a prediction, not a measurement: there is nothing to fit "
                        "(pass a profile written by `throughputlab bench`)")
    costs = costs_of(profile)
    peaks = peaks_of(profile)
    warnings: list[str] = []
    gen_pts = [p for p in profile.generation if p.status == "ok" and p.samples]
    train_pts = [p for p in profile.training if p.status == "ok" and p.samples]
    if not gen_pts and not train_pts:
        raise UserError("the profile has no successful points to fit: re-run `throughputlab bench` "
                        "(points with status oom/error/skipped are not fitted)")
    skipped = len(profile.generation) + len(profile.training) - len(gen_pts) - len(train_pts)
    if skipped:
        warnings.append(f"{skipped} point(s) without status ok were left out of the fit")

    rng = np.random.default_rng(seed)
    gen = pre = None
    dec_params = pre_params = None
    overhead = 0.0
    if gen_pts:
        gen, dec_params, pre, pre_params, overhead = _fit_generation(gen_pts, costs, peaks, warnings, bootstrap, rng,
                                                                     probe_costs_of(profile))
    tr = tr_params = None
    if train_pts:
        tr, tr_params = _fit_training(profile, train_pts, costs, peaks, warnings, bootstrap, rng)

    engine = profile.engine
    model = ThroughputModel(
        source="fit", costs=costs, decode=dec_params, prefill=pre_params, train=tr_params,
        kv_cache_tokens=engine.kv_cache_tokens if engine else None,
        max_num_seqs=engine.max_num_seqs if engine else None, gen_overhead_s=overhead,
    )
    if gen is not None:
        c_top = max(p.concurrency for p in gen_pts)
        gen.knee_concurrency, gen.knee_note = knee_statement(model, gen.context_len, c_top)
        ref = max(gen_pts, key=lambda p: p.concurrency)
        gen.generation_knee_concurrency, gen.generation_knee_note = generation_knee_statement(
            model, ref.prompt_len, ref.output_len, c_top)
    return FitResult(
        method="fit", created_at=now_iso(), model=model, peaks=peaks, generation=gen, prefill=pre, training=tr,
        utilisation=utilisation(profile, costs, peaks), warnings=warnings, bootstrap_samples=bootstrap,
    )


def knee_statement(model: ThroughputModel, s: float, c_measured_max: Optional[float] = None) -> tuple[Optional[float], str]:
    """The knee concurrency at context ``s`` and one sentence saying what it means."""
    c = model.knee(s)
    if c is None:
        return None, (f"decode stays memory-bound at every concurrency at context {s:.0f}: "
                      "KV-cache reads grow as fast as the arithmetic")
    note = f"knee at concurrency {c:.3g} (context {s:.0f}): memory-bound below, compute-bound above"
    if c_measured_max is not None and c > c_measured_max:
        note += f"; beyond the largest measured concurrency ({c_measured_max:g}), so extrapolated"
    return c, note


def generation_knee(model: ThroughputModel, prompt_len: float, output_len: int) -> Optional[float]:
    """Where a whole batch of requests turns compute-bound: the memory time of its prefill and
    decode steps equals their compute time, prefill FLOPs included (they share the device with
    decode, so a long prompt moves the bend of the tokens/s curve below the decode knee)."""
    d = model.decode
    pre = model.prefill
    k = model.costs
    s = prompt_len + output_len / 2
    steps = max(output_len - 1, 0)
    phi_pre = pre.phi_flops_per_s if pre else d.phi_flops_per_s

    def gap(c: float) -> float:
        mem = (steps * (k.weight_bytes_for(c) + c * s * k.kv_bytes_per_token) + k.weight_bytes_for(c * prompt_len)) \
            / d.bw_bytes_per_s
        comp = c * steps * (k.flops_per_token + s * k.attn_flops_per_ctx_token) / d.phi_flops_per_s \
            + c * prompt_len * (k.flops_per_token + prompt_len * k.attn_flops_per_ctx_token / 2) / phi_pre
        return comp - mem

    return first_crossing(gap, 1e-3, 1e8)


def generation_knee_statement(model: ThroughputModel, prompt_len: float, output_len: int,
                              c_measured_max: Optional[float] = None) -> tuple[Optional[float], str]:
    c = generation_knee(model, prompt_len, output_len)
    if c is None:
        return None, f"whole requests (prompt {prompt_len:g}, output {output_len}) stay memory-bound at every concurrency"
    note = (f"end-to-end knee at concurrency {c:.3g} for prompt {prompt_len:g} + output {output_len} "
            "(prefill compute included)")
    if c_measured_max is not None and c > c_measured_max:
        note += "; beyond the measured range"
    return c, note


# ---------------------------------------------------------------- peaks and utilisation


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


def _frac(x: Optional[float], peak: Optional[float]) -> Optional[float]:
    return x / peak if x is not None and peak else None


def _util(phase, x, ctx, status, t, nbytes, flops, peaks: Peaks) -> Utilisation:
    bps = nbytes / t if (t and nbytes is not None) else None
    fps = flops / t if (t and flops is not None) else None
    return Utilisation(
        phase=phase, x=x, context_len=ctx, status=status, time_s=t, achieved_bytes_per_s=bps, achieved_flops_per_s=fps,
        mbu_datasheet=_frac(bps, peaks.datasheet_bytes_per_s), mfu_datasheet=_frac(fps, peaks.datasheet_flops_per_s),
        mbu_microbench=_frac(bps, peaks.microbench_bytes_per_s), mfu_microbench=_frac(fps, peaks.microbench_flops_per_s),
    )


def decode_bytes_flops(costs: Costs, c: float, s: float) -> tuple[float, float]:
    """Bytes read and FLOPs done by one decode step of c sequences at context s (DESIGN.md)."""
    return (costs.weight_bytes_for(c) + c * s * costs.kv_bytes_per_token,
            c * (costs.flops_per_token + s * costs.attn_flops_per_ctx_token))


def prefill_bytes_flops(costs: Costs, c: float, p: float) -> tuple[float, float]:
    return (costs.weight_bytes_for(c * p) + c * p * costs.kv_bytes_per_token,
            c * p * (costs.flops_per_token + p * costs.attn_flops_per_ctx_token / 2))


def train_flops(costs: Costs, b: float, seq_len: float) -> float:
    """Forward + backward ~ 3x the forward FLOPs (Kaplan et al. 2020; nanoGPT estimate_mfu)."""
    return 3.0 * b * seq_len * (costs.flops_per_token + seq_len * costs.attn_flops_per_ctx_token / 2)


def utilisation(profile: Profile, costs: Costs, peaks: Peaks) -> list[Utilisation]:
    """MBU and MFU of every point (failed points listed with their status and no figures)."""
    out: list[Utilisation] = []
    for p in profile.generation:
        s = p.prompt_len + p.output_len / 2
        t = p.decode_step_s if p.status == "ok" else None
        b, f = decode_bytes_flops(costs, p.concurrency, s)
        out.append(_util("decode", p.concurrency, s, p.status, t, b, f, peaks))
        tp = p.prefill_s if p.status == "ok" else None
        if tp:
            b, f = prefill_bytes_flops(costs, p.concurrency, p.prompt_len)
            out.append(_util("prefill", p.concurrency, p.prompt_len, p.status, tp, b, f, peaks))
    for p in profile.training:
        t = p.step_s if p.status == "ok" else None
        out.append(_util("train", p.micro_batch, p.seq_len, p.status, t, None, train_flops(costs, p.micro_batch, p.seq_len),
                         peaks))
    return out


# ---------------------------------------------------------------- generic log-space least squares


@dataclass
class _LSQ:
    x: np.ndarray  # log parameters
    cost: float
    residuals: np.ndarray
    jac: np.ndarray
    at_bound: np.ndarray


def _solve(resid: Callable[[np.ndarray], np.ndarray], starts: Sequence[np.ndarray], lo: np.ndarray,
           hi: np.ndarray) -> _LSQ:
    """Best of several least_squares runs (the hard max has a kink where local searches can stall)."""
    best = None
    for x0 in starts:
        x0 = np.clip(np.asarray(x0, float), lo + 1e-9, hi - 1e-9)
        try:
            r = least_squares(resid, x0, bounds=(lo, hi), method="trf", x_scale=1.0, diff_step=1e-6,
                              ftol=1e-12, xtol=1e-12, gtol=1e-12, max_nfev=2000)
        except (ValueError, FloatingPointError) as e:
            log.debug("least_squares start %s failed: %s", x0, e)
            continue
        if best is None or r.cost < best.cost - 1e-15:
            best = r
    if best is None:
        raise UserError("the fit did not converge from any starting point: check the profile's points "
                        "(times must be positive and grow with load)")
    span = hi - lo
    at_bound = (np.abs(best.x - lo) < 1e-4 * span) | (np.abs(best.x - hi) < 1e-4 * span)
    return _LSQ(best.x, float(best.cost), best.fun, best.jac, at_bound)


def _jacobian_ci(sol: _LSQ) -> list[tuple[Optional[float], Optional[float], bool]]:
    """95% intervals of exp(x) from the Jacobian: cov = s^2 (J'J)^-1 in log space, Student t quantile.

    Directions the data do not constrain (near-zero singular values of J) make every parameter
    that loads on them "not identified", instead of the zero variance a pseudo-inverse would give."""
    n, k = sol.jac.shape
    dof = n - k
    if dof <= 0 or not np.all(np.isfinite(sol.jac)):
        return [(None, None, False) for _ in range(k)]
    _, sv, vt = np.linalg.svd(sol.jac, full_matrices=False)
    keep = sv > 1e-8 * max(sv.max(), 1e-300)
    loose = np.zeros(k, bool)
    for j in np.flatnonzero(~keep):
        loose |= np.abs(vt[j]) > 0.05
    s2 = float(np.sum(sol.residuals ** 2)) / dof
    cov = (vt[keep].T / sv[keep] ** 2) @ vt[keep] * s2
    q = float(student_t.ppf(0.5 + CI_LEVEL / 2, dof))
    out: list[tuple[Optional[float], Optional[float], bool]] = []
    for i in range(k):
        var = cov[i, i]
        half = q * math.sqrt(var) if var >= 0 else math.inf
        if loose[i] or sol.at_bound[i] or not math.isfinite(half) or half > 20:  # e^20: not a bound worth printing
            out.append((None, None, False))
            continue
        out.append((math.exp(sol.x[i] - half), math.exp(sol.x[i] + half), True))
    return out


def _percentile_ci(draws: np.ndarray) -> list[tuple[float, float]]:
    lo = np.percentile(draws, 100 * (1 - CI_LEVEL) / 2, axis=0)
    hi = np.percentile(draws, 100 * (1 + CI_LEVEL) / 2, axis=0)
    return [(float(a), float(b)) for a, b in zip(lo, hi)]


def _estimates(names, units, sol: _LSQ, boot: Optional[np.ndarray], notes: dict[str, str]) -> list[ParamEstimate]:
    ci = _jacobian_ci(sol)
    bci = _percentile_ci(boot) if boot is not None and len(boot) >= 10 else None
    out = []
    for i, (name, unit) in enumerate(zip(names, units)):
        lo, hi, ident = ci[i]
        if bci is not None and ident:
            lo, hi = bci[i]
        note = notes.get(name)
        if sol.at_bound[i]:
            note = (note + "; " if note else "") + "at the bound of its search range"
        out.append(ParamEstimate(name=name, value=float(math.exp(sol.x[i])), unit=unit, lo=lo, hi=hi,
                                 identified=ident, note=note))
    return out


# ---------------------------------------------------------------- generation


@dataclass
class GenObs:
    """One generation point reduced to what the fit uses (medians over its raw samples)."""

    c: int
    p: int
    o: int
    tokens_per_s: float
    total_s: float  # one batch of c requests, as the tokens/s implies
    decode_step_s: Optional[float]
    prefill_s: Optional[float]
    overhead_s: Optional[float]  # total - prefill - decode, when the backend splits them
    point: Optional[GenPoint] = field(default=None, repr=False)
    probe_step_s: Optional[float] = None  # the overhead probe's mean decode step (hf backend)

    @property
    def s(self) -> float:
        return self.p + self.o / 2


def _mean_step_s(p: GenPoint) -> Optional[float]:
    """Median over repeats of each repeat's mean decode step: what its tokens/s is made of (a
    stalled step counts as in the wall time), yet one bad repeat does not move it."""
    per = [s.decode_s / max(p.output_len - 1, 1) for s in p.samples if s.decode_s]
    return statistics.median(per) if per else p.decode_step_s


def _probe_step_s(p: GenPoint) -> Optional[float]:
    per = [statistics.fmean(s.probe_decode_step_s) for s in p.samples if s.probe_decode_step_s]
    return statistics.median(per) if per and len(per) == len(p.samples) else None


def gen_obs(p: GenPoint) -> GenObs:
    tps = p.tokens_per_s
    split = [s.total_s - s.prefill_s - s.decode_s for s in p.samples
             if s.prefill_s is not None and s.decode_s is not None]
    return GenObs(c=p.concurrency, p=p.prompt_len, o=p.output_len, tokens_per_s=tps,
                  total_s=p.concurrency * p.output_len / tps, decode_step_s=_mean_step_s(p),
                  prefill_s=p.prefill_s, overhead_s=statistics.median(split) if split else None, point=p,
                  probe_step_s=_probe_step_s(p))


def _resampled(p: GenPoint, rng: np.random.Generator) -> GenObs:
    idx = rng.integers(0, len(p.samples), len(p.samples))
    return gen_obs(p.model_copy(update={"samples": [p.samples[i] for i in idx]}))


def _bounds(peak_bw: Optional[float], peak_phi: Optional[float], t_scale: float):
    """Log-space search ranges: wide, but never above a datasheet peak (physically impossible)."""
    bw_hi = peak_bw if peak_bw else 1e15
    phi_hi = peak_phi if peak_phi else 1e18
    lo = np.log([1e-9, 1e6, 1e6])
    hi = np.log([max(t_scale, 1e-6) * 10, bw_hi, phi_hi])
    return lo, hi


MICROBENCH_HEADROOM = 10.0  # caches and read-only traffic can beat a copy benchmark, but not tenfold


def _gen_ceilings(peaks: Peaks) -> tuple[Optional[float], Optional[float]]:
    """Upper ends of the search: the datasheet peak (cannot be exceeded), else 10x the micro-benchmark."""
    bw = peaks.datasheet_bytes_per_s or (MICROBENCH_HEADROOM * peaks.microbench_bytes_per_s
                                         if peaks.microbench_bytes_per_s else None)
    phi = peaks.datasheet_flops_per_s or (MICROBENCH_HEADROOM * peaks.microbench_flops_per_s
                                          if peaks.microbench_flops_per_s else None)
    return bw, phi


@dataclass
class _GenSpec:
    """Everything fixed while fitting generation points (costs, form, target, bounds).

    With ``probe_costs`` (the overhead probe's W and F) the probe's step times are fitted
    jointly with the model's: same t0, per-sequence cost, BW and PHI, different W and F.
    Parameter vector (log): t0, BW, PHI, then t_seq with a probe, then p for the smooth form.
    """

    costs: Costs
    form: str
    target: str
    lo: np.ndarray
    hi: np.ndarray
    probe_costs: Optional[Costs] = None

    def unpack(self, x: np.ndarray) -> tuple[float, float, float, Optional[float], float]:
        v = [float(z) for z in np.exp(x)]
        i = 3
        t_seq = 0.0
        if self.probe_costs is not None:
            t_seq, i = v[3], 4
        p = v[i] if self.form == "smooth" else None
        return v[0], v[1], v[2], p, t_seq


def _decode_residuals(spec: _GenSpec, obs: list[GenObs]) -> Callable[[np.ndarray], np.ndarray]:
    costs = spec.costs
    probe = spec.probe_costs if spec.target == "decode_step_s" else None

    def f(x: np.ndarray) -> np.ndarray:
        t0, bw, phi, p, ts = spec.unpack(x)
        r = []
        for o in obs:
            td = decode_step_s(o.c, o.s, costs, t0, bw, phi, p, ts)
            if spec.target == "decode_step_s":
                r.append(math.log(td / o.decode_step_s))
            else:  # end-to-end: prefill with the same parameters, then o-1 decode steps
                tot = prefill_s(o.c, o.p, costs, t0, bw, phi, p) + max(o.o - 1, 0) * td
                r.append(math.log(tot / o.total_s))
        if probe is not None:
            for o in obs:
                r.append(math.log(decode_step_s(o.c, o.s, probe, t0, bw, phi, p, ts) / o.probe_step_s))
        return np.array(r)

    return f


def _decode_starts(spec: _GenSpec, obs: list[GenObs]) -> list[np.ndarray]:
    costs = spec.costs
    small = min(obs, key=lambda o: o.c)
    large = max(obs, key=lambda o: o.c)
    t_small = small.decode_step_s if spec.target == "decode_step_s" else small.total_s / max(small.o, 1)
    t_large = large.decode_step_s if spec.target == "decode_step_s" else large.total_s / max(large.o, 1)
    mem_b, _ = decode_bytes_flops(costs, small.c, small.s)
    _, comp_f = decode_bytes_flops(costs, large.c, large.s)
    starts = []
    if spec.probe_costs is not None and spec.target == "decode_step_s":
        # the probe measures the non-weight part of each step: start from the differences
        ps, pl = small.probe_step_s, large.probe_step_s
        t_seq = max((pl - ps) / max(large.c - small.c, 1), 1e-7)
        for t0_frac in (0.5, 0.9):
            for bw_mult in (0.5, 1.0, 2.0):
                for phi_mult in (1.0, 3.0):
                    t0 = max(t0_frac * ps, 1e-7)
                    bw = bw_mult * mem_b / max(t_small - ps, 0.1 * t_small)
                    phi = phi_mult * comp_f / max(t_large - pl, 0.1 * t_large)
                    x = [math.log(t0), math.log(bw), math.log(phi), math.log(t_seq)]
                    if spec.form == "smooth":
                        x.append(math.log(2.0))
                    starts.append(np.array(x))
        return starts
    for t0_frac in (0.02, 0.3, 0.6):
        for bw_mult in (1.0, 3.0):
            for phi_mult in (1.0, 4.0):
                t0 = t0_frac * t_small
                bw = bw_mult * mem_b / max(t_small * (1 - t0_frac), 1e-12)
                phi = phi_mult * comp_f / max(t_large - t0, 1e-12)
                x = [math.log(t0), math.log(bw), math.log(phi)]
                if spec.form == "smooth":
                    x.append(math.log(4.0))
                starts.append(np.array(x))
    return starts


def _fit_decode(spec: _GenSpec, obs: list[GenObs], starts=None) -> _LSQ:
    return _solve(_decode_residuals(spec, obs), starts or _decode_starts(spec, obs), spec.lo, spec.hi)


def _fit_prefill(costs: Costs, obs: list[GenObs], bw: float, phi_hi: Optional[float]) -> Optional[_LSQ]:
    """t0' and PHI' of the prefill, with BW taken from decode (prefill barely constrains it)."""
    pts = [o for o in obs if o.prefill_s]
    if len(pts) < 2:
        return None

    def f(x: np.ndarray) -> np.ndarray:
        t0, phi = np.exp(x)
        return np.array([math.log(prefill_s(o.c, o.p, costs, t0, bw, phi) / o.prefill_s) for o in pts])

    big = max(pts, key=lambda o: o.c * o.p)
    _, fl = prefill_bytes_flops(costs, big.c, big.p)
    tmin = min(o.prefill_s for o in pts)
    lo = np.log([1e-9, 1e6])
    hi = np.log([tmin * 10, phi_hi or 1e18])
    starts = [np.log([tmin * fr, fl / big.prefill_s * m]) for fr in (0.02, 0.3) for m in (1.0, 3.0)]
    return _solve(f, starts, lo, hi)


def _predict_gen_tps(costs: Costs, dec: tuple, pre: Optional[tuple], overhead: float, o: GenObs) -> float:
    """End-to-end tokens/s of point o: overhead + prefill + (o-1) decode steps at mean context."""
    t0, bw, phi, p, ts = dec
    td = decode_step_s(o.c, o.s, costs, t0, bw, phi, p, ts)
    if pre is not None:
        tp = prefill_s(o.c, o.p, costs, pre[0], bw, pre[1])
    else:
        tp = prefill_s(o.c, o.p, costs, t0, bw, phi, p)
    return o.c * o.o / (overhead + tp + max(o.o - 1, 0) * td)


def _gen_fit_all(spec: _GenSpec, obs: list[GenObs], phi_hi, starts=None):
    """Decode (+ prefill + overhead when the target is step times) fitted to ``obs``."""
    sol = _fit_decode(spec, obs, starts)
    dec = spec.unpack(sol.x)
    pre = None
    overhead = 0.0
    psol = None
    if spec.target == "decode_step_s":
        psol = _fit_prefill(spec.costs, obs, dec[1], phi_hi)
        if psol is not None:
            pre = tuple(float(v) for v in np.exp(psol.x))
        ov = [o.overhead_s for o in obs if o.overhead_s is not None]
        overhead = max(statistics.median(ov), 0.0) if ov else 0.0
    return sol, dec, psol, pre, overhead


def _fit_generation(points: list[GenPoint], costs: Costs, peaks: Peaks, warnings: list[str], bootstrap: int,
                    rng: np.random.Generator, probe_costs: Optional[Costs] = None):
    obs = [gen_obs(p) for p in points]
    has_steps = all(o.decode_step_s for o in obs)
    if probe_costs is not None and not (has_steps and all(o.probe_step_s for o in obs)):
        if any(o.probe_step_s for o in obs):
            warnings.append("the overhead probe is missing at some points: fitted without it (t0 and BW may not "
                            "be separately identified)")
        probe_costs = None
    target = "decode_step_s" if has_steps else "tokens_per_s"
    if not has_steps:
        warnings.append("no decode step timings in the profile: the decode parameters were fitted to end-to-end "
                        "tokens/s, with the prefill sharing them")
    bw_hi, phi_hi = _gen_ceilings(peaks)
    t_scale = max(o.total_s for o in obs)
    lo3, hi3 = _bounds(bw_hi, phi_hi, t_scale)
    n = len(obs)
    forms = ["max", "smooth"] if n >= 6 else ["max"]
    if n < 4:
        warnings.append(f"only {n} generation point(s): the decode fit is under-determined "
                        "(measure at least 4 concurrencies, spanning the knee)")

    if probe_costs is not None:  # the per-sequence cost t_seq, between 1 ns and the longest step
        lo3, hi3 = np.append(lo3, math.log(1e-9)), np.append(hi3, math.log(max(o.decode_step_s for o in obs)))
    candidates = {}
    for form in forms:
        lo, hi = lo3, hi3
        if form == "smooth":
            lo, hi = np.append(lo3, math.log(1.0)), np.append(hi3, math.log(64.0))
        spec = _GenSpec(costs, form, target, lo, hi, probe_costs)
        full = _gen_fit_all(spec, obs, phi_hi)
        loo = _gen_loo(spec, obs, phi_hi, full[0].x)
        errs = [abs(e) for e in loo if e is not None]
        candidates[form] = (spec, full, loo, statistics.fmean(errs) if errs else None)

    # The smooth maximum has one more parameter: keep it only when it predicts held-out points
    # clearly better (10% lower mean error) and is not just the hard max again (p at its upper
    # bound). p = 1, its lower bound, is the sum of the two terms: memory and compute not overlapped.
    chosen = "max"
    if "smooth" in candidates:
        sm, mx = candidates["smooth"], candidates["max"]
        p_hard = abs(sm[1][0].x[-1] - sm[0].hi[-1]) < 1e-4 * (sm[0].hi[-1] - sm[0].lo[-1])
        if sm[3] is not None and mx[3] is not None and sm[3] < 0.9 * mx[3] and not p_hard:
            chosen = "smooth"
    spec, (sol, dec, psol, pre, overhead), loo, _ = candidates[chosen]

    boot = pboot = None
    if bootstrap > 0:
        draws, pdraws = [], []
        for _ in range(bootstrap):
            bobs = [_resampled(o.point, rng) for o in obs]
            try:
                bsol, _, bpsol, _, _ = _gen_fit_all(spec, bobs, phi_hi, starts=[sol.x])
            except UserError:
                continue
            draws.append(np.exp(bsol.x))
            if bpsol is not None:
                pdraws.append(np.exp(bpsol.x))
        boot = np.array(draws) if draws else None
        pboot = np.array(pdraws) if pdraws else None

    probe = spec.probe_costs is not None
    names = (["t0_s", "bw_bytes_per_s", "phi_flops_per_s"] + (["t_seq_s"] if probe else [])
             + (["smooth_p"] if chosen == "smooth" else []))
    units = ["s", "B/s", "FLOP/s"] + (["s"] if probe else []) + ([""] if chosen == "smooth" else [])
    notes = {}
    t0, bw, phi, p, ts = dec
    if chosen == "smooth" and p is not None and p < 1.0 + 1e-3:
        notes["smooth_p"] = "at 1: memory and compute time add up (no overlap)"
    mem_any = any(_mem_bound(costs, o, dec) for o in obs)
    comp_any = any(not _mem_bound(costs, o, dec) for o in obs)
    if not comp_any and target == "decode_step_s":  # end to end, PHI is also seen through the prefill
        notes["phi_flops_per_s"] = "every point is memory-bound: PHI is only bounded from below"
    if not mem_any:
        notes["bw_bytes_per_s"] = "every point is compute-bound: BW is only bounded from below"
    params = _estimates(names, units, sol, boot, notes)

    pts = []
    for o, e in zip(obs, loo):
        fitted = _predict_gen_tps(costs, dec, pre, overhead, o)
        ts_fit = decode_step_s(o.c, o.s, costs, t0, bw, phi, p, ts)
        pts.append(PointError(
            x=o.c, context_len=o.s, measured_tokens_per_s=o.tokens_per_s, fitted_tokens_per_s=fitted,
            loo_tokens_per_s=None if e is None else o.tokens_per_s * (1 + e), loo_rel_error=e,
            measured_s=o.decode_step_s, fitted_s=ts_fit,
        ))
    probe_pts = []
    if probe:
        for o in obs:
            probe_pts.append(PointError(x=o.c, context_len=o.s, measured_s=o.probe_step_s,
                                        fitted_s=decode_step_s(o.c, o.s, spec.probe_costs, t0, bw, phi, p, ts)))
    loo_errs = [abs(e) for e in loo if e is not None]
    gen = GenerationFit(
        target=target, form=chosen, form_loo_mean_abs_error={k: v[3] for k, v in candidates.items()}, params=params,
        context_len=statistics.median(o.s for o in obs), knee_note="", n_points=n,
        rms_rel_residual=float(math.sqrt(np.mean(sol.residuals ** 2))), points=pts,
        loo_max_abs_error=max(loo_errs) if loo_errs else None, probe_points=probe_pts,
        probe_weight_bytes=spec.probe_costs.weight_bytes if probe else None,
    )
    dec_params = DecodeParams(t0_s=t0, bw_bytes_per_s=bw, phi_flops_per_s=phi, smooth_p=p, t_seq_s=ts)

    pre_fit = pre_params = None
    if psol is not None and pre is not None:
        pre_params = PrefillParams(t0_s=pre[0], bw_bytes_per_s=bw, phi_flops_per_s=pre[1])
        ppts = []
        ploo = _prefill_loo(costs, obs, bw, phi_hi)
        for o in obs:
            if not o.prefill_s:
                continue
            fit_t = prefill_s(o.c, o.p, costs, pre[0], bw, pre[1])
            lt = ploo.get(o.c, None)
            ppts.append(PointError(x=o.c, context_len=o.p, measured_s=o.prefill_s, fitted_s=fit_t, loo_s=lt,
                                   loo_rel_error=None if lt is None else lt / o.prefill_s - 1))
        pre_fit = PrefillFit(
            params=_estimates(["t0_s", "phi_flops_per_s"], ["s", "FLOP/s"], psol, pboot, {}), n_points=len(ppts),
            points=ppts, note="bandwidth shared with the decode fit",
        )
    elif target == "decode_step_s":
        warnings.append("fewer than 2 prefill timings: prefill uses the decode parameters")
    return gen, dec_params, pre_fit, pre_params, overhead


def _mem_bound(costs: Costs, o: GenObs, dec: tuple) -> bool:
    _, bw, phi, _, _ = dec
    b, f = decode_bytes_flops(costs, o.c, o.s)
    return b / bw >= f / phi


def _gen_loo(spec: _GenSpec, obs: list[GenObs], phi_hi, x_full) -> list[Optional[float]]:
    """Leave-one-out relative error of end-to-end tokens/s at every point (None when too few points)."""
    k = len(spec.lo)
    if len(obs) - 1 < k:
        return [None] * len(obs)
    out: list[Optional[float]] = []
    for i, o in enumerate(obs):
        rest = obs[:i] + obs[i + 1:]
        starts = [x_full] + _decode_starts(spec, rest)[::4]  # the full fit is a near-optimal start
        _, dec, _, pre, overhead = _gen_fit_all(spec, rest, phi_hi, starts=starts)
        out.append(_predict_gen_tps(spec.costs, dec, pre, overhead, o) / o.tokens_per_s - 1)
    return out


def _prefill_loo(costs: Costs, obs: list[GenObs], bw: float, phi_hi) -> dict[int, float]:
    pts = [o for o in obs if o.prefill_s]
    out = {}
    if len(pts) < 3:
        return out
    for i, o in enumerate(pts):
        sol = _fit_prefill(costs, pts[:i] + pts[i + 1:], bw, phi_hi)
        if sol is not None:
            t0, phi = np.exp(sol.x)
            out[o.c] = prefill_s(o.c, o.p, costs, float(t0), bw, float(phi))
    return out


# ---------------------------------------------------------------- training


@dataclass
class TrainObs:
    b: int
    seq_len: int
    step_s: float  # what the line is fitted to: median forward + backward, plus the optimizer's median
    point: Optional[TrainPoint] = field(default=None, repr=False)
    measured_step_s: Optional[float] = None  # the point's own median micro-step (optimizer included)


def _train_obs(p: TrainPoint, samples, opt_s: float) -> TrainObs:
    """The optimizer step costs the same at every micro-batch, so its median over the whole sweep
    replaces each point's own (one noise source fewer); the forward and backward stay the point's."""
    compute = [s.forward_s + s.backward_s for s in samples if s.forward_s is not None and s.backward_s is not None]
    total = statistics.median(s.step_s for s in samples)
    fitted = statistics.median(compute) + opt_s if len(compute) == len(samples) and opt_s else total
    return TrainObs(p.micro_batch, p.seq_len, fitted, p, total)


def _fit_train_line(costs: Costs, obs: list[TrainObs], opt_s: float, phi_hi: Optional[float], starts=None,
                    extra_start=None) -> _LSQ:
    def f(x: np.ndarray) -> np.ndarray:
        t0, phi = np.exp(x)
        return np.array([math.log((train_step_s(o.b, o.seq_len, costs, t0, phi) + opt_s) / o.step_s) for o in obs])

    big = max(obs, key=lambda o: o.b * o.seq_len)
    small = min(obs, key=lambda o: o.b * o.seq_len)
    # two-point line through the smallest and largest micro-batch gives the natural start
    fl_big, fl_small = train_flops(costs, big.b, big.seq_len), train_flops(costs, small.b, small.seq_len)
    if big.step_s > small.step_s and fl_big > fl_small:
        phi0 = (fl_big - fl_small) / (big.step_s - small.step_s)
    else:
        phi0 = fl_big / big.step_s
    t00 = max(small.step_s - opt_s - fl_small / phi0, 0.01 * small.step_s)
    lo = np.log([1e-9, 1e6])
    hi = np.log([max(o.step_s for o in obs) * 10, phi_hi or 1e18])
    s = starts or [np.log([t00, phi0]), np.log([0.1 * small.step_s, fl_big / big.step_s]),
                   np.log([0.5 * small.step_s, 2 * phi0])]
    if extra_start is not None:
        s = [extra_start, *s]
    return _solve(f, s, lo, hi)


def _fit_training(profile: Profile, points: list[TrainPoint], costs: Costs, peaks: Peaks, warnings: list[str],
                  bootstrap: int, rng: np.random.Generator):
    opt = [s.optimizer_s for p in points for s in p.samples if s.optimizer_s is not None]
    opt_s = statistics.median(opt) if opt else 0.0
    obs = [_train_obs(p, p.samples, opt_s) for p in points]
    note = None if opt else "no separate optimizer timing: the fixed cost t0 includes the optimizer step"
    phi_hi = _gen_ceilings(peaks)[1]
    sol = _fit_train_line(costs, obs, opt_s, phi_hi)
    t0, phi = (float(v) for v in np.exp(sol.x))

    boot = None
    if bootstrap > 0:
        draws = []
        for _ in range(bootstrap):
            bobs = []
            for o in obs:
                idx = rng.integers(0, len(o.point.samples), len(o.point.samples))
                bobs.append(_train_obs(o.point, [o.point.samples[i] for i in idx], opt_s))
            try:
                draws.append(np.exp(_fit_train_line(costs, bobs, opt_s, phi_hi, starts=[sol.x]).x))
            except UserError:
                continue
        boot = np.array(draws) if draws else None

    loo: list[Optional[float]] = [None] * len(obs)
    if len(obs) >= 3:
        for i, o in enumerate(obs):
            rest = obs[:i] + obs[i + 1:]
            r = _fit_train_line(costs, rest, opt_s, phi_hi, extra_start=sol.x)
            lt0, lphi = (float(v) for v in np.exp(r.x))
            pred = train_step_s(o.b, o.seq_len, costs, lt0, lphi) + opt_s
            loo[i] = o.measured_step_s / pred - 1  # relative error of tokens/s = step_meas/step_pred - 1
    else:
        warnings.append(f"only {len(obs)} training point(s): no leave-one-out error (measure at least 3 micro-batches)")

    pts = []
    for o, e in zip(obs, loo):
        fit_t = train_step_s(o.b, o.seq_len, costs, t0, phi) + opt_s
        meas_tps = o.point.tokens_per_s
        pts.append(PointError(
            x=o.b, context_len=o.seq_len, measured_tokens_per_s=meas_tps, fitted_tokens_per_s=o.b * o.seq_len / fit_t,
            loo_tokens_per_s=None if e is None else meas_tps * (1 + e), loo_rel_error=e, measured_s=o.measured_step_s,
            fitted_s=fit_t, loo_s=None if e is None else o.measured_step_s / (1 + e)))
    errs = [abs(e) for e in loo if e is not None]
    seq_lens = {o.seq_len for o in obs}
    if len(seq_lens) > 1:
        warnings.append(f"training points at several sequence lengths {sorted(seq_lens)}: fitted together")

    memory = _fit_memory(profile, costs)
    params = TrainParams(
        t0_s=t0, phi_flops_per_s=phi, optimizer_step_s=opt_s,
        mem0_bytes=memory.mem0_bytes if memory else None,
        mem_per_sample_bytes=memory.mem_per_sample_bytes if memory else None,
        device_memory_bytes=memory.device_memory_bytes if memory else None,
    )
    fit = TrainingFit(
        params=_estimates(["t0_s", "phi_train_flops_per_s"], ["s", "FLOP/s"], sol, boot, {}),
        seq_len=statistics.median_low(sorted(o.seq_len for o in obs)), n_points=len(obs),
        rms_rel_residual=float(math.sqrt(np.mean(sol.residuals ** 2))), points=pts,
        loo_max_abs_error=max(errs) if errs else None, memory=memory, note=note,
    )
    return fit, params


def _fit_memory(profile: Profile, costs: Costs) -> Optional[MemoryFit]:
    """M(b) = M0 + b*m by ordinary least squares, and the largest micro-batch under device memory."""
    pts = [p for p in profile.training if p.status == "ok" and p.peak_mem_bytes]
    ooms = sorted(p.micro_batch for p in profile.training if p.status == "oom")
    device = profile.hardware.memory_total_bytes
    if len(pts) < 2 or len({p.micro_batch for p in pts}) < 2:
        return None
    x = np.array([p.micro_batch for p in pts], float)
    y = np.array([p.peak_mem_bytes for p in pts], float)
    r = linregress(x, y)
    m0, m = float(r.intercept), float(r.slope)
    mem0_ci = slope_ci = None
    note = None
    if len(pts) > 2:
        q = float(student_t.ppf(0.5 + CI_LEVEL / 2, len(pts) - 2))
        slope_ci = (m - q * r.stderr, m + q * r.stderr)
        mem0_ci = (m0 - q * r.intercept_stderr, m0 + q * r.intercept_stderr)
    max_b = None
    if m <= 0:
        note = "peak memory does not grow with the micro-batch here: no memory limit can be derived"
    elif device:
        max_b = max(int(math.floor((device - m0) / m)), 0)
        if ooms and ooms[0] <= max_b:
            note = f"an OOM was recorded at micro-batch {ooms[0]}, below the line's limit: capped there"
            max_b = ooms[0] - 1
    return MemoryFit(mem0_bytes=m0, mem_per_sample_bytes=m, mem0_ci=mem0_ci, mem_per_sample_ci=slope_ci,
                     device_memory_bytes=float(device) if device else None, max_micro_batch=max_b,
                     smallest_oom_micro_batch=ooms[0] if ooms else None, note=note)


# ---------------------------------------------------------------- text summary (the CLI prints it)


def _si(v: Optional[float], unit: str) -> str:
    if v is None:
        return "n/a"
    for f, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= f:
            return f"{v / f:.3g} {p}{unit}"
    if unit == "s" and abs(v) < 1:
        return f"{v * 1e3:.3g} ms"
    return f"{v:.3g} {unit}"


def _param_line(e: ParamEstimate) -> str:
    ci = f" [{_si(e.lo, e.unit)}, {_si(e.hi, e.unit)}]" if e.lo is not None and e.hi is not None else " [not bounded]"
    return f"  {e.name:<22} {_si(e.value, e.unit):>12}{ci}" + (f"  ({e.note})" if e.note else "")


def _ratio(v: Optional[float], ref: Optional[float]) -> str:
    return f"{v / ref:.2f}x" if v and ref else "n/a"


def summary_lines(result: FitResult) -> list[str]:
    """A short readable summary of a fit: parameters with 95% intervals, knee, limits, errors, peaks."""
    lines = []
    pk = result.peaks
    g = result.generation
    if g is not None:
        lines.append(f"decode ({g.form} form, fitted to {g.target}, {g.n_points} points):")
        lines += [_param_line(e) for e in g.params]
        bw = next(e.value for e in g.params if e.name == "bw_bytes_per_s")
        phi = next(e.value for e in g.params if e.name == "phi_flops_per_s")
        gemv = (f" (matrix-vector {_ratio(bw, pk.microbench_gemv_bytes_per_s)})"
                if pk.microbench_gemv_bytes_per_s else "")
        lines.append(f"  BW vs microbench {_ratio(bw, pk.microbench_bytes_per_s)}{gemv}, vs datasheet "
                     f"{_ratio(bw, pk.datasheet_bytes_per_s)}; PHI vs microbench {_ratio(phi, pk.microbench_flops_per_s)}, "
                     f"vs datasheet {_ratio(phi, pk.datasheet_flops_per_s)}")
        lines.append(f"  {g.knee_note}")
        if g.generation_knee_note:
            lines.append(f"  {g.generation_knee_note}")
        if g.loo_max_abs_error is not None:
            errs = ", ".join(f"{p.x}:{100 * p.loo_rel_error:+.1f}%" for p in g.points if p.loo_rel_error is not None)
            lines.append(f"  held-out tokens/s error by concurrency: {errs} (max {100 * g.loo_max_abs_error:.1f}%)")
        if g.probe_points:
            cells = ", ".join(f"{p.x}:{1e3 * p.measured_s:.3g}/{1e3 * p.fitted_s:.3g}" for p in g.probe_points)
            lines.append(f"  overhead probe ({_si(g.probe_weight_bytes, 'B')} of weights), step ms measured/fitted "
                         f"by concurrency: {cells}")
    if result.prefill is not None:
        lines.append(f"prefill ({result.prefill.n_points} points, {result.prefill.note}):")
        lines += [_param_line(e) for e in result.prefill.params]
    tr = result.training
    if tr is not None:
        lines.append(f"training (seq len {tr.seq_len}, {tr.n_points} points):")
        lines += [_param_line(e) for e in tr.params]
        phi = next(e.value for e in tr.params if e.name == "phi_train_flops_per_s")
        lines.append(f"  PHI_train vs microbench {_ratio(phi, pk.microbench_flops_per_s)}, "
                     f"vs datasheet {_ratio(phi, pk.datasheet_flops_per_s)}")
        if tr.loo_max_abs_error is not None:
            errs = ", ".join(f"{p.x}:{100 * p.loo_rel_error:+.1f}%" for p in tr.points if p.loo_rel_error is not None)
            lines.append(f"  held-out tokens/s error by micro-batch: {errs} (max {100 * tr.loo_max_abs_error:.1f}%)")
        m = tr.memory
        if m is not None:
            lines.append(f"  memory: {_si(m.mem0_bytes, 'B')} + b x {_si(m.mem_per_sample_bytes, 'B')}; largest micro-batch "
                         f"in {_si(m.device_memory_bytes, 'B')}: {m.max_micro_batch if m.max_micro_batch is not None else 'n/a'}"
                         + (f" ({m.note})" if m.note else ""))
        if tr.note:
            lines.append(f"  {tr.note}")
    util = [u for u in result.utilisation if u.phase == "decode" and u.time_s]
    if util:
        ref = "datasheet" if pk.datasheet_bytes_per_s else "microbench"
        cells = ", ".join(
            f"{u.x}:{100 * ((u.mbu_datasheet if ref == 'datasheet' else u.mbu_microbench) or 0):.0f}%/"
            f"{100 * ((u.mfu_datasheet if ref == 'datasheet' else u.mfu_microbench) or 0):.0f}%" for u in util)
        lines.append(f"decode MBU/MFU vs {ref} by concurrency: {cells}")
    lines += [f"warning: {w}" for w in result.warnings]
    return lines
