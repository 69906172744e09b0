"""The plotly helpers the figures (figures.py) and the attention section share: the escaping of
figure text, the common layout and the concurrency grid curves are drawn at. A leaf: it imports
nothing from report/. No torch.
"""

from __future__ import annotations

import html

import numpy as np


def figure_text(text: str) -> str:
    """Text for a plotly figure: escaped, so a name holding markup is shown, never interpreted.

    Only &, < and > are replaced: plotly parses tags only after '<', and shows &quot; literally."""
    return html.escape(str(text), quote=False)


def layout(fig, title: str, xtitle: str, ytitle: str, logx=True, logy=True):
    fig.update_layout(title=figure_text(title), template="plotly_white", height=480,
                      margin=dict(l=60, r=20, t=60, b=50),
                      legend=dict(orientation="h", yanchor="top", y=-0.15, font=dict(size=11)))
    fig.update_xaxes(title_text=figure_text(xtitle), type="log" if logx else "linear")
    fig.update_yaxes(title_text=figure_text(ytitle), type="log" if logy else "linear")
    return fig


def grid(lo: float, hi: float, n: int = 80) -> np.ndarray:
    """``n`` concurrencies (or micro-batches) from ``lo`` to ``hi``, evenly spaced on a log axis."""
    return np.unique(np.round(np.geomspace(max(lo, 1), max(hi, lo + 1), n), 3))
