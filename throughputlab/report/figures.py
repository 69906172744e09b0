"""The report's figures: tokens/s against concurrency, decode and prefill step times (one curve per
measured prompt length), training tokens/s and memory, each with the model's curves (evaluated
through the throughput model).

Every string that comes from a profile and goes into a plotly figure is HTML-escaped here, with
plotting.figure_text (plotly renders a subset of HTML in names and titles). Names, colours and
contexts come from labels.py. No torch.
"""

from __future__ import annotations

from typing import Optional

from throughputlab import roofline as rf
from throughputlab.fit.schema import FitResult
from throughputlab.records.profile import Profile
from throughputlab.report.labels import GiB, context_names, contexts_of, kv_concurrency, profile_label, shade
from throughputlab.report.plotting import figure_text, grid, layout


def _spread(samples: list[float], med: float) -> tuple[float, float]:
    return (max(samples) - med, med - min(samples)) if samples else (0.0, 0.0)


def _vline(fig, x: float, y0: float, y1: float, name: str, color: str, dash="dot", **kw):
    import plotly.graph_objects as go

    fig.add_trace(go.Scatter(x=[x, x], y=[y0, y1], mode="lines", name=figure_text(name),
                             line=dict(color=color, dash=dash, width=1.5),
                             hovertemplate=f"{figure_text(name)}: %{{x:.3g}}<extra></extra>"), **kw)


def _hline(fig, y: float, x0: float, x1: float, name: str, color: str, dash="dot", **kw):
    import plotly.graph_objects as go

    fig.add_trace(go.Scatter(x=[x0, x1], y=[y, y], mode="lines", name=figure_text(name),
                             line=dict(color=color, dash=dash, width=1.5),
                             hovertemplate=f"{figure_text(name)}: %{{y:.4g}}<extra></extra>"), **kw)


SYMBOLS = ["circle", "square", "diamond", "triangle-up", "triangle-down", "pentagon", "star", "hexagon"]


