"""HTML section for an `lr fit` result: optimal lr against N and D with the fitted law, and tables."""

from __future__ import annotations

import math

from throughputlab.lr.law import LawAnalysis, LRFitReport
from throughputlab.report.page import Section


def _law_figure(a: LawAnalysis, axis: str):
    import plotly.graph_objects as go

    fig = go.Figure()
    pts = [o for o in a.optima if o.lr_opt is not None]
    label = "lr*" if a.quantity == "lr" else "effective lr*"
    x_of = (lambda o: o.params) if axis == "N" else (lambda o: o.tokens)
    other = (lambda o: o.tokens) if axis == "N" else (lambda o: o.params)
    coef = {c.name: c.value for c in a.law.coefs} if a.law else {}
    for val in sorted({other(o) for o in pts}):
        grp = sorted((o for o in pts if other(o) == val), key=x_of)
        xs = [x_of(o) for o in grp]
        ys = [o.lr_opt for o in grp]
        err_hi = [(o.lr_hi - o.lr_opt) if o.lr_hi is not None else 0 for o in grp]
        err_lo = [(o.lr_opt - o.lr_lo) if o.lr_lo is not None else 0 for o in grp]
        name = f"{'D' if axis == 'N' else 'N'}={val:.3g}"
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=name,
                                 error_y=dict(type="data", array=err_hi, arrayminus=err_lo)))
        if coef and len(xs) >= 2:
            ln_other = math.log(val)
            line = []
            for x in xs:
                ln, ld = (math.log(x), ln_other) if axis == "N" else (ln_other, math.log(x))
                line.append(math.exp(coef.get("c0", 0) + coef.get("alpha", 0) * ln + coef.get("beta", 0) * ld))
            fig.add_trace(go.Scatter(x=xs, y=line, mode="lines", name=f"law, {name}", line=dict(dash="dot"),
                                     showlegend=False))
    fig.update_layout(title=f"{label} against {axis} (points: fitted optimum with 95% interval; dotted: power law)",
                      xaxis_title="parameters N" if axis == "N" else "tokens D", yaxis_title=label,
                      xaxis_type="log", yaxis_type="log", height=420)
    return fig


def _tables(a: LawAnalysis):
    import pandas as pd

    label = "lr" if a.quantity == "lr" else "effective lr"
    opt = pd.DataFrame([dict(N=o.params, D=o.tokens, runs=o.n_runs, diverged=o.n_diverged, used=o.n_used,
                             **{f"{label}*": o.lr_opt, "95% lo": o.lr_lo, "95% hi": o.lr_hi},
                             loss=o.loss_at_opt, note=o.note) for o in a.optima])
    out = [(f"Optimal {label} per (N, D)", opt)]
    rows = []
    if a.law:
        rows += [dict(term=c.name, value=c.value, se=c.se, lo=c.lo, hi=c.hi, p=c.p_value) for c in a.law.coefs]
    if a.curvature and a.curvature.testable:
        rows += [dict(term=c.name + " (quadratic fit)", value=c.value, se=c.se, lo=c.lo, hi=c.hi, p=c.p_value)
                 for c in a.curvature.coefs]
    if rows:
        out.append((f"log {label}* law (natural logs)", pd.DataFrame(rows)))
    if a.holdouts:
        out.append((f"Held-out extrapolation of {label}*", pd.DataFrame([h.model_dump() for h in a.holdouts])))
    return out


def lr_fit_section(rep: LRFitReport) -> Section:
    """The report section for one `lr fit` result."""
    sec = Section(title="Learning-rate law", notes=list(rep.summary), anchor="lr-law")
    for a in (rep.lr, rep.effective):
        if a is None or not any(o.lr_opt is not None for o in a.optima):
            continue
        for axis in ("N", "D"):
            sec.figures.append(_law_figure(a, axis))
        sec.tables.extend(_tables(a))
    return sec
