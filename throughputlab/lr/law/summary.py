"""Words for an `lr fit` report: the lines `summarize` prints for the raw and the effective lr."""

from __future__ import annotations

from typing import Optional

from throughputlab.lr.law.models import Coef, LawAnalysis, LRFitReport


def _fmt_coef(c: Optional[Coef]) -> str:
    if c is None:
        return "n/a (one value on that axis)"
    if c.lo is None:
        return f"{c.value:+.3f} (no interval: too few groups)"
    return f"{c.value:+.3f} [{c.lo:+.3f}, {c.hi:+.3f}]"


def _analysis_lines(a: LawAnalysis, label: str) -> list[str]:
    lines = []
    located = [o for o in a.optima if o.lr_opt is not None]
    lines.append(f"{label}: optimum located in {len(located)} of {len(a.optima)} (N, D) groups")
    for o in a.optima:
        if o.lr_opt is None:
            lines.append(f"  N={o.params:.3g} D={o.tokens:.3g}: no optimum ({o.note})")
        elif o.note:
            lines.append(f"  N={o.params:.3g} D={o.tokens:.3g}: {o.note}")
    if a.law is None:
        lines.append("  law: not fitted (needs 2+ located optima)")
        return lines
    lines.append(f"  log {label}* = c0 + alpha log N + beta log D over {a.law.n_groups} groups: "
                 f"alpha {_fmt_coef(a.law.coef('alpha'))}, beta {_fmt_coef(a.law.coef('beta'))}"
                 + (f", residual sd {a.law.residual_sd:.3f} (log units)" if a.law.residual_sd is not None else ""))
    c = a.curvature
    if c is not None and c.testable:
        terms = ", ".join(f"{k.name} {k.value:+.3f} (p={k.p_value:.2g})" if k.p_value is not None
                          else f"{k.name} {k.value:+.3f}" for k in c.coefs)
        verdict = f"{c.direction} curvature detected" if c.detected else "no significant curvature"
        lines.append(f"  curvature: {verdict} (joint p={c.p_value:.2g}; {terms})")
    elif c is not None:
        lines.append(f"  curvature: not testable ({c.note})")
    for h in a.holdouts:
        z = f", {h.max_abs_z:.1f} standard errors" if h.max_abs_z is not None else ""
        lines.append(f"  extrapolating in {h.axis} to {h.held_out:.3g} (fit on {h.n_train_groups} groups): "
                     f"lr* off by x{h.error_factor:.3f}{z}")
    if a.preferred_extrapolation:
        lines.append(f"  extrapolation in {a.preferred_extrapolation} was more accurate here")
    return lines


def summarize(rep: LRFitReport) -> list[str]:
    lines = _analysis_lines(rep.lr, "lr")
    if rep.effective is not None:
        lines += _analysis_lines(rep.effective, "effective_lr")
        c_raw, c_eff = rep.lr.curvature, rep.effective.curvature
        if c_raw and c_eff and c_raw.testable and c_eff.testable:
            if c_raw.detected and not c_eff.detected:
                lines.append("the curvature in lr* goes away in the effective learning rate: "
                             "extrapolate the effective lr, then convert back with the norms")
            elif c_raw.detected and c_eff.detected:
                lines.append("the curvature stays in the effective learning rate too")
            elif not c_raw.detected and c_eff.detected:
                lines.append("the effective learning rate is curved while lr* is not")
    else:
        lines.append("no weight/update norms in the sweep: effective-lr analysis skipped")
    return lines
