"""Rollout drain simulation: the wall time of one synchronous rollout under continuous batching.

A batch of ``B`` requests starts at concurrency ``min(B, cap)``, drains as responses finish
and refills from the queue (docs/model.md, "Rollout"). The engine works in steps:
every active request emits one token per step; a newly admitted request spends its first
step in prefill (which emits its first token), mixed into the same forward pass as the
decodes, as vLLM's scheduler does. The cap is in sequences (``max_num_seqs``) and in
KV-cache tokens (allocated in blocks): when the contexts outgrow the cache, the most
recently admitted request is preempted and later recomputed (a prefill of its prompt plus
the tokens it had generated), which this module counts.

Two schedulers give the same per-step record (decoding requests, their summed context,
prefill tokens), which one vectorised cost function turns into time:

- without KV pressure, the schedule in steps does not depend on step costs, so it is list
  scheduling on ``cap`` slots (a heap over finish steps) and every per-step quantity is a
  cumulative sum of finish/start events;
- with KV pressure, an event loop jumps from one finish or preemption to the next,
  writing whole runs of constant-concurrency steps at once.

:func:`simulate_rollouts` prices many batch sizes in one pass: the batch of the first ``n``
requests shares the whole batch's steps up to the admission of request ``n``, so their costs
are summed once (running totals) and each size adds only its own drain.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from throughputlab import roofline as rf
from throughputlab.decide.lengths import LengthDist  # noqa: F401  (simulate_rollout's callers pass one)
from throughputlab.decide.schedule import Steps, Tail, kv_blocks, schedule_kv_prefixes, schedule_slots, slot_tail
from throughputlab.errors import UserError
from throughputlab.throughput import ThroughputModel

TIMELINE_POINTS = 240  # points kept of the concurrency-over-time curve


# ---------------------------------------------------------------- engine limits


class EngineCaps(BaseModel):
    """The engine's admission limits; ``None`` means no limit of that kind."""

    model_config = ConfigDict(extra="forbid")
    max_num_seqs: Optional[int] = None
    kv_cache_tokens: Optional[int] = None
    block_size: int = 16  # KV-cache block in tokens (vLLM: 16 on GPU, 128 on CPU)

    @classmethod
    def from_model(cls, model: ThroughputModel, block_size: int = 16) -> "EngineCaps":
        return cls(max_num_seqs=model.max_num_seqs, kv_cache_tokens=model.kv_cache_tokens, block_size=block_size)

    def describe(self) -> str:
        parts = [f"{self.max_num_seqs} sequences" if self.max_num_seqs else "no sequence cap",
                 f"{self.kv_cache_tokens} KV-cache tokens (blocks of {self.block_size})" if self.kv_cache_tokens
                 else "no KV-cache cap"]
        return ", ".join(parts)


# ---------------------------------------------------------------- result


class RolloutResult(BaseModel):
    """Predicted rollout of one batch: wall time, where it went, and concurrency over time."""

    model_config = ConfigDict(extra="forbid")
    n_requests: int
    prompt_len: int
    output_tokens: int
    response_len_mean: float
    response_len_max: int
    wall_s: float
    decode_s: float  # what the steps would cost without their prefill tokens
    prefill_s: float  # prefill of admitted requests (first admission)
    recompute_s: float  # prefill again of preempted requests
    overhead_s: float = 0.0  # per generate call, outside the steps (the fit's gen_overhead_s)
    steps: int
    preemptions: int
    kv_limited: bool  # whether the KV cache, not the sequence cap, limited admission somewhere
    peak_concurrency: int
    mean_concurrency: float  # time-weighted
    knee_concurrency: Optional[float]  # at the mean decode context; None: memory-bound at every concurrency
    below_knee_share: float  # share of wall time spent at a concurrency below the knee
    caps: EngineCaps
    timeline_t_s: list[float] = []  # step start times (downsampled)
    timeline_concurrency: list[int] = []

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0


# ---------------------------------------------------------------- step costs


