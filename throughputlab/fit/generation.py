"""The generation fit: decode step (hard or smooth maximum, chosen by held-out error), prefill,
per-call overhead, and the overhead probe's step times fitted jointly (docs/model.md).

With per-step timings the decode parameters are fitted to the decode step times and the prefill to
the prefill times (BW shared); without them (a published curve, an HTTP engine) to end-to-end tokens/s.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Optional

import numpy as np

from throughputlab import roofline as rf
from throughputlab.fit import identify
from throughputlab.fit.forms import SPLIT_CONTEXT_RATIO, attention_note, choose_form
from throughputlab.fit.observations import GenObs, gen_obs, resampled
from throughputlab.fit.solver import LSQ, bootstrap, can_bootstrap, estimates, leave_one_out, rms, solve
from throughputlab.records.fit import PHI_FLOOR_NOTE, GenerationFit, Peaks, PointError, PrefillFit
from throughputlab.records.profile import GenPoint
from throughputlab.roofline import Costs
from throughputlab.throughput import DecodeParams, PrefillParams

MICROBENCH_HEADROOM = 10.0  # caches and read-only traffic can beat a copy benchmark, but not tenfold

Decode = tuple  # (t0, bw, phi, p or None, t_seq, bw_attn or None, bw_mem or None)


def ceilings(peaks: Peaks, devices: int = 1) -> tuple[Optional[float], Optional[float]]:
    """Upper ends of the search: the datasheet peak (cannot be exceeded), else 10x the micro-benchmark;
    an engine over ``devices`` devices (tensor parallel) has that many times one device's peak."""
    bench = (peaks.microbench_bytes_per_s, peaks.microbench_flops_per_s)
    bw, phi = (sheet or (MICROBENCH_HEADROOM * b if b else None)
               for sheet, b in zip((peaks.datasheet_bytes_per_s, peaks.datasheet_flops_per_s), bench))
    return (bw * devices if bw else None), (phi * devices if phi else None)


def kv_ceiling(peaks: Peaks, devices: int = 1, points: tuple = ()) -> Optional[float]:
    """The KV reads' ceiling (roofline.kv_read_rate): the probe's matrix-vector read bandwidth, else
    the datasheet's; an engine of ``devices`` devices reads its shards on all of them. None for an
    HTTP engine's points: the probe measured this machine, not the server's devices."""
    bw = peaks.microbench_gemv_bytes_per_s or peaks.datasheet_bytes_per_s
    return bw * devices if bw and not any(p.backend == "openai" for p in points) else None


def _kv_note(dec: Decode) -> str:
    bw, ba, bm, fitted = dec[1], dec[5], dec[6], dec[5] or dec[1]
    if not bm or rf.kv_read_rate(bw, ba, bm) >= fitted:
        return ""
    return (f"; the KV reads at the memory's measured read bandwidth, {bm / 1e9:.3g} GB/s, not the fitted "
            f"{fitted / 1e9:.3g} GB/s (every step streams the KV cache from memory)")


def _bounds(peak_bw: Optional[float], peak_phi: Optional[float], t_scale: float):
    """Log-space search ranges for t0, BW, PHI: wide, but never above a peak (physically impossible)."""
    lo = np.log([1e-9, 1e6, 1e6])
    hi = np.log([max(t_scale, 1e-6) * 10, peak_bw or 1e15, peak_phi or 1e18])
    return lo, hi


@dataclass
class _GenSpec:
    """Everything fixed while fitting generation points (costs, form, target, bounds).

    With ``probe_costs`` (the overhead probe's W and F) the probe's step times are fitted
    jointly with the model's: same t0, per-sequence cost, BW and PHI, different W and F.
    Parameter vector (log): t0, BW, PHI, then t_seq with a probe, then p for the smooth form or
    BW_attn, the attention's own bandwidth, for the split (per-kernel) form.
    """

    costs: Costs
    form: str
    target: str
    lo: np.ndarray
    hi: np.ndarray
    probe_costs: Optional[Costs] = None
    bw_mem: Optional[float] = None  # the KV reads' ceiling (roofline.kv_read_rate): not fitted

    def unpack(self, x: np.ndarray) -> Decode:
        v = [float(z) for z in np.exp(x)]
        i = 3
        t_seq = 0.0
        if self.probe_costs is not None:
            t_seq, i = v[3], 4
        p = v[i] if self.form == "smooth" else None
        bw_attn = v[i] if self.form == "split" else None
        return v[0], v[1], v[2], p, t_seq, bw_attn, self.bw_mem


