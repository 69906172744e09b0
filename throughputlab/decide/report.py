"""The decision as plain text (for the terminal) and as a report Section (for the HTML page)."""

from __future__ import annotations

from typing import Optional

from throughputlab.decide.decision import Decision, Row
from throughputlab.report.page import Section

PARTS = (("gen_s", "generation"), ("logprob_s", "log-probs"), ("train_s", "policy update"),
         ("critic_s", "critic"), ("sync_s", "weight sync"))


def _num(x: Optional[float], fmt: str = "{:.3g}") -> str:
    return "-" if x is None else fmt.format(x)


def _hours(s: Optional[float]) -> str:
    if s is None:
        return "-"
    return f"{s / 3600:.3g} h" if s >= 3600 else f"{s:.3g} s"


def _nstar(r: Row) -> str:
    if r.nstar_samples is None:
        return r.nstar_status or "unknown"
    if r.nstar_relative:
        return "flat"
    return f"{r.nstar_samples:.3g}"


def table_rows(d: Decision) -> list[dict]:
    """One dict per row with display columns; None stays None (the HTML table shows it empty)."""
    out = []
    for r in d.rows:
        st = r.step
        row = {
            "config": r.label + (" (baseline)" if r.is_baseline else ""),
            "prompts": r.prompts, "responses": r.prompts * r.group,
            "step_s": r.step_s,
            **{name: (getattr(st, key) if st else None) for key, name in PARTS},
            "samples_per_s": r.samples_per_s,
            "samples_to_target": _nstar(r),
            "time_to_target_h": None if r.time_to_target_s is None else r.time_to_target_s / 3600,
            "time_vs_baseline": r.time_ratio,
            "throughput_gain": r.throughput_gain,
            "samples_penalty": r.samples_penalty,
            "gain_beats_penalty": None if r.beats_baseline is None else ("yes" if r.beats_baseline else "no"),
            "lr": r.lr,
            "lr_rule": r.lr_recommended,
            "below_knee_share": st.rollout.below_knee_share if st else None,
        }
        out.append(row)
    return out


def decision_text(d: Decision) -> str:
    """Terminal rendering: the table, the recommendation, what would change it, and the notes."""
    head = ["config", "step", "gen", "logprob", "train", "critic", "sync", "samples/s", "N*", "T", "T/T0",
            "gain", "penalty", "ok", "lr"]
    lines = []
    for r in d.rows:
        st = r.step
        lines.append([
            r.label + (" *" if r.is_baseline else ""), _hours(r.step_s),
            *(_hours(getattr(st, k)) if st else "-" for k, _ in PARTS),
            _num(r.samples_per_s), _nstar(r), _hours(r.time_to_target_s), _num(r.time_ratio, "{:.2f}"),
            _num(r.throughput_gain, "{:.2f}x"), _num(r.samples_penalty, "{:.2f}x"),
            "-" if r.beats_baseline is None else ("yes" if r.beats_baseline else "no"),
            _num(r.lr, "{:.3g}") + ("" if r.lr_retuned is not False else f" (rule {r.lr_recommended:.3g})"),
        ])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    fmt = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    out = [fmt(head), fmt(["-" * w for w in widths]), *(fmt(x) for x in lines)]
    out.append(f"* baseline; samples are {d.sample_unit}; N* from {d.nstar_source}; lr rule {d.lr_rule}; "
               f"ok = throughput gain beats samples penalty")
    out.append("")
    rec = d.recommendation
    if rec is None:
        out.append("No recommendation: no configuration has a known samples-to-target.")
    else:
        vs = "" if rec.time_ratio is None else f" ({rec.time_ratio:.2f}x the baseline's time-to-target)"
        margin = "" if rec.margin is None else f", {rec.margin:.0%} ahead of {rec.runner_up}"
        lr = "" if rec.lr is None or "lr " in rec.label else f" at lr {rec.lr:.3g}"
        out.append(f"Recommendation: {rec.label}{lr}{vs}{margin}.")
        out.extend(f"  - {w}" for w in rec.what_would_change)
    if d.notes:
        out.append("")
        out.extend(f"note: {n}" for n in d.notes)
    return "\n".join(out)


