"""One RL step: ``t_step = t_gen + t_logprob + t_train + t_offload + t_sync`` (docs/model.md, "Rollout").

``t_gen`` comes from the rollout simulation; the log-prob forward passes (old policy, reference), the
policy update (epochs x mini-batches x micro-batches with gradient accumulation, an optimizer step per
mini-batch), the critic of PPO (its own model size), host offload between phases (decide/offload.py) and
the weight sync from the throughput model. Colocated and separate devices run the phases in sequence;
one-step off-policy overlaps generation of the next batch with training on this one:
``t_step = max(t_gen, t_logprob + t_train + t_offload) + t_sync``."""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np
from pydantic import BaseModel, ConfigDict

from throughputlab import roofline as rf
from throughputlab.decide import backend as be
from throughputlab.decide.cluster import (
    ClusterSpec,
    Placement,
    generation_model,
    idle_shares,
    split_over_engines,
    sync_s,
    training_model,
)
from throughputlab.decide.offload import offload_s
from throughputlab.decide.partial import PartialRollout, partial_rolls
from throughputlab.decide.rollout import EngineCaps, RolloutResult, simulate_rollouts
from throughputlab.decide.shape import (  # noqa: F401  (re-exported: the shape's home before the split)
    OVERLAPS,
    CriticShape,
    EngineShape,
    Overlap,
    ResponseSpec,
    RLShape,
    SyncShape,
    TrainShape,
)
from throughputlab.errors import UserError
from throughputlab.roofline import Costs
from throughputlab.roofline import rl as rf_rl
from throughputlab.throughput import ThroughputModel

DEFAULT_MAX_NUM_SEQS = 1024  # veRL's rollout default; the bench's largest concurrency is no engine setting
log = logging.getLogger(__name__)


class StepTime(BaseModel):
    """The parts of one RL step for one batch; times in seconds."""

    model_config = ConfigDict(extra="forbid")
    prompts: int
    group: int
    responses: int
    overlap: Overlap
    gen_s: float
    logprob_s: float
    train_s: float
    critic_s: float
    sync_s: float
    step_s: float
    offload_s: float = 0.0  # training state to host memory and back (decide/offload.py)
    reward_s: float = 0.0  # scoring the responses on the host: inside gen_s, or its own stage when overlapped
    micro_batch: int
    optimizer_steps: int
    seq_len_mean: float  # tokens a training pass computes per sequence (padded passes: the padded length)
    real_len_mean: Optional[float] = None  # prompt plus mean response: what token budgets count (veRL: the mask)
    critic_seq_len_mean: Optional[float] = None  # the critic's, where its padding differs from the policy's
    rollout: RolloutResult  # the slowest engine's
    placement: Optional[str] = None
    engines: int = 1
    engine_prompts: list[int] = []  # prompts each engine drained
    gen_engine_mean_s: Optional[float] = None  # mean over engines (the step waits for the slowest)
    train_devices: int = 1
    idle_share: dict[str, float] = {}
    prefix_sharing: bool = False
    partial: Optional[PartialRollout] = None  # with partial rollouts: gen_s is theirs, against full rollouts
    off_policy_steps: int = 1  # steps of slack generation had (gen_s: 1/k of k steps' samples drained at once)

    @property
    def samples_per_s(self) -> float:
        return self.responses / self.step_s


def _passes_s(n: int, mb: int, seq_len: float, one) -> float:
    """``n`` sequences in micro-batches of ``mb`` (the last one partial)."""
    full, rest = divmod(n, mb)
    return full * one(mb, seq_len) + (one(rest, seq_len) if rest else 0.0)


def micro_batch_for(model: ThroughputModel, requested: Optional[int], what: str = "train.micro_batch") -> int:
    mb = model.max_micro_batch()
    if requested is not None:
        if requested < 1:
            raise UserError(f"{what} must be a positive integer, got {requested}")
        if mb is not None and requested > mb:
            log.warning("%s %d is above the %d sequences that the memory model fits on a training device: the "
                        "step times assume it runs", what, requested, max(mb, 0))
        return requested
    if mb is None:
        raise UserError(f"the profile records no training memory, so the largest micro-batch is unknown: "
                        f"set {what} in the RL shape file")
    if mb < 1:
        raise UserError("not even one sequence fits in device memory for training: use more training GPUs "
                        "(--gpus), --activation-checkpointing, sequence parallelism (--sequence-parallel K:"
                        " Ulysses under FSDP, context parallelism under Megatron), under Megatron larger --train-tp, "
                        "--train-pp or --train-ep, or a device with more memory (--set shape.train.micro_batch=N "
                        "overrides this check)")
    return mb


