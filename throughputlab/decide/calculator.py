"""The decision: per batch size, step time, samples/s, samples-to-target, time-to-target, the
ratio test against the baseline, the learning rate, and the recommendation with its margin.

docs/model.md, "Decision": ``T(B) = N*(B) / q(B)``; a larger batch beats the baseline
only when its throughput gain ``q(B)/q(B0)`` exceeds its samples penalty ``N*(B)/N*(B0)``.
:func:`rank` is the pure core (given samples/s and N*); :func:`decide` builds the rows from
a throughput model, an RL shape and a samples-to-target source.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

from pydantic import Field, field_validator

from throughputlab.decide.backend import fsdp_note
from throughputlab.decide.cluster import (
    ClusterSpec,
    Placement,
    cross_node_note,
    domain_note,
    kv_tokens_from_gib,
    layout_notes,
    placements,
)
from throughputlab.decide.curves import CurvesResult, CurvesSpec, Direction, NStarParam, load_curves, parse_nstar
from throughputlab.decide.decision import Decision, Recommendation, Row, SampleUnit
from throughputlab.decide.devices import gpus_per_node_limit, host_link_rate, link_domain
from throughputlab.decide.notes import context_note, kv_limited_note, overlap_note, partial_notes, profile_notes
from throughputlab.decide.rollout import EngineCaps
from throughputlab.decide.steptime import DEFAULT_MAX_NUM_SEQS, RLShape, StepModel, critic_costs_for
from throughputlab.errors import UserError
from throughputlab.records.base import SettingsRecord
from throughputlab.throughput import ThroughputModel


class SamplesSpec(SettingsRecord):
    """Where samples-to-target comes from: learning curves (with a target) or a parametric N*."""

    curves: Optional[CurvesSpec] = None
    target: Optional[float] = Field(None, description="Metric value to reach (with --curves).")
    direction: Direction = Field("max", description="Whether the metric rises or falls to the target.")
    nstar: Optional[str] = Field(None, description="flat[:N=..,lo=..,hi=..] | mcandlish:N_min=..,B_noise=..")


class LRSpec(SettingsRecord):
    ref: Optional[float] = Field(None, description="Learning rate tuned at the baseline batch.")
    ref_prompts: Optional[int] = None  # reference batch in prompts per step (default: the baseline)
    rule: Literal["sqrt", "linear", "none"] = Field("sqrt", description="Learning-rate retuning rule.")

    @field_validator("ref", "ref_prompts")
    @classmethod
    def _positive(cls, v):
        if v is not None and not v > 0:  # (also refuses NaN)
            raise ValueError(f"must be a positive number, got {v}")
        return v


class DecideSpec(SettingsRecord):
    """Everything `throughputlab decide` needs; the spec file holds it, flags override it."""

    profile: Optional[str] = Field(None, description="Profile JSON, measured (`bench`) or predicted (`predict`).")
    train_profile: Optional[str] = None  # separate training devices measured on their own
    shape: RLShape = RLShape()
    prompts: list[int] = Field([], description=(  # default: the batch sizes in the curves
        "Candidate prompts per step, e.g. 128,256,512,1024."))
    group: int = Field(8, description="Responses per prompt (group size).")
    baseline: Optional[int] = Field(None, description=(  # default: the smallest candidate
        "Baseline prompts per step."))

    @field_validator("baseline")
    @classmethod
    def _baseline_positive(cls, v):
        if v is not None and v < 1:
            raise ValueError(f"must be a positive number of prompts, got {v}")
        return v
    sample_unit: SampleUnit = "responses"  # what a "sample" is in N*, samples/s and the curves' batch column
    samples: SamplesSpec = SamplesSpec(nstar="flat")
    lr: LRSpec = LRSpec()
    cluster: Optional[ClusterSpec] = None  # None: the profile's devices, colocated


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b is not None and b > 0 else None


def rank(rows: list[Row], baseline_index: int = 0, notes: Optional[list[str]] = None,
         flat_nstar: bool = False) -> tuple[list[Row], Optional[Recommendation], list[str]]:
    """The ratio test and the recommendation from rows holding samples/s and N*."""
    notes = list(notes or [])
    if not rows:
        raise UserError("no candidate batch sizes: give --prompts")
    base = rows[baseline_index]
    base.is_baseline = True
    for r in rows:
        r.throughput_gain = r.samples_per_s / base.samples_per_s
        r.samples_penalty = _ratio(r.nstar_samples, base.nstar_samples)
        t_rel = _ratio(r.nstar_samples, r.samples_per_s)
        r.time_to_target_s = None if r.nstar_relative else t_rel
        r.time_ratio = _ratio(t_rel, _ratio(base.nstar_samples, base.samples_per_s))
        if r.samples_penalty is not None:
            r.beats_baseline = None if r is base else r.throughput_gain > r.samples_penalty
    known = [r for r in rows if r.nstar_samples is not None]
    unknown = [r for r in rows if r.nstar_samples is None]
    for r in unknown:
        notes.append(f"{r.label}: samples-to-target {r.nstar_status or 'unknown'}, so no time-to-target")
    if base.nstar_samples is None:
        notes.append(f"the baseline ({base.label}) has no samples-to-target: ratios against it are unknown, "
                     "rows are ranked by their own time-to-target")
    if not known:
        return rows, None, notes
    order = sorted(known, key=lambda r: r.nstar_samples / r.samples_per_s)
    best = order[0]
    t_best = best.nstar_samples / best.samples_per_s
    runner = order[1] if len(order) > 1 else None
    margin = (runner.nstar_samples / runner.samples_per_s) / t_best - 1 if runner else None
    change: list[str] = []
    if runner is not None:
        change.append(f"{runner.label} would overtake it if its samples-to-target fell by more than "
                      f"{1 - 1 / (1 + margin):.0%} or its samples/s rose by more than {margin:.0%}")
    if best is not base and best.samples_penalty is not None:
        change.append(f"{best.label} beats the baseline while its samples penalty stays below its throughput gain "
                      f"{best.throughput_gain:.2f}x (now {best.samples_penalty:.2f}x)"
                      + ("" if best.nstar_relative else
                         f"; it breaks even at {base.nstar_samples * best.throughput_gain:.3g} samples to target"))
    elif best is base:
        larger = [r for r in known if r is not base and r.samples_penalty is not None and r.throughput_gain > 1]
        if larger:
            r = max(larger, key=lambda r: r.throughput_gain)
            change.append(f"a larger batch wins only when its samples penalty is below its throughput gain: "
                          f"{r.label} gains {r.throughput_gain:.2f}x but needs {r.samples_penalty:.2f}x the samples")
    if flat_nstar:
        change.append("samples-to-target is assumed flat, so throughput alone decides: a samples penalty larger "
                      "than the throughput gain would reverse it (measure learning curves to check)")
    if best.lr_retuned is False:
        change.append(f"its learning rate {best.lr:.3g} is not the rule's {best.lr_recommended:.3g}: "
                      "a retuned run may do better")
    rec = Recommendation(label=best.label, prompts=best.prompts, lr=best.lr, time_ratio=best.time_ratio,
                         runner_up=runner.label if runner else None, margin=margin, what_would_change=change)
    return rows, rec, notes


def decide_from_spec(spec: DecideSpec, adjust_step=None) -> list[Decision]:
    """Load the profile(s) named in the spec, fit them if needed, and decide for each placement of
    the cluster (one, or every one that fits with ``placement: search``), best first.
    ``adjust_step(step_model, step_time) -> StepTime``, when given, sees (and may rescale) every
    step time before it is ranked (decide/against.py: calibration from a run log)."""
    from throughputlab import roofline as rf
    from throughputlab.fit.load import load_or_fit
    from throughputlab.records.profile import Profile

    if not spec.profile:
        raise UserError("no profile: give --profile PROFILE.json (measured by `throughputlab bench` "
                        "or predicted by `throughputlab predict`)")
    prof = Profile.load(spec.profile)
    fit = load_or_fit(prof)  # the stored fit, else one made now (its PHI's identification feeds a note)
    # decide lays out training itself (FSDP, or Megatron's --train-tp/--train-pp/--train-ep): a profile predicted
    # with predict's --train-tp gives its per-device rates, its 2D layout is not carried over
    model = fit.model.model_copy(update={"train_tp": 1})
    train_model = load_or_fit(Profile.load(spec.train_profile)).model if spec.train_profile else None
    if train_model is not None:
        train_model = train_model.model_copy(update={"train_tp": 1})
    if model.train is None and train_model is None:
        raise UserError(f"the profile {spec.profile} has no training part (it measured generation only, as an "
                        "imported vLLM or GuideLLM benchmark does): name one as train_profile in the --spec file, "
                        "measured (`bench --only train`) or predicted (`predict --model M --gpu G -o train.json`)")
    block = spec.shape.engine.block_size
    if block is None and prof.engine is not None:
        block = prof.engine.engine_args.get("block_size")
    e = spec.shape.engine
    longest = spec.shape.prompt_len + spec.shape.response.resolve().longest()
    if e.max_model_len is not None and longest > e.max_model_len:
        raise UserError(f"--max-model-len {e.max_model_len} is below the prompt ({spec.shape.prompt_len}) plus the "
                        f"longest response ({longest - spec.shape.prompt_len}): the engine would refuse such requests; "
                        "raise it or lower the response cap (max= in --response-dist)")
    kv = e.kv_cache_tokens or (kv_tokens_from_gib(model, model.tp, e.kv_cache_gib) if e.kv_cache_gib else None)
    caps = EngineCaps(max_num_seqs=e.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
                      kv_cache_tokens=kv or model.kv_cache_tokens, block_size=int(block or 16))
    cluster = spec.cluster
    legacy = cluster is None and (spec.train_profile is not None or spec.shape.overlap != "colocated")
    if legacy and spec.train_profile is None and model.train_devices > 1:
        raise UserError(f"--overlap {spec.shape.overlap} needs separate devices, and the profile's {model.train_devices} "
                        "GPUs are one colocated cluster: use --placement split (with --gen-gpus)")
    if legacy:
        one = decide(spec, model, train_model=train_model, bytes_per_param=prof.bytes_per_param, caps=caps,
                     adjust_step=adjust_step, device=getattr(prof.hardware, "device_name", None))
        one.notes.extend(profile_notes(prof, fit))
        return [one]
    cluster = cluster or ClusterSpec()
    if cluster.placement == "colocated" and spec.shape.overlap != "colocated":
        raise UserError(f"--overlap {spec.shape.overlap} needs separate devices: use --placement split")
    seq = spec.shape.prompt_len + spec.shape.response.resolve().longest()
    act = rf.activation_bytes_per_sequence(prof.model, seq, prof.bytes_per_param,
                                           spec.shape.train.activation_checkpointing)
    decisions, left_out = [], []
    domain, domain_source = link_domain(prof.hardware)
    candidates = placements(model, cluster, domain, host_link_rate(prof.hardware)[0], gpus_per_node_limit(prof.hardware))
    for pl in candidates:
        try:
            decisions.append(decide(spec, model, train_model=train_model, bytes_per_param=prof.bytes_per_param,
                                    caps=caps, placement=pl, cluster=cluster, activation_per_sequence=act,
                                    on_gpu=prof.hardware.device_type == "cuda", adjust_step=adjust_step,
                                    device=getattr(prof.hardware, "device_name", None)))
        except UserError as err:
            if cluster.placement != "search":
                raise
            left_out.append(f"placement {pl.labelled(_trainer_name(spec.shape.train))} left out: {err}")
    if not decisions:
        raise UserError(f"no placement on {cluster.gpus or model.train_devices} GPU(s) can train this model: "
                        "not even one sequence fits per device; add GPUs (--gpus) or give "
                        "--activation-checkpointing")
    decisions = sorted(decisions, key=best_time)
    decisions[0].notes.extend(left_out)
    decisions[0].notes.extend(profile_notes(prof, fit))
    decisions[0].notes.extend(layout_notes(model, decisions[0].placement, cluster, domain))
    decisions[0].notes.extend(unused_layout_notes(spec.shape.train))
    note = domain_note(candidates[0], domain_source)
    if note:
        decisions[0].notes.append(note)
    limit = prof.model.context_limit
    if limit and seq > limit:
        decisions[0].notes.append(
            f"prompt {spec.shape.prompt_len} + longest response {seq - spec.shape.prompt_len} = {seq} tokens is past "
            f"{prof.model.name}'s {prof.model.context_limit_name} ({limit}): the model cannot generate that long, and these "
            "figures extrapolate; shorten --prompt-len or the response lengths")
    return decisions


def _trainer_name(train) -> str:
    return "FSDP" if train.backend != "megatron" else f"Megatron TP {train.tp} x PP {train.pp} x EP {train.ep}"


def unused_layout_notes(train) -> list[str]:
    """Megatron's layout set with the FSDP backend: said in the notes, never silently dropped."""
    set_ = [f"{k} {getattr(train, k)}" for k in ("tp", "pp", "ep") if getattr(train, k) > 1]
    if train.backend == "megatron" or not set_:
        return []
    return [f"train {', '.join(set_)} ignored: they lay out Megatron's training, and the training backend is FSDP "
           "(every training GPU holds a shard of the whole model); set --train-backend megatron to use them"]