def step_costs(model: ThroughputModel, st: Steps) -> tuple[np.ndarray, np.ndarray]:
    """Time of each step and the part that is decode alone, through the throughput model.

    A mixed step is one forward pass (``mixed_step_s``): its memory term reads the weights and the
    decodes' KV, its compute term adds the prefill FLOPs at the prefill's own rate. A step with
    prefill only is ``prefill_tokens_s``; one with decodes only, ``decode_step_s`` at s = ctx/dec.
    An engine that keeps prefill apart (``model.separate_prefill``: SGLang's default) runs the
    prefill as a step of its own while the decodes wait: the two passes one after the other.
    """
    zero = np.zeros_like(st.q1)
    pure_prefill = model.prefill_tokens_s(st.q1, st.q2)
    decode_only = np.where(st.dec > 0, model.mixed_step_s(st.dec, st.ctx, zero, zero), 0.0)
    if model.separate_prefill:  # (a request whose prompt its group's first one cached adds no prefill step)
        mixed = np.where(st.q1 > 0, decode_only + pure_prefill, decode_only)
    else:
        mixed = model.mixed_step_s(st.dec, st.ctx, st.q1, st.q2)
    has_dec = st.dec > 0
    t = np.where(has_dec, np.where(st.new > 0, mixed, decode_only), pure_prefill)
    return t, decode_only


# ---------------------------------------------------------------- the simulation


def simulate_rollout(model: ThroughputModel, lengths: Sequence[int] | np.ndarray, prompt_len: int,
                     caps: Optional[EngineCaps] = None, *, timeline_points: int = TIMELINE_POINTS,
                     force_event_loop: bool = False, group: int = 1,
                     context_max: Optional[int] = None) -> RolloutResult:
    """Predict the rollout of one request per entry of ``lengths`` (response tokens), all with
    ``prompt_len`` prompt tokens, under ``caps`` (default: none). ``group`` > 1: consecutive
    requests in groups of that size share their prompt's prefill and KV (GRPO with prefix caching).
    ``context_max``: the longest response the knee's context grid covers (default: the longest here)."""
    n = len(lengths)
    return simulate_rollouts(model, lengths, prompt_len, [n], caps, timeline_points=timeline_points,
                             force_event_loop=force_event_loop, group=group, context_max=context_max)[n]


def simulate_rollouts(model: ThroughputModel, lengths: Sequence[int] | np.ndarray, prompt_len: int,
                      sizes: Sequence[int], caps: Optional[EngineCaps] = None, *,
                      timeline_points: int = TIMELINE_POINTS, force_event_loop: bool = False, group: int = 1,
                      context_max: Optional[int] = None) -> dict[int, RolloutResult]:
    """:func:`simulate_rollout` of the first ``n`` requests of ``lengths`` for each ``n`` in ``sizes``,
    exactly as one by one but in one pass: a batch of the first ``n`` requests runs as the whole batch
    does until the whole batch admits request ``n`` (first come, first served), so each smaller batch
    shares those steps and their costs (prefix sums) and only its own drain is simulated and priced."""
    caps = caps or EngineCaps()
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if n == 0:
        raise UserError("the rollout has no requests: give at least one prompt")
    if np.any(lengths < 1):
        raise UserError("response lengths must be at least 1 token")
    if prompt_len < 1:
        raise UserError(f"--prompt-len must be a positive integer, got {prompt_len}")
    if caps.max_num_seqs is not None and caps.max_num_seqs < 1:
        raise UserError(f"the sequence cap must be a positive integer, got {caps.max_num_seqs}")
    if caps.kv_cache_tokens is not None and caps.kv_cache_tokens < caps.block_size:
        raise UserError(f"the KV-cache cap must hold at least one block ({caps.block_size} tokens), "
                        f"got {caps.kv_cache_tokens}")
    if group < 1:
        raise UserError(f"the group size must be a positive integer, got {group}")
    sizes = sorted({int(x) for x in sizes})
    if not sizes or sizes[0] < 1 or sizes[-1] > n:
        raise UserError(f"batch sizes must be between 1 and {n} requests, got {sizes}")
    slots = min(n, caps.max_num_seqs or n)
    steps: Optional[Steps] = None
    tails: dict[int, Tail] = {}
    if not force_event_loop or caps.kv_cache_tokens is None:
        steps, starts, ends = schedule_slots(lengths, prompt_len, slots, group)
        if caps.kv_cache_tokens is not None and _kv_overflows(steps, starts, ends, prompt_len, caps, group):
            steps = None  # (a smaller batch holds a subset of these requests at every step)
        else:
            tails = {m: slot_tail(starts[:m], ends[:m], prompt_len, group, int(starts[m])) for m in sizes if m < n}
    if steps is None:
        steps, tails = schedule_kv_prefixes(lengths, prompt_len, caps.model_copy(update={"max_num_seqs": slots}),
                                            group, sizes)
    top = int(context_max if context_max is not None else lengths.max())
    full = _Priced(model, steps, prompt_len, top)
    out = {}
    for m in sizes:
        tail = tails.get(m)
        part = _Priced(model, tail.steps, prompt_len, top) if tail is not None else None
        out[m] = _summarise(model, full, tail.cut if tail is not None else len(full.t), part,
                            tail if tail is not None else steps, lengths[:m], prompt_len, caps, timeline_points)
    return out


