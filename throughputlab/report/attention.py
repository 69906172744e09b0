"""The attention's share of the decode step against concurrency: at each measured context and at a
few longer ones (predicted), from the throughput model's ``attention_share``; with the fit's own
statement of how the attention was charged. Text is escaped here (figures, with
plotting.figure_text) or by page.py (notes, tables). No torch.
"""

from __future__ import annotations

from typing import Optional

import pandas as pd

from throughputlab import roofline as rf
from throughputlab.fit.schema import FitResult
from throughputlab.records.profile import Profile
from throughputlab.report.labels import contexts_of, profile_label, shade
from throughputlab.report.plotting import figure_text, grid, layout

# longer prompts the share is predicted at: RL responses run to thousands of tokens
PREDICTED_PROMPTS = (2048, 8192)


def _model(fit: Optional[FitResult]):
    return fit.model if fit is not None and fit.model.decode is not None else None


def share_contexts(p: Profile) -> tuple[list[tuple[int, int, bool]], list[int]]:
    """(prompt_len, output_len, measured) for each measured context and each longer predicted one,
    and the predicted prompts left out because they pass the model's maximum length. A predicted
    profile measured nothing: its own contexts are predicted too."""
    groups = contexts_of(g for g in p.generation if g.status == "ok")
    if not groups:
        return [], []
    out = [(pl, ol, p.kind != "predicted") for pl, ol, _ in groups]
    longest, output_len = max(pl for pl, _, _ in groups), groups[-1][1]
    limit = p.model.context_limit
    past = []
    for pl in PREDICTED_PROMPTS:
        if pl <= longest:
            continue
        if limit is not None and pl + output_len > limit:
            past.append(pl)
        else:
            out.append((pl, output_len, False))
    return out, past


def _name(prompt_len: int, measured: bool) -> str:
    return f"prompt {prompt_len}" + ("" if measured else " (predicted)")


def attention_figure(items: list[tuple[Profile, Optional[FitResult], str]]):
    """The share against concurrency, one curve per context: solid measured, dashed predicted."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for p, fit, color in items:
        m = _model(fit)
        contexts, _ = share_contexts(p)
        if m is None or not contexts:
            continue
        label = profile_label(p)
        c_max = max(g.concurrency for g in p.generation if g.status == "ok")
        cs = grid(1, c_max * 2)
        for i, (pl, ol, measured) in enumerate(contexts):
            share = m.attention_share(cs, rf.mean_context(pl, ol))
            fig.add_trace(go.Scatter(
                x=cs, y=share, mode="lines", name=figure_text(f"{label}, {_name(pl, measured)}"),
                line=dict(color=shade(color, i, len(contexts)), width=2, dash="solid" if measured else "dash"),
                hovertemplate="concurrency %{x:.3g}<br>attention %{y:.1%} of the step<extra></extra>"))
    fig = layout(fig, "Attention's share of the decode step", "concurrency (sequences)",
                 "attention time / decode step time", logy=False)
    fig.update_yaxes(range=[0, 1], tickformat=".0%")
    return fig


def attention_notes(p: Profile, fit: Optional[FitResult]) -> list[str]:
    """How the fit charged the attention (its own words), and predicted contexts not shown."""
    label = profile_label(p)
    notes = []
    if fit is not None and fit.generation is not None and fit.generation.attention_note:
        notes.append(f"{label}: {fit.generation.attention_note}")
    _, past = share_contexts(p)
    if past and _model(fit) is not None:
        notes.append(f"{label}: not predicted at prompt {', '.join(map(str, past))}: past the model's "
                     f"{p.model.context_limit} positions")
    return notes


def attention_table(p: Profile, fit: Optional[FitResult]) -> Optional[tuple[str, pd.DataFrame]]:
    """The share at each measured concurrency, one row per context."""
    m = _model(fit)
    contexts, _ = share_contexts(p)
    if m is None or not contexts:
        return None
    cs = sorted({g.concurrency for g in p.generation if g.status == "ok"})
    rows = []
    for pl, ol, measured in contexts:
        s = float(rf.mean_context(pl, ol))
        row = {"prompt": pl, "output": ol, "mean context (tokens)": f"{s:,.0f}",
               "context": "measured" if measured else "predicted"}
        row.update({f"c={c}": f"{100 * float(m.attention_share(c, s)):.1f}%" for c in cs})
        rows.append(row)
    return f"{profile_label(p)}: attention's share of the decode step", pd.DataFrame(rows)
