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
        (sm_spec, sm_fit, _, sm_err), mx_err = candidates["smooth"][:4], candidates["max"][3]
        p_hard = abs(sm_fit.sol.x[-1] - sm_spec.hi[-1]) < 1e-4 * (sm_spec.hi[-1] - sm_spec.lo[-1])
        if sm_err is not None and mx_err is not None and sm_err < 0.9 * mx_err and not p_hard:
            chosen = "smooth"
    if "split" in candidates:  # on the decode step's held-out error when timed (a context axis moves the
        # prefill too, whose errors would otherwise decide), else on tokens/s
        i = 4 if candidates["split"][4] is not None and candidates[chosen][4] is not None else 3
        sp_err, best = candidates["split"][i], candidates[chosen][i]
        if sp_err is not None and best is not None and sp_err < 0.9 * best:
            chosen = "split"
    return chosen


def attention_note(chosen: str, obs: list, candidates: dict) -> str:
    contexts = sorted({round(o.s) for o in obs})
    if chosen == "split":
        i = 4 if candidates["split"][4] is not None else 3
        others = [v[i] for k, v in candidates.items() if k != "split" and v[i] is not None]
        return (f"fitted from contexts {contexts[0]} to {contexts[-1]}: the attention is its own kernel with its own "
                f"bandwidth BW_attn (per-kernel form, held-out {'decode-step' if i == 4 else 'tokens/s'} error "
                f"{_pct(candidates['split'][i])} against {_pct(min(others) if others else None)})")
    if "split" in candidates:
        i = 4 if candidates["split"][4] is not None and candidates[chosen][4] is not None else 3
        what = "decode-step" if i == 4 else "tokens/s"
        return (f"per-kernel form tried on contexts {contexts[0]} to {contexts[-1]} and not kept (held-out {what} "
                f"error {_pct(candidates['split'][i])} against {_pct(candidates[chosen][i])}): one roofline over the "
                "summed bytes and FLOPs")
    fix = "measure with --contexts to fit them"
    if len(contexts) == 1:
        span = f"one context ({contexts[0]} tokens)"
    elif contexts[-1] < SPLIT_CONTEXT_RATIO * contexts[0]:
        span = f"contexts {contexts[0]} to {contexts[-1]} (less than {SPLIT_CONTEXT_RATIO:g}x apart)"
        fix = f"measure with --contexts spanning {SPLIT_CONTEXT_RATIO:g}x or more to fit them"
    elif len(obs) < 6:
        span = f"{len(obs)} points, too few for one more parameter (6 or more)"
        fix = "add concurrencies (-c) for 6 points or more to fit them"
    else:
        span = "the per-kernel form was not tried"
    return (f"not identified: {span}; the decode bandwidth BW stands in for the KV reads and PHI for the "
            f"attention FLOPs ({fix})")


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"