def decision_section(d: Decision, title: str = "Batch-size decision") -> Section:
    """Time-to-target against batch size, stacked step-time bars, gain against penalty with the
    break-even line, the learning curves on one sample axis, and the table."""
    import pandas as pd
    import plotly.graph_objects as go

    notes = []
    rec = d.recommendation
    if rec is not None:
        margin = "" if rec.margin is None else f", {rec.margin:.0%} ahead of {rec.runner_up}"
        notes.append(f"Recommendation: {rec.label}{margin}. " + " ".join(w.rstrip('.') + "." for w in rec.what_would_change))
    else:
        notes.append("No recommendation: no configuration has a known samples-to-target.")
    notes.append(f"Samples are {d.sample_unit}; samples-to-target from {d.nstar_source}; learning-rate rule {d.lr_rule}.")
    notes.extend(d.notes)
    figs = []

    known = [r for r in d.rows if r.time_ratio is not None or r.time_to_target_s is not None]
    if known:
        absolute = all(r.time_to_target_s is not None for r in known)
        fig = go.Figure()
        for lr_key in sorted({r.lr_retuned for r in known}, key=str):
            rs = [r for r in known if r.lr_retuned == lr_key]
            name = {True: "lr retuned by the rule", False: "lr not retuned", None: "time to target"}[lr_key]
            fig.add_trace(go.Scatter(
                x=[r.batch_samples for r in rs],
                y=[r.time_to_target_s / 3600 if absolute else r.time_ratio for r in rs],
                text=[r.label for r in rs], mode="markers+lines" if lr_key is not False else "markers", name=name))
        fig.update_layout(title="Time to target against batch size", xaxis_title=f"batch ({d.sample_unit} per step)",
                          yaxis_title="hours to target" if absolute else "time to target / baseline",
                          xaxis_type="log", height=380)
        figs.append(fig)

    with_steps = [r for r in d.rows if r.step is not None]
    if with_steps:
        fig = go.Figure()
        for key, name in PARTS:
            fig.add_trace(go.Bar(x=[r.label for r in with_steps], y=[getattr(r.step, key) for r in with_steps],
                                 name=name))
        fig.update_layout(barmode="stack", title=f"RL step time by phase ({d.overlap or ''}; bars add the phases, "
                          "off-policy overlaps generation with training)", yaxis_title="seconds per step", height=380)
        figs.append(fig)

    ratio = [r for r in d.rows if r.samples_penalty is not None and not r.is_baseline]
    if ratio:
        top = max(max(r.throughput_gain for r in ratio), max(r.samples_penalty for r in ratio), 1.0) * 1.1
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="break-even (gain = penalty)",
                                 line={"dash": "dash", "color": "gray"}))
        fig.add_trace(go.Scatter(x=[r.throughput_gain for r in ratio], y=[r.samples_penalty for r in ratio],
                                 text=[r.label for r in ratio], mode="markers+text", textposition="top center",
                                 name="configurations"))
        fig.update_layout(title="Throughput gain against samples penalty (below the line: faster than the baseline)",
                          xaxis_title="throughput gain q(B)/q(B0)", yaxis_title="samples penalty N*(B)/N*(B0)",
                          height=420)
        figs.append(fig)

    if d.curves is not None:
        c = d.curves
        fig = go.Figure()
        palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"]
        for i, cfg in enumerate(c.configs):  # one colour and one legend entry per configuration, a line per seed
            for j, run in enumerate(r for r in c.runs if r.run in cfg.runs):
                fig.add_trace(go.Scatter(x=run.samples, y=run.smoothed, mode="lines", name=cfg.label,
                                         legendgroup=cfg.label, showlegend=j == 0, hovertext=run.run,
                                         line={"color": palette[i % len(palette)], "width": 1.5}))
        fig.add_hline(y=c.target, line_dash="dot", annotation_text=f"target {c.target:g}")
        fig.update_layout(title="Learning curves on one sample axis (smoothed)", xaxis_title=f"cumulative {d.sample_unit}",
                          yaxis_title="metric", height=420)
        figs.append(fig)

    rolls = [r for r in d.rows if r.step is not None]
    if rolls:
        fig = go.Figure()
        seen = set()
        for r in rolls:
            if r.prompts in seen:
                continue
            seen.add(r.prompts)
            ro = r.step.rollout
            fig.add_trace(go.Scatter(x=ro.timeline_t_s, y=ro.timeline_concurrency, mode="lines",
                                     line_shape="hv", name=f"{r.prompts} prompts"))
        knees = [r.step.rollout.knee_concurrency for r in rolls if r.step.rollout.knee_concurrency]
        if knees:
            fig.add_hline(y=knees[0], line_dash="dot", annotation_text=f"knee ~{knees[0]:.3g}")
        fig.update_layout(title="Rollout concurrency over time (drain and refill)", xaxis_title="seconds",
                          yaxis_title="sequences in flight", height=380)
        figs.append(fig)
    df = pd.DataFrame(table_rows(d))
    return Section(title=title, notes=notes, figures=figs, tables=[("Per configuration", df)], anchor="decide")