class StepModel:
    """Evaluates RL step times for one throughput model and one RL shape (many batch sizes)."""

    def __init__(self, model: ThroughputModel, shape: RLShape, train_model: Optional[ThroughputModel] = None,
                 critic_costs: Optional[Costs] = None, caps: Optional[EngineCaps] = None,
                 placement: Optional[Placement] = None, cluster: Optional[ClusterSpec] = None,
                 activation_per_sequence: Optional[float] = None, on_gpu: bool = False,
                 device: Optional[str] = None):
        """With a ``placement`` the batch is divided over its engines and training is FSDP over its
        training devices (see decide/cluster.py); without one, one engine and one training device."""
        self.shape = shape
        self.placement = placement
        self.cluster = cluster or ClusterSpec()
        self.on_gpu = on_gpu
        self.dist = shape.response.resolve()
        # memory must hold the longest sequence (a padded pass: every sequence at the padded length)
        self.train_seq_len = max(shape.prompt_len + self.dist.longest(), shape.train.padded_seq_len or 0)
        train_model, self.train_rate_note = be.backend_train_model(train_model or model, shape.train.backend, device)
        if placement is not None:
            model.require("decode")
            train_model = training_model(train_model or model, placement, shape.train.activation_checkpointing,
                                         self.train_seq_len, activation_per_sequence)
            model = generation_model(model, placement, self.cluster, shape.engine)
        elif shape.train.activation_checkpointing:
            train_model = (train_model or model).model_copy(update={"activation_checkpointing": True})
        self.model = model
        self.train_model = train_model or model
        self.train_model.require("train")
        e = shape.engine
        self.caps = caps or EngineCaps(max_num_seqs=e.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
                                       kv_cache_tokens=e.kv_cache_tokens or model.kv_cache_tokens,
                                       block_size=e.block_size or 16)
        if placement is not None and e.kv_cache_tokens is None:
            self.caps = self.caps.model_copy(update={"kv_cache_tokens": model.kv_cache_tokens})
        if placement is not None and model.engine is not None and model.source != "fit":  # the run's engine's
            update = {} if e.block_size is not None else {"block_size": model.engine.block_tokens}
            if e.max_num_seqs is None and model.engine.name == "sglang":
                update["max_num_seqs"] = model.max_num_seqs  # SGLang's own request cap, from its KV pool
            self.caps = self.caps.model_copy(update=update)
        tr = shape.train
        for name, v in (("train.epochs", tr.epochs), ("train.mini_batches", tr.mini_batches),
                        ("train.mini_batch_samples", 1 if tr.mini_batch_samples is None else tr.mini_batch_samples)):
            if v < 1:
                raise UserError(f"{name} must be a positive integer, got {v}")
        self.layout = be.layout_for(tr, placement.train_gpus if placement is not None else 1,
                                 placement.link_group if placement is not None else 8)
        self.sp = tr.sequence_parallel if self.layout is None else 1  # Ulysses: budgets and micro-batches per group
        if (train_gpus := placement.train_gpus if placement is not None else 1) % self.sp:
            raise UserError(f"train.sequence_parallel {self.sp} does not divide the {train_gpus} training GPU(s): each "
                            "sequence-parallel group needs that many GPUs; give a size that divides them")
        budget, lp_budget = (b and b * self.sp for b in (tr.token_budget, tr.logprob_token_budget))
        mem = be.memory_model(self.train_model, self.layout, sp=self.sp)
        self.micro_batch = micro_batch_for(mem, tr.micro_batch if not budget else
                                           rf.budget_micro_batch(budget, self.train_seq_len))
        self.logprob_micro_batch = micro_batch_for(
            be.memory_model(self.train_model, self.layout, forward=True, sp=self.sp),
            rf.budget_micro_batch(lp_budget, self.train_seq_len) if lp_budget else
            tr.logprob_micro_batch or self.micro_batch, "train.logprob_micro_batch")
        self.critic_model: Optional[ThroughputModel] = None
        if shape.algo == "ppo":
            costs = rf_rl.value_model_costs(critic_costs or self.train_model.costs)  # a value head, no vocabulary
            self.critic_model = self.train_model.model_copy(update={"costs": costs})
            cs = shape.critic or CriticShape()
            cmb = rf.budget_micro_batch(cs.token_budget * self.sp, self.train_seq_len) if cs.token_budget else \
                cs.micro_batch
            self.critic_micro_batch = micro_batch_for(mem, cmb or self.micro_batch, "critic.micro_batch")
        if self.layout is not None:
            self.layout = _RatedLayout(**self.layout.model_dump(), rate_note=self.train_rate_note)
        self.sync_s = self._sync_s()
        self.offload_s = offload_s(self.train_model, tr, placement.train_gpus if placement is not None else 1,
                                   self.layout, placement.per_node if placement else 1, placement and placement.host_rate)
        self.overlapped = shape.overlap == "off-policy" or (placement is not None and placement.kind == "split"
                                                            and shape.overlap != "separate")
        # k steps of slack: the engines' queue holds k steps' samples (docs/model.md, "k steps off")
        self.slack_steps = shape.off_policy_steps if self.overlapped else 1

    @property
    def group_share(self) -> bool:
        return self.shape.algo == "grpo" and self.shape.prefix_sharing

    def _sync_s(self) -> float:
        s = self.shape.sync
        bw = s.bytes_per_s
        if bw is not None and bw <= 0:
            raise UserError(f"sync.bytes_per_s must be positive, got {bw}")
        if self.placement is not None:
            return sync_s(self.train_model, self.placement, self.cluster, bw, s.latency_s, self.on_gpu, s.pipelined)
        if bw is None:
            if self.shape.overlap != "colocated":
                raise UserError(f"with --overlap {self.shape.overlap} the weights cross devices: set sync.bytes_per_s "
                                "(the link's bandwidth in bytes/s) in the RL shape file")
            d = self.model.require("decode")
            return rf.device_copy_s(rf.sync_weight_bytes(self.model.costs), d.bw_bytes_per_s, s.latency_s)
        return rf.transfer_s(rf.sync_weight_bytes(self.model.costs), bw, s.latency_s)

    def _launch_s(self, model: ThroughputModel, backward: bool) -> float:
        """The per-layer launch cost of one pass (:func:`rf.pass_launch_s`) for an analytic profile; a
        measured one holds its own in its fitted micro-step intercept."""
        if model.source != "analytic":
            return 0.0
        return rf.pass_launch_s(model.costs.num_layers, backward, model.activation_checkpointing,
                                fsdp=self.layout is None)

    def _pass(self, model: ThroughputModel, backward: bool):
        """One micro-batch's time (b sequences of s tokens): a forward, or forward and backward, plus its
        launches and the RL loss's pass over the logits (the policy's, not a critic's value head); with
        Megatron, on one model replica (decide/backend.py)."""
        launch = self._launch_s(model, backward)
        if self.layout is not None:
            one = be.megatron_pass(model, self.layout, backward, launch)
        elif self.sp > 1:
            one = be.ulysses_pass(model, self.sp, backward, launch)
        else:
            step = model.train_step_s if backward else model.forward_s
            one = lambda b, s: step(b, s) + launch  # noqa: E731
        if model is self.critic_model:
            return one
        logits = be.rl_logits_pass(model, self.layout, self.sp, backward)
        return lambda b, s: one(b, s) + logits(b, s)

    def _forward_s(self, model: ThroughputModel, ranks: int, mb: int, seq_len: float) -> float:
        """A forward-only pass over ``ranks`` sequences per data-parallel rank in micro-batches of ``mb``
        (with Megatron, plus the pipeline's bubble)."""
        t = _passes_s(ranks, mb, seq_len, self._pass(model, False))
        if self.layout is not None:
            t *= 1.0 + rf_rl.pipeline_bubble(self.layout.pp, -(-ranks // mb))
        return t

    def _micro(self, budget: Optional[int], seq_len: float, fixed: int) -> int:
        """A pass's sequences per micro-batch (per Ulysses group): filled up to the token budget (per GPU, so
        the group's sp times it) at this step's mean length, else the fixed micro-batch."""
        return rf.budget_micro_batch(budget * self.sp, seq_len) if budget else fixed

    def data_parallel(self, gpus: int) -> int:
        """Ranks the batch divides over: Megatron's replicas, or the training GPUs over the Ulysses groups."""
        return self.layout.dp if self.layout is not None else max(gpus // self.sp, 1)

    def _critic_micro(self, seq_len: float) -> int:
        return self._micro((self.shape.critic or CriticShape()).token_budget, seq_len, self.critic_micro_batch)

    def critic_forward_s(self, per_device: int, seq_len: float, real_len: Optional[float] = None) -> float:
        """The critic's value pass over ``per_device`` sequences of ``seq_len`` tokens (PPO); a token budget fills
        its micro-batches by ``real_len`` (the unpadded length, veRL's attention-mask count)."""
        assert self.critic_model is not None
        return self._forward_s(self.critic_model, per_device, self._critic_micro(real_len or seq_len), seq_len)

    def _update_s(self, model: ThroughputModel, n: int, seq_len: float, mb: int, param_scale: float,
                  devices: int = 1) -> tuple[float, int]:
        """Epochs x mini-batches x micro-batches of gradient accumulation, optimizer step per mini-batch;
        each mini-batch divided over ``devices`` data-parallel ranks; each micro-step pays its passes'
        launches (:meth:`_launch_s`)."""
        tr = self.shape.train
        if tr.mini_batch_samples:
            sizes = [tr.mini_batch_samples] * (n // tr.mini_batch_samples)
            if n % tr.mini_batch_samples:
                sizes.append(n % tr.mini_batch_samples)
        else:
            k = min(tr.mini_batches, n)
            sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
        opt = model.train.optimizer_step_s * param_scale
        one = self._pass(model, True)
        one_epoch = 0.0
        for m in sizes:
            ranks = -(-m // devices)
            t = _passes_s(ranks, mb, seq_len, one)
            if self.layout is not None:
                t += be.megatron_minibatch_extra_s(model, self.layout, t, -(-ranks // mb), param_scale)
            one_epoch += t + opt
        return tr.epochs * one_epoch, tr.epochs * len(sizes)

    def step(self, prompts: int, group: int, lengths: Optional[np.ndarray] = None) -> StepTime:
        return self.steps([prompts], group, lengths)[0]

    def steps(self, prompts: list[int], group: int, lengths: Optional[np.ndarray] = None) -> list[StepTime]:
        """Step times for each batch of ``prompts``; the batch of ``p`` prompts is the first ``p`` of
        one draw (or of ``lengths``), so one rollout simulation per engine serves every batch size."""
        if not prompts or min(prompts) < 1 or group < 1:
            raise UserError(f"prompts per step and group size must be positive integers, got {prompts} and {group}")
        most = max(prompts)
        if lengths is None:
            lengths = self.dist.sample(most * group, self.shape.seed, group)
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(lengths) < most * group:
            raise UserError(f"{len(lengths)} response lengths for {most} prompts of {group}")
        p = self.shape.prompt_len
        share = group if self.group_share else 1
        pl = self.placement
        engines = pl.engines if pl is not None else 1
        # prompt k goes to engine k mod engines (whole prompts, so a group's responses stay on one
        # engine, as veRL's dispatch keeps them): each engine's share of a smaller batch is the first
        # part of its share of the largest
        per_engine = []
        for e in range(min(engines, most)):
            idx = (np.arange(e, most, engines)[:, None] * group + np.arange(group)).ravel()
            counts = sorted({len(range(e, q, engines)) * group for q in prompts if q > e})
            per_engine.append(simulate_rollouts(self.model, lengths[idx], p, counts, self.caps, group=share,
                                                context_max=self.dist.longest()))
        out = []
        over = self.shape.partial_rollout
        for q in prompts:
            rolls = [r[len(range(e, q, engines)) * group] for e, r in enumerate(per_engine) if q > e]
            partial = None
            if over > 0:
                rolls, partial = partial_rolls(self.model, self.dist, self.caps, p, split_over_engines(q, engines),
                                               group, share, over, self.shape.seed, max(r.wall_s for r in rolls))
            elif self.slack_steps > 1:
                rolls = self._slack_rolls(q, group, lengths, share, engines)
            st = self._step(q, group, lengths[:q * group], rolls, split_over_engines(q, engines))
            out.append(st.model_copy(update={"partial": partial}) if partial is not None else st)
        return out

    def _slack_rolls(self, q: int, group: int, lengths: np.ndarray, share: int, engines: int) -> list[RolloutResult]:
        """Generation per step with ``k`` steps of slack: each engine's share of ``k`` consecutive batches
        (this one, then ``k - 1`` more draws) drains as one queue, and a step is charged ``1/k`` of that
        wall time. The longest responses of one step overlap the next steps' samples, so the step is
        throughput-bound when the queue outlasts the tail and tail-bound (``makespan / k``) when the
        engines hold all ``k`` batches at once; ``k = 1`` is the one-step-off rollout itself."""
        k = self.slack_steps
        draws = [lengths[:q * group]] + [self.dist.sample(q * group, self.shape.seed + 7_919 * j, group)
                                         for j in range(1, k)]
        out = []
        for e in range(min(engines, q)):
            idx = (np.arange(e, q, engines)[:, None] * group + np.arange(group)).ravel()
            queue = np.concatenate([d[idx] for d in draws])
            r = simulate_rollouts(self.model, queue, self.shape.prompt_len, [len(queue)], self.caps, group=share,
                                  context_max=self.dist.longest())[len(queue)]
            out.append(r.model_copy(update={
                "n_requests": len(idx), "output_tokens": int(r.output_tokens // k), "wall_s": r.wall_s / k,
                "decode_s": r.decode_s / k, "prefill_s": r.prefill_s / k, "recompute_s": r.recompute_s / k}))
        return out

    def _step(self, prompts: int, group: int, lengths: np.ndarray, rolls: list[RolloutResult],
              counts: list[int]) -> StepTime:
        n = prompts * group
        p = self.shape.prompt_len
        share = group if self.group_share else 1
        pl = self.placement
        roll = max(rolls, key=lambda r: r.wall_s)
        gen_mean = float(np.mean([r.wall_s for r in rolls]))
        tr = self.shape.train
        # a padded pass computes every sequence at the padded length, a packed one at its own; a token budget
        # counts the real tokens either way (veRL splits dynamic micro-batches by the attention mask)
        real = p + float(np.mean(lengths))
        seq = max(real, float(tr.padded_seq_len or 0))
        tm = self.train_model
        gpus = pl.train_gpus if pl is not None else 1
        dev = self.data_parallel(gpus)  # sequences per Megatron replica or Ulysses group
        per_dev = -(-n // dev)
        passes = int(tr.old_logprob) + int(tr.ref_logprob)
        mb = self._micro(tr.token_budget, real, self.micro_batch)
        lmb = self._micro(tr.logprob_token_budget, real, self.logprob_micro_batch)
        logprob = passes * self._forward_s(tm, per_dev, lmb, seq)
        train, opt_steps = self._update_s(tm, n, seq, mb, 1.0, dev)
        critic = 0.0
        if self.critic_model is not None:
            cm = self.critic_model
            scale = rf.all_weight_bytes(cm.costs) / rf.all_weight_bytes(tm.costs)
            cpad = (self.shape.critic or CriticShape()).padded_seq_len
            cseq = seq if cpad is None else max(real, float(cpad))  # its own padding
            critic = self.critic_forward_s(per_dev, cseq, real)
            critic += self._update_s(cm, n, cseq, self._critic_micro(real), scale, dev)[0]
        learn = logprob + train + critic + self.offload_s
        reward, overlapped = rf_rl.reward_s(n, self.shape.reward.per_response_s, self.shape.reward.workers), self.overlapped
        gen = roll.wall_s + (0.0 if overlapped else reward)  # overlapped: scoring is a stage of its own, on the host
        total = rf_rl.rl_step_s(roll.wall_s, reward, learn, self.sync_s, overlapped)
        idle = idle_shares(pl, roll.wall_s, gen_mean, learn, total) if pl is not None else {}
        return StepTime(prompts=prompts, group=group, responses=n,
                        overlap="off-policy" if overlapped else self.shape.overlap, gen_s=gen,
                        logprob_s=logprob, train_s=train, critic_s=critic, sync_s=self.sync_s, step_s=total,
                        offload_s=self.offload_s, reward_s=reward,
                        micro_batch=mb, optimizer_steps=opt_steps, seq_len_mean=seq, real_len_mean=real,
                        critic_seq_len_mean=cseq if self.critic_model is not None else None, rollout=roll,
                        placement=pl.label if pl is not None else None, engines=len(counts), engine_prompts=counts,
                        gen_engine_mean_s=gen_mean, train_devices=gpus, idle_share=idle, prefix_sharing=share > 1,
                        off_policy_steps=self.slack_steps)


def critic_costs_for(shape: RLShape, bytes_per_param: int) -> Optional[Costs]:
    """The critic's own costs when the shape names a different model (PPO)."""
    if shape.algo != "ppo" or shape.critic is None or shape.critic.model == "same":
        return None
    from throughputlab.models import resolve_model

    spec = resolve_model(shape.critic.model, random_weights=True).spec
    return Costs.from_spec(spec, bytes_per_param)


class _RatedLayout(be.MegatronLayout):
    rate_note: str = ""

    def describe(self, gpus: int) -> str:  # decide's output says which training FLOP/s the layout ran at
        return f"{super().describe(gpus)}; {self.rate_note}"
