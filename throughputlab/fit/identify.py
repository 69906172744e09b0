"""What a generation fit cannot pin down, and the combination it does pin down instead.

Where the memory roof binds, a decode step is ``t0 + W/BW`` plus a small KV term: without the
overhead probe (an HTTP engine, vLLM) nothing but the fitted form's assumptions tells the fixed
cost ``t0`` from the weight reads ``W/BW``, unless the bytes read differ enough from one
memory-bound point to the next (long contexts, experts touched). A bandwidth above what the
probe's micro-benchmarks measured the memory can do is no bandwidth either: part of ``t0`` has
gone into ``W/BW``. Both are reported as not identified, with ``t0 + W/BW`` and its interval
beside them. The point estimates stay in the model: at the measured contexts its step times
depend on the sum (and on BW alone only through the KV term).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

import numpy as np

from throughputlab import roofline as rf
from throughputlab.fit.solver import LSQ, log_combination_half_width, percentile_ci
from throughputlab.records.fit import ParamEstimate, Peaks
from throughputlab.roofline import Costs

SEPARATING_BYTES_RATIO = 1.5  # memory-bound points whose bytes differ this much tell t0 from bytes/BW
CONSTANT_STEP = "t0_plus_w_over_bw_s"
_NO_PROBE_T0 = "without the overhead probe, not separable from W/BW: see t0 + W/BW"
_NO_PROBE_BW = "without the overhead probe, W/BW is not separable from t0: see t0 + W/BW"


def measured_memory(peaks: Peaks, devices: int = 1) -> tuple[Optional[float], str]:
    """The highest bandwidth the probe's micro-benchmarks measured (copy, matrix-vector), times
    the engine's devices, and the sentence that states them; (None, "") without a benchmark."""
    figs = [(v * devices, name) for v, name in ((peaks.microbench_bytes_per_s, "copy"),
                                                 (peaks.microbench_gemv_bytes_per_s, "matrix-vector")) if v]
    if not figs:
        return None, ""
    text = "above what the probe measured the memory can do: " + ", ".join(f"{v / 1e9:.3g} GB/s {n}" for v, n in figs)
    return max(v for v, _ in figs), text + (f" ({devices} devices)" if devices > 1 else "")


def measured_flops(peaks: Peaks, devices: int = 1) -> tuple[Optional[float], str]:
    """The probe's matmul rate in the profile's dtype, times the devices; (None, "") otherwise."""
    v = peaks.microbench_flops_per_s
    if not v or (peaks.microbench_dtype and peaks.microbench_dtype != peaks.dtype):
        return None, ""
    v *= devices
    return v, f"above the probe's matmul benchmark, {v / 1e9:.3g} GFLOP/s: the FLOP count or the benchmark is off"


def _with_note(e: ParamEstimate, reasons: list[str], identified: bool) -> ParamEstimate:
    if not reasons:
        return e
    upd = {"note": "; ".join(reasons) + (f"; {e.note}" if e.note else "")}
    if not identified:
        upd.update(identified=False, lo=None, hi=None)
    return e.model_copy(update=upd)


def constant_step(sol: LSQ, boot: Optional[np.ndarray], weight_bytes: float, what: str,
                  bw_fixed: Optional[float] = None) -> ParamEstimate:
    """``t0 + W/BW`` with its 95% interval: bootstrap percentiles when there are enough draws,
    else the Jacobian's (delta method). ``sol``'s first parameters are log t0 and log BW, or
    only log t0 when BW was held at ``bw_fixed``."""
    t0 = math.exp(sol.x[0])
    bw = bw_fixed if bw_fixed is not None else math.exp(sol.x[1])
    value = rf.transfer_s(weight_bytes, bw, t0)  # the weights streamed once at BW, after t0
    grad = np.zeros(len(sol.x))
    grad[0] = t0 / value
    if bw_fixed is None:
        grad[1] = -(weight_bytes / bw) / value
    half = log_combination_half_width(sol, grad)
    lo = hi = None
    if half is not None:
        lo, hi = value * math.exp(-half), value * math.exp(half)
        if boot is not None and len(boot) >= 10:
            draws = rf.transfer_s(weight_bytes, boot[:, 1] if bw_fixed is None else bw_fixed, boot[:, 0])
            lo, hi = percentile_ci(draws[:, None])[0]
    return ParamEstimate(name=CONSTANT_STEP, value=value, unit="s", lo=lo, hi=hi, identified=half is not None,
                         note=f"t0 + W/BW, W = {weight_bytes / 1e6:.4g} MB: {what}")