def _arrays(obs: list[GenObs], *names: str) -> list[np.ndarray]:
    return [np.array([getattr(o, n) for o in obs], dtype=float) for n in names]


def _decode_residuals(spec: _GenSpec, obs: list[GenObs]):
    costs = spec.costs
    c, s, p_len, o_len = _arrays(obs, "c", "s", "p", "o")
    steps = spec.target == "decode_step_s"
    y = _arrays(obs, "decode_step_s" if steps else "total_s")[0]
    probe = spec.probe_costs if steps else None
    y_probe = _arrays(obs, "probe_step_s")[0] if probe is not None else None

    def f(x: np.ndarray) -> np.ndarray:
        t0, bw, phi, p, ts, ba, bm = spec.unpack(x)
        td = rf.decode_step_s(c, s, costs, t0, bw, phi, p, ts, ba, bm)
        if steps:
            r = np.log(td / y)
        else:  # end to end: prefill with the same parameters, then o-1 decode steps
            r = np.log(rf.static_batch_s(rf.prefill_s(c, p_len, costs, t0, bw, phi, p), td, o_len) / y)
        if probe is not None:
            r = np.concatenate([r, np.log(rf.decode_step_s(c, s, probe, t0, bw, phi, p, ts, ba, bm) / y_probe)])
        return r

    return f


def _decode_starts(spec: _GenSpec, obs: list[GenObs]) -> list[np.ndarray]:
    costs = spec.costs
    small = min(obs, key=lambda o: o.c)
    large = max(obs, key=lambda o: o.c)
    t_small = small.decode_step_s if spec.target == "decode_step_s" else small.total_s / max(small.o, 1)
    t_large = large.decode_step_s if spec.target == "decode_step_s" else large.total_s / max(large.o, 1)
    mem_b = rf.decode_bytes(costs, small.c, small.s)
    comp_f = rf.decode_flops(costs, large.c, large.s)
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
                    elif spec.form == "split":
                        x.append(math.log(bw))
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
                elif spec.form == "split":
                    x.append(math.log(bw))
                starts.append(np.array(x))
    return starts


def _fit_prefill(costs: Costs, obs: list[GenObs], bw: float, phi_hi: Optional[float]) -> Optional[LSQ]:
    """t0' and PHI' of the prefill, with BW taken from decode (prefill barely constrains it)."""
    pts = [o for o in obs if o.prefill_s]
    if len(pts) < 2:
        return None
    c, p_len, y = _arrays(pts, "c", "p", "prefill_s")

    def f(x: np.ndarray) -> np.ndarray:
        t0, phi = np.exp(x)
        return np.log(rf.prefill_s(c, p_len, costs, t0, bw, phi) / y)

    big = max(pts, key=lambda o: o.c * o.p)
    fl = rf.prefill_flops(costs, big.c, big.p)
    tmin = min(o.prefill_s for o in pts)
    lo = np.log([1e-9, 1e6])
    hi = np.log([tmin * 10, phi_hi or 1e18])
    starts = [np.log([tmin * fr, fl / big.prefill_s * m]) for fr in (0.02, 0.3) for m in (1.0, 3.0)]
    return solve(f, starts, lo, hi)


def _prefill_of(costs: Costs, o: GenObs, dec: Decode, pre: Optional[tuple]) -> float:
    t0, bw, phi, p = dec[:4]
    if pre is not None:
        return rf.prefill_s(o.c, o.p, costs, pre[0], bw, pre[1])
    return rf.prefill_s(o.c, o.p, costs, t0, bw, phi, p)


def _predict_gen_tps(costs: Costs, dec: Decode, pre: Optional[tuple], overhead: float, o: GenObs) -> float:
    """End-to-end tokens/s of point o: overhead + prefill + (o-1) decode steps at mean context."""
    t0, bw, phi, p, ts, ba, bm = dec
    td = rf.decode_step_s(o.c, o.s, costs, t0, bw, phi, p, ts, ba, bm)
    return o.c * o.o / float(rf.static_batch_s(_prefill_of(costs, o, dec, pre), td, o.o, overhead))


