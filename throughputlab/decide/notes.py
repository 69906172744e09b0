"""The decision's notes on what bends it: the profile's fit, the KV cache, contexts past the
measured ones, partial rollouts, and how far the step model has been from published RL runs."""

from __future__ import annotations

from typing import Optional

from throughputlab.decide.decision import Decision, Recommendation, Row

CONTEXT_EXTRAPOLATION = 2.0  # noted when the rollouts' steps read this many times the measured cached tokens


def cached_tokens_read(r) -> float:
    """About the most cached tokens one decode step of this rollout reads: its peak concurrency at the
    prompt plus the longest response, within the KV cache."""
    ro = r.step.rollout
    most = ro.peak_concurrency * (ro.prompt_len + ro.response_len_max)
    return float(min(most, ro.caps.kv_cache_tokens) if ro.caps.kv_cache_tokens else most)


def context_note(model, rows: list[Row]) -> Optional[str]:
    """Say when the simulated decode steps read far more cached tokens (concurrency x context) than
    any measured decode step did: the attention term is then an extrapolation of the fit."""
    if not rows or model.decode is None or model.source != "fit":
        return None
    measured = model.decode.measured_cached_tokens
    read = max(cached_tokens_read(r) for r in rows)
    if measured is None or read <= CONTEXT_EXTRAPOLATION * measured:
        return None
    return (f"context: the rollouts' decode steps read up to about {read:,.0f} cached tokens (concurrency x "
            f"context), {read / measured:.0f}x the most the profile measured ({measured:,.0f}); the attention "
            "term is extrapolated that far. Measure with `bench --contexts` up to the response lengths to check it")


def partial_notes(rows: list[Row], rec: Optional[Recommendation]) -> list[str]:
    """The rollout time partial rollouts save and their off-policy share, at the baseline and the best."""
    out = []
    picks = [r for r in rows if r.is_baseline] + [r for r in rows if rec is not None and r.label == rec.label]
    for r in {r.label: r for r in picks}.values():
        pr = r.step.partial if r.step is not None else None
        if pr is not None:
            out.append(f"partial rollouts at {r.label}: generation {pr.gen_s:.3g} s against {pr.full_gen_s:.3g} s "
                       f"without ({pr.saved_share:.0%} saved); {pr.off_policy_token_share:.0%} of the trained "
                       f"tokens were generated under an older policy; {pr.carried_responses} responses carried over")
    return out


def kv_limited_note(rows: list[Row]) -> Optional[str]:
    """Which batches the KV cache, not the sequence cap, held back, and what it cost in preemptions."""
    seen: dict[int, int] = {}
    for r in rows:
        ro = r.step.rollout
        if ro.kv_limited:
            seen[r.prompts] = ro.preemptions
    if not seen:
        return None
    cells = ", ".join(f"{p} prompts ({n} preemption{'s' if n != 1 else ''})" for p, n in sorted(seen.items()))
    return (f"the KV cache limited admission at {cells} in the slowest engine: fewer sequences ran at once than the "
            "engine's sequence cap, and a preempted request recomputes its prefill")


def profile_notes(prof, fit) -> list[str]:
    """What the profile's fit leaves open that bends the decision."""
    from throughputlab.fit.schema import phi_is_a_floor

    if fit is None or not phi_is_a_floor(fit.generation):
        return []
    c_top = max(p.concurrency for p in prof.generation if p.status == "ok")
    return [f"every concurrency the profile measured (up to {c_top}) was memory-bound, so its compute rate is only a "
            "floor: generation at higher concurrency is predicted no faster than that floor allows, which favours "
            "smaller batches; measure at higher concurrency (`throughputlab bench --resume -c LIST -o PROFILE` adds "
            "the points)"]


def overlap_note(overlap: str) -> str:
    return {
        "colocated": "colocated: generation, log-probs, training and weight sync run in sequence on the same devices",
        "separate": "separate devices: phases still in sequence (on-policy), weights synced across the link",
        "off-policy": "one-step off-policy: the next batch generates while this one trains, "
                      "t_step = max(t_gen, t_logprob + t_train) + t_sync",
    }[overlap]


def step_band(d: Decision, framework: Optional[str]) -> Optional[str]:
    """An analytic profile's step times against published RL runs of the framework and placement
    (spread.rl_step_spread): sets ``d.step_spread`` and says what the baseline's step could be."""
    from throughputlab.spread import rl_step_spread

    base = next((r for r in d.rows if r.is_baseline and r.step_s), None)
    if base is None:
        return None
    placement = "colocated" if not d.placement or d.placement.startswith("colocated") else "split"
    s = rl_step_spread(framework, placement)
    if s is None:
        return None
    d.step_spread = s
    lo, hi = s.time(base.step_s)
    return (f"step times: on published runs the predicted step was {s.lo:.2f}-{s.hi:.2f}x the published ({s.basis}): "
            f"the baseline's {base.step_s:.3g} s could be {lo:.3g}-{hi:.3g} s. Batch sizes compared on one setup share "
            "much of that error; their ratios move less")