def _kv_overflows(st: Steps, starts: np.ndarray, ends: np.ndarray, prompt_len: int, caps: EngineCaps,
                  group: int = 1) -> bool:
    """Whether the slot schedule ever needs more KV blocks than the cache holds (block rounding
    bounded above by one partial block per request; a shared prompt held once per group)."""
    shared = prompt_len - prompt_len // group if group > 1 else 0
    active = st.dec + st.new
    tokens_after = st.ctx + st.new * prompt_len - active * shared  # KV held during each step
    bound = tokens_after + active * (caps.block_size - 1)
    if np.all(bound <= caps.kv_cache_tokens):
        return False
    # exact check of the block count, per step, only where the bound is exceeded
    bs = caps.block_size
    total_blocks = caps.kv_cache_tokens // bs
    over = np.flatnonzero(bound > caps.kv_cache_tokens)
    for j in over[:64]:  # beyond a few steps, the exact event loop is cheaper than checking them all
        live = (starts <= j) & (ends > j)
        held = prompt_len - shared + (j - starts[live])  # includes the token processed in this step
        if int(kv_blocks(held, bs).sum()) > total_blocks:
            return True
    return len(over) > 64


@lru_cache(maxsize=4096)
def _knee_key(costs, bw: float, phi: float, s: float, bw_mem: Optional[float]) -> float:
    knee = rf.knee(costs, s, bw, phi, bw_mem)
    return math.inf if knee is None else knee  # inf stays internal: no concurrency reaches it


def _knee_cached(model: ThroughputModel, s: float) -> float:
    d = model.require("decode")
    return _knee_key(model.device_costs, d.bw_bytes_per_s, d.phi_flops_per_s, s, d.bw_mem_bytes_per_s)


class _Priced:
    """Steps priced through the throughput model, with the per-step sums a summary needs (and
    their running totals, so that any first ``cut`` steps are summed at once)."""

    def __init__(self, model: ThroughputModel, st: Steps, prompt_len: int, context_max: int):
        t, decode_only = step_costs(model, st)
        self.t = t
        self.conc = (st.dec + st.new).astype(np.int64)
        extra = t - decode_only  # time the prefill tokens add
        with np.errstate(invalid="ignore", divide="ignore"):
            recompute_share = np.where(st.q1 > 0, st.rq1 / st.q1, 0.0)
            s_mean = np.where(st.dec > 0, st.ctx / np.maximum(st.dec, 1), float(prompt_len))
        # the knee moves with the context: look it up on a grid of contexts (nearest point)
        grid = np.unique(np.round(np.linspace(prompt_len, prompt_len + context_max, 17) / 16) * 16)
        grid = np.maximum(grid, 1.0)
        knees = np.array([_knee_cached(model, float(s)) for s in grid])
        knee_step = knees[np.searchsorted((grid[1:] + grid[:-1]) / 2, s_mean)]
        is_dec = st.dec > 0
        # columns: time, decode alone, prefill's extra, recompute's extra, conc x time, time below the
        # knee, context x decode time, decode time
        cols = np.stack([t, decode_only, extra, extra * recompute_share, self.conc * t,
                         np.where(self.conc < knee_step, t, 0.0), np.where(is_dec, s_mean * t, 0.0),
                         np.where(is_dec, t, 0.0)])
        self.sums = np.concatenate([np.zeros((cols.shape[0], 1)), np.cumsum(cols, axis=1)], axis=1)
        self.peak = np.maximum.accumulate(self.conc) if len(self.conc) else self.conc
        self.change = np.flatnonzero(np.diff(self.conc, prepend=-1) != 0)  # where concurrency changes