@dataclass
class _GenFit:
    sol: LSQ
    dec: Decode
    psol: Optional[LSQ]
    pre: Optional[tuple]
    overhead: float


def _gen_fit_all(spec: _GenSpec, obs: list[GenObs], phi_hi, starts=None) -> _GenFit:
    """Decode (+ prefill + overhead when the target is step times) fitted to ``obs``."""
    sol = solve(_decode_residuals(spec, obs), starts or _decode_starts(spec, obs), spec.lo, spec.hi)
    if spec.form == "max" and spec.target == "decode_step_s":  # PHI at its floor where no point is compute-bound
        sol = identify.phi_at_its_floor(spec.costs, [(o.c, o.s) for o in obs], sol, spec.unpack(sol.x), spec.lo[2],
                                        spec.hi[2])
    dec = spec.unpack(sol.x)
    pre = psol = None
    overhead = 0.0
    if spec.target == "decode_step_s":
        psol = _fit_prefill(spec.costs, obs, dec[1], phi_hi)
        if psol is not None:
            pre = psol.values()
        ov = [o.overhead_s for o in obs if o.overhead_s is not None]
        overhead = max(statistics.median(ov), 0.0) if ov else 0.0
    return _GenFit(sol, dec, psol, pre, overhead)


def _gen_loo(spec: _GenSpec, obs: list[GenObs], phi_hi, x_full,
             step_errors: Optional[list] = None) -> list[Optional[float]]:
    """Held-out relative error of end-to-end tokens/s at every point (None when too few points);
    ``step_errors`` collects the same refits' held-out error of the decode step, when timed."""
    def one(rest: list[GenObs], o: GenObs) -> float:
        starts = [x_full] + _decode_starts(spec, rest)[::4]  # the full fit is a near-optimal start
        g = _gen_fit_all(spec, rest, phi_hi, starts=starts)
        if step_errors is not None and o.decode_step_s:
            t0, bw, phi, p, ts, ba, bm = g.dec
            step_errors.append(rf.decode_step_s(o.c, o.s, spec.costs, t0, bw, phi, p, ts, ba, bm) / o.decode_step_s - 1)
        return _predict_gen_tps(spec.costs, g.dec, g.pre, g.overhead, o) / o.tokens_per_s - 1

    return leave_one_out(obs, len(spec.lo), one)


def _prefill_loo(costs: Costs, obs: list[GenObs], bw: float, phi_hi) -> dict[int, float]:
    pts = [o for o in obs if o.prefill_s]
    if len(pts) < 3:
        return {}

    def one(rest: list[GenObs], o: GenObs) -> Optional[float]:
        sol = _fit_prefill(costs, rest, bw, phi_hi)
        if sol is None:
            return None
        t0, phi = sol.values()
        return rf.prefill_s(o.c, o.p, costs, t0, bw, phi)

    return {o.c: t for o, t in zip(pts, leave_one_out(pts, 2, one)) if t is not None}


