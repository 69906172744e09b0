"""The page builder every HTML section goes through: the page's escaping and plotly inlining live
here only (text inside a plotly figure is escaped by plotting.figure_text). A leaf: it imports
nothing from report/."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

esc = html.escape


@dataclass
class Section:
    """One titled block of the report: text notes, plotly figures and tables, in that order."""

    title: str
    notes: list[str] = field(default_factory=list)  # plain text, escaped when rendered
    figures: list[Any] = field(default_factory=list)  # plotly.graph_objects.Figure
    tables: list[tuple[str, Any]] = field(default_factory=list)  # (caption, pandas.DataFrame)
    anchor: Optional[str] = None


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1200px;padding:1rem 2rem;color:#222}
h1{font-size:1.6rem;margin-bottom:.2rem} h2{font-size:1.25rem;border-bottom:1px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0 1rem} th,td{border:1px solid #ddd;padding:.2rem .5rem;text-align:right}
th{background:#f4f4f4} td:first-child,th:first-child{text-align:left} caption{text-align:left;font-weight:600;padding:.3rem 0}
.note{color:#444;margin:.3rem 0} .figure{margin:.5rem 0 1rem} nav a{margin-right:1rem}
"""


def table_html(df, caption: str = "", float_format: str = "{:.4g}") -> str:
    """A DataFrame as an escaped HTML table (numbers formatted, None shown as an empty cell)."""
    head = "".join(f"<th>{esc(str(c))}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        cells = []
        for v in row:
            if v is None or (isinstance(v, float) and v != v):
                cells.append("<td></td>")
            elif isinstance(v, float):
                cells.append(f"<td>{esc(float_format.format(v))}</td>")
            else:
                cells.append(f"<td>{esc(str(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_html(title: str, sections: Sequence[Section], subtitle: str = "") -> str:
    """Whole page; plotly.js is inlined once so the file works offline."""
    from plotly.offline import get_plotlyjs

    parts = []
    nav = []
    for i, s in enumerate(sections):
        anchor = s.anchor or f"s{i}"
        nav.append(f'<a href="#{esc(anchor)}">{esc(s.title)}</a>')
        parts.append(f'<section id="{esc(anchor)}"><h2>{esc(s.title)}</h2>')
        parts.extend(f'<p class="note">{esc(n)}</p>' for n in s.notes)
        for fig in s.figures:
            parts.append('<div class="figure">' + fig.to_html(full_html=False, include_plotlyjs=False,
                                                              config={"displaylogo": False}) + "</div>")
        for caption, df in s.tables:
            parts.append(table_html(df, caption))
        parts.append("</section>")
    return (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title><style>{_CSS}</style>"
        f'<script type="text/javascript">{get_plotlyjs()}</script></head><body>'
        f"<h1>{esc(title)}</h1><p class=\"note\">{esc(subtitle)}</p><nav>{''.join(nav)}</nav>"
        + "".join(parts) + "</body></html>"
    )
