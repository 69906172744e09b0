"""The text summary of a fit that ``throughputlab fit`` prints. No scipy."""

from __future__ import annotations

from typing import Optional

from throughputlab.fit.schema import FitResult, micro_batch_statement
from throughputlab.records.fit import ParamEstimate


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
    if e.lo is not None and e.hi is not None:
        ci = f" [{_si(e.lo, e.unit)}, {_si(e.hi, e.unit)}]"
    else:
        ci = " [not bounded]" if e.identified else " [not identified]"
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
        lines += [_param_line(e) for e in g.params + g.combinations]
        bw = next(e.value for e in g.params if e.name == "bw_bytes_per_s")
        phi = next(e.value for e in g.params if e.name == "phi_flops_per_s")
        gemv = (f" (matrix-vector {_ratio(bw, pk.microbench_gemv_bytes_per_s)})"
                if pk.microbench_gemv_bytes_per_s else "")
        lines.append(f"  BW vs microbench {_ratio(bw, pk.microbench_bytes_per_s)}{gemv}, vs datasheet "
                     f"{_ratio(bw, pk.datasheet_bytes_per_s)}; PHI vs microbench {_ratio(phi, pk.microbench_flops_per_s)}, "
                     f"vs datasheet {_ratio(phi, pk.datasheet_flops_per_s)}")
        if g.attention_note:
            lines.append(f"  attention terms: {g.attention_note}")
        lines.append(f"  {g.knee_note}")
        if g.ceiling:
            lines.append(f"  ceiling of the measured sweep: {g.ceiling}" + (f"; {g.admission_note}" if g.admission_note
                                                                            else ""))
        if g.generation_knee_note:
            lines.append(f"  {g.generation_knee_note}")
        if g.loo_max_abs_error is not None:
            grid = len({p.context_len for p in g.points}) > 1  # a context axis: concurrency@context
            errs = ", ".join(f"{p.x}{f'@{p.context_len:.0f}' if grid else ''}:{100 * p.loo_rel_error:+.1f}%"
                             for p in g.points if p.loo_rel_error is not None)
            by = "concurrency@context" if grid else "concurrency"
            lines.append(f"  held-out tokens/s error by {by}: {errs} (max {100 * g.loo_max_abs_error:.1f}%)")
        if g.probe_points:
            grid = len({p.context_len for p in g.probe_points}) > 1
            cells = ", ".join(f"{p.x}{f'@{p.context_len:.0f}' if grid else ''}:{1e3 * p.measured_s:.3g}/"
                              f"{1e3 * p.fitted_s:.3g}" for p in g.probe_points)
            lines.append(f"  overhead probe ({_si(g.probe_weight_bytes, 'B')} of weights), step ms measured/fitted "
                         f"by {'concurrency@context' if grid else 'concurrency'}: {cells}")
    if result.prefill is not None:
        lines.append(f"prefill ({result.prefill.n_points} points, {result.prefill.note}):")
        lines += [_param_line(e) for e in result.prefill.params + result.prefill.combinations]
    tr = result.training
    if tr is not None:
        axis = len(tr.seq_lens) > 1
        lens = f"seq lens {', '.join(map(str, tr.seq_lens))}" if axis else f"seq len {tr.seq_len}"
        lines.append(f"training ({tr.form} form, {lens}, {tr.n_points} points):")
        lines += [_param_line(e) for e in tr.params]
        phi = next(e.value for e in tr.params if e.name == "phi_train_flops_per_s")
        lines.append(f"  PHI_train vs microbench {_ratio(phi, pk.microbench_flops_per_s)}, "
                     f"vs datasheet {_ratio(phi, pk.datasheet_flops_per_s)}")
        if tr.attention_note:
            lines.append(f"  attention term: {tr.attention_note}")
        if tr.loo_max_abs_error is not None:
            errs = ", ".join(f"{p.x}{f'@{p.context_len:.0f}' if axis else ''}:{100 * p.loo_rel_error:+.1f}%"
                             for p in tr.points if p.loo_rel_error is not None)
            by = "micro-batch@seq len" if axis else "micro-batch"
            lines.append(f"  held-out tokens/s error by {by}: {errs} (max {100 * tr.loo_max_abs_error:.1f}%)")
        m = tr.memory
        if m is not None and m.activation_form is not None:
            sq = f" + {_si(m.mem_per_token_sq_bytes, 'B')} x S^2" if m.activation_form == "quadratic" else ""
            lines.append(f"  memory: {_si(m.mem0_bytes, 'B')} + b x m(S), m(S) = "
                         f"{_si(m.mem_per_token_bytes, 'B')} x S{sq} ({m.activation_note})"
                         + (f" ({m.note})" if m.note else ""))
            cells = ", ".join(f"{a.seq_len}:{_si(a.mem_per_sample_bytes, 'B')}"
                              + (f"/{_si(a.line_mem_per_sample_bytes, 'B')}" if a.line_mem_per_sample_bytes is not None else "")
                              + f" (max b {a.max_micro_batch if a.max_micro_batch is not None else 'n/a'})"
                              for a in m.per_seq_len)
            lines.append(f"  memory per sequence by seq len, m(S)/own line: {cells}")
        elif m is not None:
            lines.append(f"  memory: {_si(m.mem0_bytes, 'B')} + b x {_si(m.mem_per_sample_bytes, 'B')}"
                         + (f" ({m.note})" if m.note else ""))
        mb = micro_batch_statement(result)
        if mb:
            lines.append(f"  {mb}")
        if tr.note:
            lines.append(f"  {tr.note}")
    util = [u for u in result.utilisation if u.phase == "decode" and u.time_s]
    if util:
        ref = "datasheet" if pk.datasheet_bytes_per_s else "microbench"
        grid = len({u.context_len for u in util}) > 1
        cells = ", ".join(
            f"{u.x}{f'@{u.context_len:.0f}' if grid else ''}:"
            f"{100 * ((u.mbu_datasheet if ref == 'datasheet' else u.mbu_microbench) or 0):.0f}%/"
            f"{100 * ((u.mfu_datasheet if ref == 'datasheet' else u.mfu_microbench) or 0):.0f}%" for u in util)
        lines.append(f"decode MBU/MFU vs {ref} by {'concurrency@context' if grid else 'concurrency'}: {cells}")
    lines += [f"warning: {w}" for w in result.warnings]
    return lines
