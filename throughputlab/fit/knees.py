"""The knees as sentences: where decode (and whole requests) turn compute-bound, and what that
means for the measured range. The numbers come from the roofline module. No scipy."""

from __future__ import annotations

from typing import Optional

from throughputlab.throughput import ThroughputModel


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