def decode(params: list[ParamEstimate], sol: LSQ, boot: Optional[np.ndarray], costs: Costs, *, probe: bool,
           mem_bound_bytes: list[float], peaks: Peaks, devices: int
           ) -> tuple[list[ParamEstimate], list[ParamEstimate]]:
    """The decode estimates with t0, BW (and PHI) flagged where the data or the probe say so, and
    the combinations the data do fix ([] when t0 and BW are both identified)."""
    idx = {e.name: i for i, e in enumerate(params)}
    it0, ibw, iphi = idx["t0_s"], idx["bw_bytes_per_s"], idx["phi_flops_per_s"]
    out = list(params)
    why_t0: list[str] = []
    why_bw: list[str] = []
    if not probe and mem_bound_bytes and max(mem_bound_bytes) < SEPARATING_BYTES_RATIO * min(mem_bound_bytes):
        why_t0.append(_NO_PROBE_T0)
        why_bw.append(_NO_PROBE_BW)
    ceiling, text = measured_memory(peaks, devices)
    if ceiling and out[ibw].value > ceiling:
        why_bw.append(text)
    out[it0] = _with_note(out[it0], why_t0, identified=False)
    out[ibw] = _with_note(out[ibw], why_bw, identified=False)
    fl, fl_text = measured_flops(peaks, devices)
    if fl and out[iphi].value > fl:
        out[iphi] = _with_note(out[iphi], [fl_text], identified=out[iphi].identified)
    combos = []
    if mem_bound_bytes and not (out[it0].identified and out[ibw].identified):
        combos.append(constant_step(sol, boot, costs.weight_bytes,
                                    "the constant part of the decode step"))
    return out, combos


def prefill(params: list[ParamEstimate], sol: LSQ, boot: Optional[np.ndarray], costs: Costs, *,
            bw: ParamEstimate, any_mem_bound: bool, peaks: Peaks, devices: int
            ) -> tuple[list[ParamEstimate], list[ParamEstimate]]:
    """The prefill's t0 and PHI (BW held at the decode's ``bw``): where a prefill is memory-bound
    and that BW is not identified, the prefill's t0 is not either, and its t0 + W/BW is given."""
    idx = {e.name: i for i, e in enumerate(params)}
    out = list(params)
    combos = []
    if any_mem_bound and not bw.identified:
        i = idx["t0_s"]
        out[i] = _with_note(out[i], ["the decode's BW, which it shares, is not identified: see t0 + W/BW"],
                            identified=False)
        combos.append(constant_step(sol, boot, costs.weight_bytes,
                                    "the constant part of a memory-bound prefill", bw_fixed=bw.value))
    fl, fl_text = measured_flops(peaks, devices)
    i = idx["phi_flops_per_s"]
    if fl and out[i].value > fl:
        out[i] = _with_note(out[i], [fl_text], identified=out[i].identified)
    return out, combos


def flops_note(params: list[ParamEstimate], name: str, peaks: Peaks, devices: int = 1) -> list[ParamEstimate]:
    """``params`` with ``name`` noted when it lands above the probe's matmul rate."""
    fl, text = measured_flops(peaks, devices)
    return [_with_note(e, [text], e.identified) if fl and e.name == name and e.value > fl else e for e in params]


def bw_range(params: list[ParamEstimate], combos: list[ParamEstimate], weight_bytes: float, peaks: Peaks,
             devices: int) -> Optional[tuple[float, Optional[float]]]:
    """Where BW is not identified but t0 + W/BW is: the BWs the data allow, from W over the whole
    constant step (t0 = 0) up to the memory's measured bandwidth (None without a micro-benchmark);
    None where BW is identified."""
    bw = next(e for e in params if e.name == "bw_bytes_per_s")
    const = next((e for e in combos if e.name == CONSTANT_STEP), None)
    if bw.identified or const is None or const.value <= 0:
        return None
    return weight_bytes / const.value, measured_memory(peaks, devices)[0]


def phi_at_its_floor(costs: Costs, points: list[tuple[float, float]], sol: LSQ, dec: tuple, lo: float,
                     hi: float) -> LSQ:
    """Where every decode point (c, s) is memory-bound, the step times do not move with PHI above the
    smallest value that keeps them so: the fit takes that floor (log PHI is x[2]), so the knee it
    states is the lowest the data allow; the solver would stop anywhere on the flat part."""
    bw, phi, bm = dec[1], dec[2], dec[6]
    floor = max(rf.decode_flops(costs, c, s) / rf.decode_mem_s(costs, c, s, bw, bm) for c, s in points)
    floor *= 1 + 1e-9  # every point stays memory-bound at it
    if floor >= phi:  # some point is compute-bound: PHI is identified
        return sol
    x = sol.x.copy()
    x[2] = float(np.clip(math.log(floor), lo, hi))
    return replace(sol, x=x)
