"""Choosing the decode step's form by held-out error: the hard maximum, the smooth maximum, or the
per-kernel form (the weight GEMMs and the attention each on a roofline of its own), and saying
what the attention terms are (docs/model.md)."""

from __future__ import annotations

from typing import Optional

SPLIT_CONTEXT_RATIO = 2.0  # the per-kernel form is tried when the mean contexts span at least this ratio


def choose_form(candidates: dict) -> str:
    """A form with one more parameter is kept only when it predicts held-out points clearly better
    (10% lower mean error). The smooth maximum must not be the hard max again (p at its upper bound);
    p = 1, its lower bound, is the sum of the two terms: memory and compute not overlapped. The split
    (per-kernel) form is tried only on a context axis, and must beat the better of the other two."""
    chosen = "max"
    if "smooth" in candidates:
        (sm_spec, sm_fit, _, sm_err), (_, _, _, mx_err) = candidates["smooth"], candidates["max"]
        p_hard = abs(sm_fit.sol.x[-1] - sm_spec.hi[-1]) < 1e-4 * (sm_spec.hi[-1] - sm_spec.lo[-1])
        if sm_err is not None and mx_err is not None and sm_err < 0.9 * mx_err and not p_hard:
            chosen = "smooth"
    if "split" in candidates:
        sp_err, best = candidates["split"][3], candidates[chosen][3]
        if sp_err is not None and best is not None and sp_err < 0.9 * best:
            chosen = "split"
    return chosen


def attention_note(chosen: str, obs: list, errors: dict) -> str:
    contexts = sorted({round(o.s) for o in obs})
    if chosen == "split":
        return (f"fitted from contexts {contexts[0]} to {contexts[-1]}: the attention is its own kernel with its own "
                "bandwidth BW_attn (per-kernel form, lower held-out error)")
    if "split" in errors:
        return (f"per-kernel form tried on contexts {contexts[0]} to {contexts[-1]} and not kept (held-out error "
                f"{_pct(errors['split'])} against {_pct(errors[chosen])}): one roofline over the summed bytes and FLOPs")
    if len(contexts) == 1:
        span = f"one context ({contexts[0]} tokens)"
    elif contexts[-1] < SPLIT_CONTEXT_RATIO * contexts[0]:
        span = f"contexts {contexts[0]} to {contexts[-1]} (less than {SPLIT_CONTEXT_RATIO:g}x apart)"
    else:
        span = f"{len(obs)} points, too few for one more parameter (6 or more)"
    return (f"not identified: {span}; the decode bandwidth BW stands in for the KV reads and PHI for the "
            "attention FLOPs (measure with --contexts to fit them)")


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"