def best_time(d: Decision) -> float:
    """The best known time-to-target of a decision (relative when N* is flat without a value)."""
    if d.recommendation is None:
        return math.inf
    best = next(r for r in d.rows if r.label == d.recommendation.label)
    return best.nstar_samples / best.samples_per_s if best.nstar_samples else math.inf


def decide(spec: DecideSpec, model: ThroughputModel, train_model: Optional[ThroughputModel] = None,
           bytes_per_param: Optional[int] = None, caps: Optional[EngineCaps] = None,
           placement: Optional[Placement] = None, cluster: Optional[ClusterSpec] = None,
           activation_per_sequence: Optional[float] = None, on_gpu: bool = False, adjust_step=None,
           device: Optional[str] = None) -> Decision:
    """Build the rows from the throughput model and the spec, then :func:`rank` them."""
    if spec.group < 1:
        raise UserError(f"--group must be a positive integer, got {spec.group}")
    s = spec.samples
    unit_mult = 1 if spec.sample_unit == "prompts" else spec.group
    curves: Optional[CurvesResult] = None
    param: Optional[NStarParam] = None
    if s.curves is not None:
        if s.target is None:
            raise UserError("--curves needs --target (the metric value to reach) and --direction max|min")
        base_batch = spec.baseline * unit_mult if spec.baseline else None
        curves = load_curves(s.curves, s.target, s.direction, base_batch)
    elif s.nstar:
        param = parse_nstar(s.nstar)
    else:
        raise UserError("samples-to-target has no source: give --curves CSV --target X, or --nstar flat|mcandlish:..")

    prompts = sorted(set(spec.prompts))
    if not prompts and curves is not None:
        for c in curves.configs:
            p = c.batch / unit_mult
            if p != int(p):
                raise UserError(f"curves batch size {c.batch:g} is not a whole number of prompts at group "
                                f"{spec.group}: check --group or sample_unit")
        prompts = sorted({int(c.batch / unit_mult) for c in curves.configs})
    if not prompts:
        raise UserError("no candidate batch sizes: give --prompts 128,256,512")
    if any(p < 1 for p in prompts):
        raise UserError(f"--prompts values must be positive integers, got {', '.join(map(str, prompts))}")
    if curves is not None and not any(curves.for_batch(p * unit_mult) for p in prompts):
        have = ", ".join(f"{c.batch:g}" for c in curves.configs)
        other = "prompts" if spec.sample_unit == "responses" else "responses"
        raise UserError(f"no candidate batch size has a learning curve: the curves hold batch sizes {have} "
                        f"({spec.sample_unit}); if their batch column counts {other}, set sample_unit: {other}")
    baseline = spec.baseline or prompts[0]
    if baseline not in prompts:
        prompts = sorted({*prompts, baseline})

    critic = critic_costs_for(spec.shape, bytes_per_param) if bytes_per_param else None
    steps = StepModel(model, spec.shape, train_model=train_model, critic_costs=critic,
                      caps=caps, placement=placement, cluster=cluster,
                      activation_per_sequence=activation_per_sequence, on_gpu=on_gpu, device=device)
    lay = steps.layout
    placed = None if placement is None else placement.labelled(_trainer_name(spec.shape.train))
    gen = steps.model
    engine = "" if gen.engine is None or gen.source == "fit" else f"; engine {gen.engine.name}" + (
        " (prefill in steps of its own, the decodes waiting)" if gen.separate_prefill else "")
    notes = [overlap_note("off-policy" if placement is not None and placement.kind == "split"
                          and spec.shape.overlap != "separate" else spec.shape.overlap),
             f"response lengths: {steps.dist.describe()}",
             f"engine limits{' (each engine)' if placement is not None else ''}: {steps.caps.describe()}{engine}"]
    if placement is not None:
        notes.insert(0, f"placement: {placed}; each engine drains its share of the batch (whole prompts), "
                        "the step waits for the slowest")
        notes.append(f"weight sync {steps.sync_s:.3g} s per step"
                     + (" as modelled, before the calibration to the log" if adjust_step is not None else "")
                     + (" (gather from FSDP" if lay is None else " (gather from the Megatron shards")
                     + ", load into the engines"
                     + (f", engines' sleep and wake at vLLM sleep level {steps.cluster.sleep_level}"
                        if placement.kind == "colocated" and on_gpu else "") + ")")
    if steps.offload_s:
        tr = spec.shape.train
        notes.append(f"host offload {steps.offload_s:.3g} s per step: each training GPU's parameters x "
                     f"{tr.offload_param_copies:g}, fp32 gradients x {tr.offload_grad_copies:g} and optimizer state x "
                     f"{tr.offload_optimizer_copies:g} over the host link (decide/offload.py)")
    if spec.shape.reward.per_response_s:
        notes.append(f"scoring the responses on the host: {spec.shape.reward.per_response_s:g} s each on "
                     f"{spec.shape.reward.workers} process(es), after the rollout inside gen (overlapped steps: a stage "
                     "of its own beside generation and training; shape.reward, roofline.rl.reward_s)")
    if steps.group_share:
        notes.append(f"GRPO: the {spec.group} responses of a prompt share its prefill and KV cache (prefix caching)")
    if spec.shape.train.activation_checkpointing:
        notes.append("activation checkpointing: the forward is recomputed in the backward")
    span = cross_node_note(placement, steps.model) if placement is not None else None
    if span:
        notes.append(span)
    if placement is not None or steps.layout is not None:
        gpus = placement.train_gpus if placement is not None else 1
        notes.append(steps.layout.describe(gpus) if steps.layout is not None else fsdp_note(gpus, steps.sp))
    if steps.slack_steps > 1:
        notes.append(f"{steps.slack_steps} steps off-policy: each engine drains {steps.slack_steps} steps' samples "
                     f"as one queue and a step is charged 1/{steps.slack_steps} of its wall time (the longest "
                     "responses overlap later steps: generation is throughput-bound, not the makespan of one step)")
    elif spec.shape.off_policy_steps > 1:
        notes.append(f"shape.off_policy_steps {spec.shape.off_policy_steps} is unused: generation and training do "
                     "not overlap in this placement")
    if spec.shape.partial_rollout:
        notes.append(f"partial rollouts: {spec.shape.partial_rollout:.0%} more prompts in flight, generation ends "
                     "when the batch's prompts are done and unfinished responses resume in the next step "
                     "(steady state; gen is the partial rollout's)")

    lr_ref, lr_ref_batch = spec.lr.ref, (spec.lr.ref_prompts or baseline) * unit_mult
    if lr_ref is None and curves is not None:
        base_cfgs = curves.for_batch(lr_ref_batch)
        if base_cfgs and base_cfgs[0].lr is not None:
            lr_ref = base_cfgs[0].lr
    from throughputlab.lr.rules import scale_lr

    rows: list[Row] = []
    base_index = 0
    for p, st in zip(prompts, steps.steps(prompts, spec.group)):
        if adjust_step is not None:
            st = adjust_step(steps, st)
        b = float(p * unit_mult)
        q = b / st.step_s
        rec_lr = scale_lr(lr_ref, lr_ref_batch, b, spec.lr.rule) if lr_ref is not None else None
        common = dict(prompts=p, group=spec.group, batch_samples=b, step=st, step_s=st.step_s, samples_per_s=q,
                      lr_recommended=rec_lr)
        if p == baseline:
            base_index = len(rows)
        if curves is not None:
            cfgs = curves.for_batch(b)
            if not cfgs:
                rows.append(Row(label=f"{p} prompts", lr=rec_lr, nstar_status="no learning curve at this batch size",
                                **common))
            # the baseline row is the curve at the reference learning rate when there are several
            if p == baseline and lr_ref is not None and len(cfgs) > 1:
                cfgs = sorted(cfgs, key=lambda c: abs(math.log((c.lr or lr_ref) / lr_ref)))
            for c in cfgs:
                retuned = None
                if c.lr is not None and rec_lr is not None:
                    retuned = abs(c.lr / rec_lr - 1) <= 0.05
                label = f"{p} prompts" + (f", lr {c.lr:.3g}" if c.lr is not None and len(cfgs) > 1 else "")
                rows.append(Row(label=label, lr=c.lr if c.lr is not None else rec_lr, lr_retuned=retuned,
                                nstar_samples=c.nstar_samples, nstar_low=c.nstar_low, nstar_high=c.nstar_high,
                                nstar_status=c.status, invariant=c.invariant, **common))
        else:
            n, status = param.nstar(b)
            rows.append(Row(label=f"{p} prompts", lr=rec_lr, nstar_samples=n, nstar_status=status,
                            nstar_relative=param.kind == "flat" and param.n is None, **common))
    rows, rec, notes = rank(rows, base_index, notes, flat_nstar=param is not None and param.kind == "flat")
    notes.extend(partial_notes(rows, rec))
    kv = kv_limited_note(rows)
    if kv:
        notes.append(kv)
    extrapolated = context_note(model, rows)
    if extrapolated:
        notes.append(extrapolated)
    if curves is not None:
        differing = [c.label for c in curves.configs if c.invariant is False]
        if differing:
            notes.append("curves differ from the baseline at equal samples (not batch-size invariant): "
                         + "; ".join(differing))
        elif any(c.invariant for c in curves.configs if c.gap_to_baseline):
            notes.append("the curves overlap at equal samples: batch-size invariant within tolerance")
    return Decision(rows=rows, baseline=rows[base_index].label, sample_unit=spec.sample_unit, recommendation=rec,
                    notes=notes, overlap=spec.shape.overlap, placement=placed,
                    nstar_source=f"learning curves {curves.source}, target {curves.target:g} ({curves.direction})"
                    if curves else param.describe(), lr_rule=spec.lr.rule, curves=curves)