def fit_generation(points: list[GenPoint], costs: Costs, peaks: Peaks, warnings: list[str], bootstrap_n: int,
                   rng: np.random.Generator, probe_costs: Optional[Costs] = None, engine_devices: int = 1,
                   admitted=None):
    """(GenerationFit, DecodeParams, PrefillFit or None, PrefillParams or None, overhead seconds).
    ``admitted(c, p, o)``: the requests the engine ran at once (fit.admission), where it held some back.

    An engine of several devices (tensor parallel) is fitted as one: its BW and PHI are the
    engine's, searched up to one device's peak times the device count; the all-reduces are in t0."""
    every = [gen_obs(p, admitted) for p in points]
    # points the engine held back ran as batches of what it admitted, whose timings mix the queue in: fitted on
    # the others, and predicted (held out by construction) as those batches
    obs = [o for o in every if o.c == o.requested]
    obs = obs if len(obs) >= 3 else every
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
    bw_hi, phi_hi = ceilings(peaks, engine_devices)
    if engine_devices > 1:
        warnings.append(f"an engine of {engine_devices} devices (tensor parallel) fitted as one: BW and PHI are the "
                        "engine's, its all-reduces are part of t0")
    lo3, hi3 = _bounds(bw_hi, phi_hi, max(o.total_s for o in obs))
    n = len(obs)
    forms = ["max", "smooth"] if n >= 6 else ["max"]
    spread = max(o.s for o in obs) / max(min(o.s for o in obs), 1e-9)
    if n >= 6 and spread >= SPLIT_CONTEXT_RATIO:
        forms.append("split")
    n_c = len({o.c for o in obs})
    if n_c < 4:  # a context grid has many points, but t0, BW and PHI are told apart along concurrency
        warnings.append(f"only {n_c} concurrenc{'y' if n_c == 1 else 'ies'} measured: the decode fit is "
                        "under-determined (measure at least 4 concurrencies, spanning the knee)")
    if probe_costs is not None:  # the per-sequence cost t_seq, between 1 ns and the longest step
        lo3, hi3 = np.append(lo3, math.log(1e-9)), np.append(hi3, math.log(max(o.decode_step_s for o in obs)))
    candidates = {}
    for form in forms:
        lo, hi = lo3, hi3
        if form == "smooth":
            lo, hi = np.append(lo3, math.log(1.0)), np.append(hi3, math.log(64.0))
        elif form == "split":  # the attention's bandwidth: the same search range as BW
            lo, hi = np.append(lo3, lo3[1]), np.append(hi3, hi3[1])
        spec = _GenSpec(costs, form, target, lo, hi, probe_costs, kv_ceiling(peaks, engine_devices, points))
        full = _gen_fit_all(spec, obs, phi_hi)
        step_errs: list[float] = []
        loo = _gen_loo(spec, obs, phi_hi, full.sol.x, step_errs if target == "decode_step_s" else None)
        errs = [abs(e) for e in loo if e is not None]
        candidates[form] = (spec, full, loo, statistics.fmean(errs) if errs else None,
                            statistics.fmean(abs(e) for e in step_errs) if step_errs else None)
    chosen = choose_form(candidates)
    spec, g, loo = candidates[chosen][:3]

    boot = pboot = None
    if bootstrap_n > 0 and can_bootstrap("generation", [len(o.point.samples) for o in obs], warnings):
        draws = bootstrap(bootstrap_n, lambda: [resampled(o.point, rng, admitted) for o in obs],
                          lambda bobs: _gen_fit_all(spec, bobs, phi_hi, starts=[g.sol.x]))
        boot = np.array([np.exp(d.sol.x) for d in draws]) if draws else None
        pdraws = [np.exp(d.psol.x) for d in draws if d.psol is not None]
        pboot = np.array(pdraws) if pdraws else None

    probe = spec.probe_costs is not None
    names = (["t0_s", "bw_bytes_per_s", "phi_flops_per_s"] + (["t_seq_s"] if probe else [])
             + (["smooth_p"] if chosen == "smooth" else []) + (["bw_attn_bytes_per_s"] if chosen == "split" else []))
    units = (["s", "B/s", "FLOP/s"] + (["s"] if probe else []) + ([""] if chosen == "smooth" else [])
             + (["B/s"] if chosen == "split" else []))
    notes = {}
    t0, bw, phi, p, ts, ba, bm = g.dec
    if chosen == "smooth" and p is not None and p < 1.0 + 1e-3:
        notes["smooth_p"] = "at 1: memory and compute time add up (no overlap)"
    mem_bound = [rf.decode_mem_s(costs, o.c, o.s, bw, bm) >= rf.decode_flops(costs, o.c, o.s) / phi for o in obs]
    if all(mem_bound) and target == "decode_step_s":  # end to end, PHI is also seen through the prefill
        notes["phi_flops_per_s"] = PHI_FLOOR_NOTE
    if not any(mem_bound):
        notes["bw_bytes_per_s"] = "every point is compute-bound: BW is only bounded from below"
    params, combos = identify.decode(
        estimates(names, units, g.sol, boot, notes), g.sol, boot, costs, probe=probe, peaks=peaks,
        devices=engine_devices, mem_bound_bytes=[rf.decode_bytes(costs, o.c, o.s) for o, m in zip(obs, mem_bound) if m])

    pts = []
    for o, e in zip(obs, loo):
        pts.append(PointError(
            x=o.requested, context_len=o.s, measured_tokens_per_s=o.tokens_per_s,
            fitted_tokens_per_s=_predict_gen_tps(costs, g.dec, g.pre, g.overhead, o),
            loo_tokens_per_s=None if e is None else o.tokens_per_s * (1 + e), loo_rel_error=e,
            measured_s=o.decode_step_s, fitted_s=rf.decode_step_s(o.c, o.s, costs, t0, bw, phi, p, ts, ba, bm)))
    probe_pts = [PointError(x=o.c, context_len=o.s, measured_s=o.probe_step_s,
                            fitted_s=rf.decode_step_s(o.c, o.s, spec.probe_costs, t0, bw, phi, p, ts, ba, bm))
                 for o in obs] if probe else []
    for o in (o for o in every if o not in obs):
        pred = _predict_gen_tps(costs, g.dec, g.pre, g.overhead, o)
        pts.append(PointError(x=o.requested, context_len=o.s, measured_tokens_per_s=o.tokens_per_s,
                              fitted_tokens_per_s=pred, loo_tokens_per_s=pred, loo_rel_error=pred / o.tokens_per_s - 1))
    pts.sort(key=lambda e: (e.context_len, e.x))
    loo_errs = [abs(e.loo_rel_error) for e in pts if e.loo_rel_error is not None]
    gen = GenerationFit(
        target=target, form=chosen, form_loo_mean_abs_error={k: v[3] for k, v in candidates.items()}, params=params,
        attention_note=attention_note(chosen, obs, candidates) + _kv_note(g.dec),
        form_loo_decode_step_error={k: v[4] for k, v in candidates.items()},
        combinations=combos,
        context_len=statistics.median(o.s for o in obs), knee_note="", n_points=n, rms_rel_residual=rms(g.sol),
        points=pts, loo_max_abs_error=max(loo_errs) if loo_errs else None, probe_points=probe_pts,
        probe_weight_bytes=spec.probe_costs.weight_bytes if probe else None,
    )
    dec_params = DecodeParams(t0_s=t0, bw_bytes_per_s=bw, phi_flops_per_s=phi, smooth_p=p, t_seq_s=ts,
                              bw_attn_bytes_per_s=ba, measured_cached_tokens=max(o.c * o.s for o in obs),
                              bw_mem_bytes_per_s=bm)

    pre_fit = pre_params = None
    if g.psol is not None and g.pre is not None:
        pre_params = PrefillParams(t0_s=g.pre[0], bw_bytes_per_s=bw, phi_flops_per_s=g.pre[1])
        ploo = _prefill_loo(costs, obs, bw, phi_hi)
        ppts = []
        for o in obs:
            if not o.prefill_s:
                continue
            lt = ploo.get(o.c)
            ppts.append(PointError(x=o.c, context_len=o.p, measured_s=o.prefill_s,
                                   fitted_s=rf.prefill_s(o.c, o.p, costs, g.pre[0], bw, g.pre[1]), loo_s=lt,
                                   loo_rel_error=None if lt is None else lt / o.prefill_s - 1))
        pre_mem = [o for o in obs if o.prefill_s and rf.prefill_bytes(costs, o.c, o.p) / bw
                   >= rf.prefill_flops(costs, o.c, o.p) / g.pre[1]]
        pparams, pcombos = identify.prefill(
            estimates(["t0_s", "phi_flops_per_s"], ["s", "FLOP/s"], g.psol, pboot, {}), g.psol, pboot, costs,
            bw=next(e for e in params if e.name == "bw_bytes_per_s"), any_mem_bound=bool(pre_mem), peaks=peaks,
            devices=engine_devices)
        pre_fit = PrefillFit(params=pparams, combinations=pcombos, n_points=len(ppts), points=ppts,
                             note="bandwidth shared with the decode fit")
    elif target == "decode_step_s":
        warnings.append("fewer than 2 prefill timings: prefill uses the decode parameters")
    return gen, dec_params, pre_fit, pre_params, g.overhead