def _summarise(model: ThroughputModel, full: _Priced, cut: int, tail: Optional[_Priced], st: Steps,
               lengths: np.ndarray, prompt_len: int, caps: EngineCaps, timeline_points: int) -> RolloutResult:
    """The result of the first ``cut`` steps of ``full`` followed by ``tail``'s steps (``st``: the
    record that holds the batch's preemption count and KV flag)."""
    overhead = float(model.gen_overhead_s)
    sums = full.sums[:, cut].copy()
    peak = int(full.peak[cut - 1]) if cut > 0 else 0
    change = full.change[full.change < cut]
    cum_t = full.sums[0]
    start_t = cum_t[change]
    conc = full.conc[change]
    n_steps = cut
    if tail is not None and len(tail.t):
        sums += tail.sums[:, -1]
        peak = max(peak, int(tail.peak[-1]))
        more = tail.change if cut == 0 or tail.conc[0] != full.conc[cut - 1] else tail.change[1:]
        change = np.concatenate([change, more + cut])
        start_t = np.concatenate([start_t, cum_t[cut] + tail.sums[0][more]])
        conc = np.concatenate([conc, tail.conc[more]])
        n_steps = cut + len(tail.t)
    total, decode, extra, recompute, conc_t, below, ctx_t, dec_t = (float(x) for x in sums)
    wall = overhead + total
    s_avg = ctx_t / dec_t if dec_t > 0 else float(prompt_len)
    knee = _knee_cached(model, float(round(s_avg)))
    if len(change) > timeline_points:  # thinned evenly
        keep = np.linspace(0, len(change) - 1, timeline_points).round().astype(int)
        start_t, conc = start_t[keep], conc[keep]
    return RolloutResult(
        n_requests=len(lengths), prompt_len=int(prompt_len), output_tokens=int(lengths.sum()),
        response_len_mean=float(lengths.mean()), response_len_max=int(lengths.max()), wall_s=wall,
        decode_s=decode, prefill_s=extra - recompute, recompute_s=recompute, steps=n_steps,
        preemptions=st.preemptions, kv_limited=st.kv_limited, peak_concurrency=peak,
        mean_concurrency=conc_t / total, overhead_s=overhead,
        knee_concurrency=None if knee is None or not math.isfinite(knee) else float(knee),
        below_knee_share=below / total, caps=caps,
        timeline_t_s=[overhead + float(x) for x in start_t] + [wall],
        timeline_concurrency=[int(x) for x in conc] + [0],
    )


def predict_rollout(model: ThroughputModel, n_requests: int, prompt_len: int, dist: LengthDist,
                    caps: Optional[EngineCaps] = None, seed: int = 0, **kw) -> RolloutResult:
    """Draw ``n_requests`` lengths from ``dist`` (deterministic for ``seed``) and simulate."""
    if n_requests < 1:
        raise UserError(f"the batch must hold at least one request, got {n_requests}")
    return simulate_rollout(model, dist.sample(n_requests, seed), prompt_len, caps, **kw)


def price_steps(model: ThroughputModel, steps: Steps, lengths: np.ndarray, prompt_len: int, caps: EngineCaps,
                context_max: int, timeline_points: int = TIMELINE_POINTS) -> RolloutResult:
    """A schedule made elsewhere (partial rollouts) priced and summarised like any rollout."""
    priced = _Priced(model, steps, prompt_len, context_max)
    return _summarise(model, priced, len(priced.t), None, steps, lengths, prompt_len, caps, timeline_points)