# ---------------------------------------------------------------- placements side by side


def _best_row(d: Decision) -> Optional[Row]:
    if d.recommendation is None:
        return None
    return next((r for r in d.rows if r.label == d.recommendation.label), None)


def placements_text(decisions: list[Decision]) -> str:
    """One line per placement, best first: the engines, the best batch, its time-to-target and
    step, and each device group's idle share at that batch."""
    base_t = None
    lines = ["placements, best first (time-to-target at each placement's best batch):"]
    for d in decisions:
        r = _best_row(d)
        if r is None or r.step is None:
            lines.append(f"  {d.placement}: no known time-to-target")
            continue
        t = r.nstar_samples / r.samples_per_s if r.nstar_samples else None
        base_t = base_t or t
        rel = f" ({t / base_t:.2f}x the best)" if t and base_t else ""
        idle = ", ".join(f"{k} idle {v:.0%}" for k, v in r.step.idle_share.items())
        lines.append(f"  {d.placement}: best {r.label}, step {_hours(r.step_s)}, "
                     f"{r.samples_per_s:.3g} samples/s{rel}" + (f"; {idle}" if idle else ""))
    return "\n".join(lines)


def placements_section(decisions: list[Decision]) -> Section:
    """Time-to-target against batch size per placement, and each device group's busy and idle
    time over a step at the placement's best batch."""
    import pandas as pd
    import plotly.graph_objects as go

    fig = go.Figure()
    base = decisions[0]
    ref = _best_row(base)
    t_ref = ref.nstar_samples / ref.samples_per_s if ref is not None and ref.nstar_samples else None
    for d in decisions:
        rs = [r for r in d.rows if r.nstar_samples]
        fig.add_trace(go.Scatter(x=[r.batch_samples for r in rs],
                                 y=[(r.nstar_samples / r.samples_per_s) / t_ref if t_ref else None for r in rs],
                                 mode="markers+lines", name=str(d.placement)))
    fig.update_layout(title="Time to target against batch size, per placement (relative to the best)",
                      xaxis_title=f"batch ({base.sample_unit} per step)", yaxis_title="time to target / best",
                      xaxis_type="log", height=420)
    bars = go.Figure()
    rows = []
    for d in decisions:
        r = _best_row(d)
        if r is None or r.step is None:
            continue
        for group, share in (r.step.idle_share or {"all devices": 0.0}).items():
            label = f"{d.placement}: {group}"
            bars.add_trace(go.Bar(y=[label], x=[r.step_s * (1 - share)], orientation="h", name="busy",
                                  marker_color="#1f77b4", showlegend=not rows))
            bars.add_trace(go.Bar(y=[label], x=[r.step_s * share], orientation="h", name="idle",
                                  marker_color="#d3d3d3", showlegend=not rows))
            rows.append({"placement": d.placement, "devices": group, "best batch": r.label, "step_s": r.step_s,
                         "idle share": share, "engines": r.step.engines, "train devices": r.step.train_devices})
    bars.update_layout(barmode="stack", title="Busy and idle time of each device group over a step (best batch)",
                       xaxis_title="seconds per step", height=120 + 40 * max(len(rows), 1))
    return Section(title="Placements", anchor="placements", figures=[fig, bars],
                   notes=[placements_text(decisions).replace("\n", "; ")],
                   tables=[("Placements at their best batch", pd.DataFrame(rows))])