def generation_figure(items: list[tuple[Profile, Optional[FitResult], str]]):
    """Tokens/s against concurrency: medians with spread and the fitted curve, one pair per context;
    with one context also the knee and the two asymptotes."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for p, fit, color in items:
        label = profile_label(p)
        groups = contexts_of(g for g in p.generation if g.status == "ok" and g.tokens_per_s)
        if not groups:
            continue
        many = len(groups) > 1
        predicted = p.kind == "predicted"
        m = fit.model if fit is not None and fit.model.decode is not None else None
        c_max = max(g.concurrency for _, _, pts in groups for g in pts)
        for i, ((prompt_len, output_len, ok), ctx) in enumerate(zip(groups, context_names(groups))):
            name = f"{label}, {ctx}" if many else label
            col = shade(color, i, len(groups))
            up, down = zip(*(_spread(g.tokens_per_s_samples, g.tokens_per_s) for g in ok))
            symbol = SYMBOLS[i % len(SYMBOLS)] if many else "circle"
            fig.add_trace(go.Scatter(
                x=[g.concurrency for g in ok], y=[g.tokens_per_s for g in ok], mode="markers",
                name=figure_text(f"{name}: {'predicted' if predicted else 'measured median'}"),
                marker=dict(color=col, size=9, symbol=symbol + ("-open" if predicted else "")),
                error_y=dict(type="data", symmetric=False, array=list(up), arrayminus=list(down), visible=not predicted),
                hovertemplate="concurrency %{x}<br>%{y:.4g} tokens/s<extra></extra>"))
            if m is None:
                continue
            knee = None if many else m.knee(rf.mean_context(prompt_len, output_len))
            cs = grid(1, max(c_max * 2, (knee or 0) * 2))
            fig.add_trace(go.Scatter(x=cs, y=m.generation_tokens_per_s(cs, prompt_len, output_len), mode="lines",
                                     name=figure_text(f"{name}: {fit.method} model"), line=dict(color=col, width=2),
                                     hovertemplate="concurrency %{x:.3g}<br>%{y:.4g} tokens/s<extra></extra>"))
        if m is not None and not many:  # the asymptotes and knees of one context; with several they would crowd the plot
            _asymptotes(fig, m, groups[0], label, color, c_max, fit.generation.knee_range if fit.generation else None)
    return layout(fig, "Generation tokens/s against concurrency", "concurrency (sequences)", "output tokens/s")


def _asymptotes(fig, m, group, label: str, color: str, c_max: int, knee_range=None) -> None:
    """The memory slope, the compute ceiling and the knees of one context's curve; where the fit
    says the knee is not identified (``knee_range``), the ends of its range instead of a knee."""
    import plotly.graph_objects as go

    prompt_len, output_len, ok = group
    meds = [g.tokens_per_s for g in ok]
    s = rf.mean_context(prompt_len, output_len)
    knee = m.knee(s)
    hi = max(c_max * 2, (knee or 0) * 2)
    cs = grid(1, hi)
    mem = cs / m.decode_terms_s(cs, s)[0]
    ceiling = m.decode_ceiling_tokens_per_s(s)
    fig.add_trace(go.Scatter(x=cs, y=mem, mode="lines", name=figure_text(f"{label}: memory roofline c*BW/(W+c*s*k)"),
                             line=dict(color=color, dash="dot", width=1)))
    _hline(fig, ceiling, cs[0], cs[-1], f"{label}: compute ceiling " + ("1/((F+s*a)/PHI + t_seq)" if m.decode.t_seq_s else "PHI/(F+s*a)"), color, dash="dash")
    if knee_range is not None:
        for end, which in zip(knee_range, ("lowest", "highest")):
            if end is not None:
                _vline(fig, end, min(meds) / 2, ceiling * 1.2,
                       f"{label}: decode knee not identified, {which} it can be: {end:.3g}", color, dash="dashdot")
        return
    if knee is not None:
        _vline(fig, knee, min(meds) / 2, ceiling * 1.2, f"{label}: decode knee c*={knee:.3g}", color, dash="dashdot")
    e2e = m.generation_knee(prompt_len, output_len)
    if e2e is not None and e2e < hi:
        _vline(fig, e2e, min(meds) / 2, ceiling * 1.2, f"{label}: end-to-end knee (prefill included) {e2e:.3g}",
               color, dash="longdashdot")


def step_figure(items: list[tuple[Profile, Optional[FitResult], str]]):
    """Decode step and prefill time against concurrency (one pair per context), with the KV-cache
    capacity limit at the longest context."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for p, fit, color in items:
        label = profile_label(p)
        groups = contexts_of(g for g in p.generation if g.status == "ok")
        if not groups:
            continue
        many = len(groups) > 1
        c_hi = max(g.concurrency for _, _, pts in groups for g in pts) * 2
        m = fit.model if fit else None
        ys = []
        for i, ((prompt_len, output_len, ok), ctx) in enumerate(zip(groups, context_names(groups))):
            name = f"{label}, {ctx}" if many else label
            col = shade(color, i, len(groups))
            dec = [(g.concurrency, g.decode_step_s) for g in ok if g.decode_step_s]
            pre = [(g.concurrency, g.prefill_s) for g in ok if g.prefill_s]
            if dec:
                fig.add_trace(go.Scatter(x=[c for c, _ in dec], y=[t * 1e3 for _, t in dec], mode="markers",
                                         name=figure_text(f"{name}: decode step"), marker=dict(color=col, size=9)))
            if pre:
                fig.add_trace(go.Scatter(x=[c for c, _ in pre], y=[t * 1e3 for _, t in pre], mode="markers",
                                         name=figure_text(f"{name}: prefill"), marker=dict(color=col, size=9, symbol="diamond-open")))
            ys += [t * 1e3 for _, t in dec + pre]
            if m is not None and m.decode is not None:
                cs = grid(1, c_hi)
                s = rf.mean_context(prompt_len, output_len)
                fig.add_trace(go.Scatter(x=cs, y=m.decode_step_s(cs, s) * 1e3, mode="lines",
                                         name=figure_text(f"{name}: decode step ({fit.method})"), line=dict(color=col, width=2)))
                fig.add_trace(go.Scatter(x=cs, y=m.prefill_s(cs, prompt_len) * 1e3, mode="lines",
                                         name=figure_text(f"{name}: prefill ({fit.method})"), line=dict(color=col, width=1.5, dash="dash")))
        ys = ys or [1.0]
        probe = fit.generation.probe_points if fit is not None and fit.generation is not None else []
        for s in sorted({q.context_len for q in probe}):  # the overhead probe: a step apart from the weights and matmuls
            qs = sorted((q for q in probe if q.context_len == s), key=lambda q: q.x)
            at = f", context {s:.0f}" if many else ""
            fig.add_trace(go.Scatter(x=[q.x for q in qs], y=[q.measured_s * 1e3 for q in qs], mode="markers",
                                     name=figure_text(f"{label}: overhead probe step{at}"), marker=dict(color=color, size=7, symbol="x")))
            fig.add_trace(go.Scatter(x=[q.x for q in qs], y=[q.fitted_s * 1e3 for q in qs], mode="lines",
                                     name=figure_text(f"{label}: overhead probe step{at} (fit)"), line=dict(color=color, width=1, dash="dot")))
        seq_tokens = max(pl + ol for pl, ol, _ in groups)
        kv_c = kv_concurrency(p, m, seq_tokens)
        if kv_c is not None and kv_c <= 8 * c_hi:  # further out it only squashes the plot; the table states it
            at = f" at {seq_tokens} tokens" if many else ""
            _vline(fig, kv_c, min(ys) / 2, max(ys) * 2, f"{label}: KV-cache capacity ({kv_c:.4g} sequences{at})", color,
                   dash="longdash")
    return layout(fig, "Decode step and prefill time", "concurrency (sequences)", "time (ms)")


