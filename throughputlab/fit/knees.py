"""The knees as sentences: where decode (and whole requests) turn compute-bound, and what that
means for the measured range; where the decode bandwidth is not identified, the range the knee
lies in instead of one number. The numbers come from the roofline module. No scipy."""

from __future__ import annotations

from typing import Optional

from throughputlab.throughput import ThroughputModel


def knee_statement(model: ThroughputModel, s: float, c_measured_max: Optional[float] = None,
                   phi_floor: bool = False) -> tuple[Optional[float], str]:
    """The knee concurrency at context ``s`` and one sentence saying what it means. ``phi_floor``:
    every measured point was memory-bound, so PHI is only bounded from below, and so is the knee
    (it grows with PHI)."""
    c = model.knee(s)
    if c is None:
        return None, (f"decode stays memory-bound at every concurrency at context {s:.0f}: "
                      "KV-cache reads grow as fast as the arithmetic")
    if phi_floor:
        note = (f"knee at concurrency {c:.3g} or above (context {s:.0f}): every measured point is memory-bound, so "
                "PHI and the knee are bounded from below only, and predictions past it are a floor")
    else:
        note = f"knee at concurrency {c:.3g} (context {s:.0f}): memory-bound below, compute-bound above"
    if c_measured_max is not None and c > c_measured_max:
        note += f"; beyond the largest measured concurrency ({c_measured_max:g}), so extrapolated"
    return c, note


def generation_knee_statement(model: ThroughputModel, prompt_len: float, output_len: int,
                              c_measured_max: Optional[float] = None) -> tuple[Optional[float], str]:
    c = model.generation_knee(prompt_len, output_len)
    if c is None:
        return None, f"whole requests (prompt {prompt_len:g}, output {output_len}) stay memory-bound at every concurrency"
    note = (f"end-to-end knee at concurrency {c:.3g} for prompt {prompt_len:g} + output {output_len} "
            "(prefill compute included)")
    if c_measured_max is not None and c > c_measured_max:
        note += "; beyond the measured range"
    return c, note


def _at_bw(model: ThroughputModel, bw: float) -> ThroughputModel:
    return model.model_copy(update={"decode": model.require("decode").model_copy(update={"bw_bytes_per_s": bw})})


def _between(lo: Optional[float], hi: Optional[float]) -> str:
    """Concurrencies from ``lo`` (None: no lower bound known) to ``hi`` (None: memory-bound throughout)."""
    if lo is not None and hi is not None:
        return f"between concurrency {lo:.3g} and {hi:.3g}"
    if lo is not None:
        return f"at concurrency {lo:.3g} or above (memory-bound throughout if t0 is 0)"
    if hi is not None:
        return f"at concurrency {hi:.3g} or below"
    return "anywhere (memory-bound throughout if t0 is 0)"


def _range_ends(model: ThroughputModel, bw_lo: float, bw_hi: Optional[float], knee) -> tuple[tuple, tuple]:
    """((lowest knee, highest knee), (lowest BW, highest BW)): ``knee(model)`` at the highest BW
    (None without one) and at the lowest, BW's two ends put in order."""
    lo_bw, hi_bw = (bw_lo, bw_hi) if bw_hi is None or bw_hi >= bw_lo else (bw_hi, bw_lo)
    lo = knee(_at_bw(model, hi_bw)) if hi_bw is not None else None
    return (lo, knee(_at_bw(model, lo_bw))), (lo_bw, hi_bw)


def knee_range_statement(model: ThroughputModel, s: float, bw_lo: float, bw_hi: Optional[float]
                         ) -> tuple[tuple[Optional[float], Optional[float]], str]:
    """Where BW is not identified (t0 and W/BW fixed only as their sum): the knee at context ``s``
    over BW's range, ``bw_lo`` (t0 = 0: the constant step is all weight reads; the highest knee)
    to ``bw_hi`` (the memory's measured bandwidth, None without one; the lowest knee)."""
    (lo, hi), (lo_bw, hi_bw) = _range_ends(model, bw_lo, bw_hi, lambda m: m.knee(s))
    fitted = model.knee(s)
    upper = (f" to {hi_bw / 1e9:.3g} GB/s (the higher of the probe's copy and matrix-vector figures)"
             if hi_bw is not None else "")
    note = (f"knee not identified, as BW is not: {_between(lo, hi)} (context {s:.0f}), for BW from "
            f"{lo_bw / 1e9:.3g} GB/s (t0 + W/BW all weight reads){upper}; the fitted BW puts it at "
            + (f"{fitted:.3g}" if fitted is not None else "no concurrency (memory-bound throughout)"))
    return (lo, hi), note


def generation_knee_range_statement(model: ThroughputModel, prompt_len: float, output_len: int, bw_lo: float,
                                    bw_hi: Optional[float]) -> str:
    """The end-to-end knee over BW's range, as :func:`knee_range_statement`."""
    (lo, hi), _ = _range_ends(model, bw_lo, bw_hi, lambda m: m.generation_knee(prompt_len, output_len))
    return (f"end-to-end knee (prefill compute included) for prompt {prompt_len:g} + output {output_len} not "
            f"identified either: {_between(lo, hi)}")


def concurrency_past_knee(measured: list[int], knee: Optional[float]) -> Optional[list[int]]:
    """Where a fitted knee lies past the largest measured concurrency: the measured list with the
    doublings of its largest up to at least twice the knee, so the compute-bound side is measured
    and not extrapolated (``bench --resume -c LIST`` adds just the new points). None when the knee
    is unknown, or inside the measured range."""
    if knee is None or not measured or knee <= max(measured):
        return None
    grown, c = sorted(set(measured)), max(measured)
    while c < 2 * knee:
        c *= 2
        grown.append(c)
    return grown