def training_figure(items: list[tuple[Profile, Optional[FitResult], str]]):
    """Training tokens/s and peak memory against micro-batch, memory limit and largest micro-batch."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for p, fit, color in items:
        label = profile_label(p)
        ok = sorted((t for t in p.training if t.status == "ok" and t.tokens_per_s), key=lambda t: t.micro_batch)
        if not ok:
            continue
        meds = [t.tokens_per_s for t in ok]
        up, down = zip(*(_spread(t.tokens_per_s_samples, t.tokens_per_s) for t in ok))
        fig.add_trace(go.Scatter(x=[t.micro_batch for t in ok], y=meds, mode="markers",
                                 name=figure_text(f"{label}: tokens/s"), marker=dict(color=color, size=9),
                                 error_y=dict(type="data", symmetric=False, array=list(up), arrayminus=list(down))),
                      secondary_y=False)
        mem_pts = [(t.micro_batch, t.peak_mem_bytes / GiB) for t in ok if t.peak_mem_bytes]
        if mem_pts:
            fig.add_trace(go.Scatter(x=[b for b, _ in mem_pts], y=[g for _, g in mem_pts], mode="markers",
                                     name=figure_text(f"{label}: peak memory"), marker=dict(color=color, size=8, symbol="square-open")),
                          secondary_y=True)
        m = fit.model if fit else None
        if m is None or m.train is None:
            continue
        seq = ok[0].seq_len
        max_b = m.max_micro_batch()
        b_hi = max(max(t.micro_batch for t in ok) * 2, min(max_b or 0, 4096))
        bs = grid(1, b_hi)
        fig.add_trace(go.Scatter(x=bs, y=m.train_tokens_per_s(bs, seq), mode="lines",
                                 name=figure_text(f"{label}: tokens/s ({fit.method})"), line=dict(color=color, width=2)),
                      secondary_y=False)
        t = m.train
        mem_line = m.memory_bytes(bs)
        if mem_line is not None:
            fig.add_trace(go.Scatter(x=bs, y=mem_line / GiB, mode="lines",
                                     name=figure_text(f"{label}: memory line M0+b*m"), line=dict(color=color, width=1.5, dash="dash")),
                          secondary_y=True)
        if t.device_memory_bytes:
            _hline(fig, t.device_memory_bytes / GiB, bs[0], bs[-1], f"{label}: device memory", color, dash="dot",
                   secondary_y=True)
        if max_b:
            _vline(fig, max_b, min(meds) / 2, max(meds) * 1.5, f"{label}: largest micro-batch that fits ({max_b})", color,
                   dash="dashdot", secondary_y=False)
    fig.update_yaxes(title_text="training tokens/s", type="log", secondary_y=False)
    fig.update_yaxes(title_text="peak memory (GiB)", type="linear", secondary_y=True, rangemode="tozero")
    fig.update_layout(title=figure_text("Training tokens/s and peak memory against micro-batch"), template="plotly_white",
                      height=480, margin=dict(l=60, r=60, t=60, b=50),
                      legend=dict(orientation="h", yanchor="top", y=-0.15, font=dict(size=11)))
    fig.update_xaxes(title_text="micro-batch (sequences)", type="log")
    return fig
