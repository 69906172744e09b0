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
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from throughputlab import roofline as rf
from throughputlab.decide.lengths import LengthDist  # noqa: F401  (simulate_rollout's callers pass one)
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


class _Steps(BaseModel):
    """Per-step record both schedulers produce (arrays as lists only for the model's sake)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    dec: np.ndarray  # requests decoding in the step
    ctx: np.ndarray  # their summed context (tokens whose KV the step reads)
    new: np.ndarray  # requests prefilled in the step
    q1: np.ndarray  # prefill tokens in the step
    q2: np.ndarray  # sum of squared prefill lengths (attention)
    rq1: np.ndarray  # prefill tokens that are recomputation
    preemptions: int = 0
    kv_limited: bool = False


# ---------------------------------------------------------------- schedulers


def _schedule_slots(lengths: np.ndarray, prompt_len: int, slots: int,
                    group: int = 1) -> tuple[_Steps, np.ndarray, np.ndarray]:
    """List scheduling on ``slots`` slots in FCFS order; returns the steps and each request's start and end step.

    ``group`` > 1: requests come in groups of that many consecutive requests sharing one prompt
    (GRPO's responses of a prompt; vLLM's prefix cache or ``n``): the prompt is prefilled once,
    when the group's first request starts."""
    n = len(lengths)
    starts = np.zeros(n, dtype=np.int64)
    if slots < n:
        heap = [int(x) for x in lengths[:slots]]
        heapq.heapify(heap)
        rest = lengths[slots:].tolist()
        out = starts[slots:]
        replace = heapq.heapreplace
        for i, length in enumerate(rest):
            free = heap[0]  # the step at which a slot frees up
            out[i] = free
            replace(heap, free + length)
    ends = starts + lengths  # first step after the request's last one
    total = int(ends.max())
    n_start = np.bincount(starts, minlength=total + 1)
    n_end = np.bincount(ends, minlength=total + 1)
    active = np.cumsum(n_start - n_end)[:total]
    s_start = np.bincount(starts, weights=starts.astype(float), minlength=total + 1)
    s_end = np.bincount(ends, weights=starts.astype(float), minlength=total + 1)
    sum_start_active = np.cumsum(s_start - s_end)[:total]
    new = n_start[:total]
    j = np.arange(total, dtype=float)
    dec = active - new
    # a request started at a_i decodes at step j with context p + j - a_i
    ctx = dec * (prompt_len + j) - (sum_start_active - new * j)
    # a group's later requests find the prompt cached and compute one token of it (vLLM recomputes
    # the last token of a fully cached prompt)
    prefilled = new if group <= 1 else np.bincount(starts[::group], minlength=total + 1)[:total]
    cached = (new - prefilled).astype(float)
    q1 = prefilled * float(prompt_len) + cached
    steps = _Steps(dec=dec.astype(float), ctx=ctx, new=new.astype(float), q1=q1,
                   q2=prefilled * float(prompt_len) ** 2 + cached, rq1=np.zeros(total))
    return steps, starts, ends


def _blocks(tokens, block: int):
    return -(-tokens // block)


def _schedule_kv(lengths: np.ndarray, prompt_len: int, caps: EngineCaps, group: int = 1) -> _Steps:
    """Event loop with KV-cache accounting in blocks, preemption by recomputation (vLLM V1 policy:
    the most recently admitted running request is preempted and goes back to the front of the queue;
    no admission in a step that preempted).

    ``group`` > 1 (a shared prompt per group of consecutive requests): each request holds its
    share of the prompt's blocks, prompt/group tokens, and a request whose group still runs
    another member finds the prompt cached and prefills only what it had generated."""
    n = len(lengths)
    shared = prompt_len - prompt_len // group if group > 1 else 0  # prompt tokens a request does not hold alone
    group_running = np.zeros((n + group - 1) // group, dtype=np.int64)
    bs = caps.block_size
    total_blocks = caps.kv_cache_tokens // bs
    max_seqs = caps.max_num_seqs or n
    waiting: deque[tuple[int, int]] = deque((i, 0) for i in range(n))  # (request, tokens generated so far)
    run_id = np.zeros(0, dtype=np.int64)
    run_ctx = np.zeros(0, dtype=np.int64)  # KV tokens held
    run_left = np.zeros(0, dtype=np.int64)  # tokens still to generate
    lengths = lengths.astype(np.int64)
    # one record per single step or run of steps: (decoding, context at its first step, steps,
    # context growth per step, prefilled requests, prefill tokens, squared, recomputed tokens)
    records: list[tuple] = []
    preemptions = 0
    kv_limited = False
    guard = 0
    while waiting or len(run_id):
        guard += 1
        if guard > 50 * n + 10_000:  # cannot happen with positive lengths; a loud failure beats a hang
            raise RuntimeError("rollout simulation made no progress")
        # 1. decodes need one more token each; preempt from the end until they fit
        preempted = False
        need = _blocks(run_ctx + 1 - shared, bs)
        used = int(need.sum())
        while len(run_id) and used > total_blocks:
            i, left = run_id[-1], run_left[-1]
            waiting.appendleft((int(i), int(lengths[i] - left)))
            group_running[i // group] -= 1
            used -= int(need[-1])
            run_id, run_ctx, run_left, need = run_id[:-1], run_ctx[:-1], run_left[:-1], need[:-1]
            preemptions += 1
            preempted = kv_limited = True
        n_dec = len(run_id)
        ctx_sum = float(run_ctx.sum()) + n_dec
        # 2. admissions (prefill), not in a step that preempted
        new_ids, new_q, new_pre = [], [], []
        if not preempted:
            while waiting and n_dec + len(new_ids) < max_seqs:
                i, g = waiting[0]
                q = prompt_len + g
                blocks = -(-(q - shared) // bs)
                if used + blocks > total_blocks:
                    kv_limited = True
                    break
                waiting.popleft()
                used += blocks
                new_ids.append(i)
                new_q.append(q)
                cached = group > 1 and group_running[i // group] > 0
                new_pre.append(max(g, 1) if cached else q)  # a cached prompt is not computed again
                group_running[i // group] += 1
        if n_dec == 0 and not new_ids:
            raise UserError(f"one request needs {prompt_len + int(lengths.max())} KV-cache tokens but the cache holds "
                            f"{caps.kv_cache_tokens}: raise kv_cache_tokens or lower max_tokens")
        q1 = float(sum(new_pre))
        records.append((n_dec, ctx_sum, 1, 0.0, len(new_ids), q1, float(sum(x * x for x in new_pre)),
                        float(sum(pre for pre, q in zip(new_pre, new_q) if q > prompt_len))))
        # 3. advance one step, then append the admitted requests
        run_ctx = run_ctx + 1
        run_left = run_left - 1
        if new_ids:
            ids = np.asarray(new_ids, dtype=np.int64)
            q = np.asarray(new_q, dtype=np.int64)
            run_id = np.concatenate([run_id, ids])
            run_ctx = np.concatenate([run_ctx, q])
            run_left = np.concatenate([run_left, lengths[ids] - (q - prompt_len) - 1])
        keep = run_left > 0
        if not keep.all():
            np.subtract.at(group_running, run_id[~keep] // group, 1)
            run_id, run_ctx, run_left = run_id[keep], run_ctx[keep], run_left[keep]
        if not len(run_id):
            continue
        # 4. jump: until the next finish nothing can be admitted (the cache only fills up and no slot
        #    frees), so run whole steps at constant concurrency while the growing contexts still fit
        if waiting and len(run_id) < max_seqs and not _admission_blocked(run_ctx - shared, waiting[0][1],
                                                                         prompt_len - shared, bs, total_blocks):
            continue
        k = _steps_that_fit(run_ctx - shared, int(run_left.min()), bs, total_blocks)
        if k <= 0:
            continue
        d = len(run_id)
        records.append((d, float(run_ctx.sum()) + d, k, float(d), 0, 0.0, 0.0, 0.0))
        run_ctx = run_ctx + k
        run_left = run_left - k
        keep = run_left > 0
        np.subtract.at(group_running, run_id[~keep] // group, 1)
        run_id, run_ctx, run_left = run_id[keep], run_ctx[keep], run_left[keep]
    rec = np.asarray(records, dtype=float)
    ks = rec[:, 2].astype(np.int64)
    first = np.cumsum(ks) - ks
    within = np.arange(int(ks.sum())) - np.repeat(first, ks)
    col = lambda i: np.repeat(rec[:, i], ks)  # noqa: E731
    return _Steps(dec=col(0), ctx=col(1) + col(3) * within, new=col(4), q1=col(5), q2=col(6), rq1=col(7),
                  preemptions=preemptions, kv_limited=kv_limited)


def _admission_blocked(run_ctx: np.ndarray, g: int, prompt_len: int, bs: int, total_blocks: int) -> bool:
    used = int(_blocks(run_ctx + 1, bs).sum())
    return used + int(_blocks(prompt_len + g, bs)) > total_blocks


def _steps_that_fit(run_ctx: np.ndarray, k_max: int, bs: int, total_blocks: int) -> int:
    """Largest k <= k_max such that k decode steps from now need no preemption (bisection)."""
    def fits(k: int) -> bool:
        return int(_blocks(run_ctx + k, bs).sum()) <= total_blocks

    if fits(k_max):
        return k_max
    lo, hi = 0, k_max  # fits(lo) holds (the step just taken fitted), fits(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


# ---------------------------------------------------------------- step costs


def step_costs(model: ThroughputModel, st: _Steps) -> tuple[np.ndarray, np.ndarray]:
    """Time of each step and the part that is decode alone, through the throughput model.

    A mixed step is one forward pass (``mixed_step_s``): its memory term reads the weights and the
    decodes' KV, its compute term adds the prefill FLOPs at the prefill's own rate. A step with
    prefill only is ``prefill_tokens_s``; one with decodes only, ``decode_step_s`` at s = ctx/dec.
    """
    zero = np.zeros_like(st.q1)
    mixed = model.mixed_step_s(st.dec, st.ctx, st.q1, st.q2)
    pure_prefill = model.prefill_tokens_s(st.q1, st.q2)
    decode_only = np.where(st.dec > 0, model.mixed_step_s(st.dec, st.ctx, zero, zero), 0.0)
    has_dec = st.dec > 0
    t = np.where(has_dec, np.where(st.new > 0, mixed, decode_only), pure_prefill)
    return t, decode_only


# ---------------------------------------------------------------- the simulation


def simulate_rollout(model: ThroughputModel, lengths: Sequence[int] | np.ndarray, prompt_len: int,
                     caps: Optional[EngineCaps] = None, *, timeline_points: int = TIMELINE_POINTS,
                     force_event_loop: bool = False, group: int = 1) -> RolloutResult:
    """Predict the rollout of one request per entry of ``lengths`` (response tokens), all with
    ``prompt_len`` prompt tokens, under ``caps`` (default: none). ``group`` > 1: consecutive
    requests in groups of that size share their prompt's prefill and KV (GRPO with prefix caching)."""
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
    slots = min(n, caps.max_num_seqs or n)
    steps: Optional[_Steps] = None
    if not force_event_loop or caps.kv_cache_tokens is None:
        steps, starts, ends = _schedule_slots(lengths, prompt_len, slots, group)
        if caps.kv_cache_tokens is not None and _kv_overflows(steps, starts, ends, prompt_len, caps, group):
            steps = None
    if steps is None:
        steps = _schedule_kv(lengths, prompt_len, caps.model_copy(update={"max_num_seqs": slots}), group)
    t, decode_only = step_costs(model, steps)
    return _summarise(model, steps, t, decode_only, lengths, prompt_len, caps, timeline_points)


def _kv_overflows(st: _Steps, starts: np.ndarray, ends: np.ndarray, prompt_len: int, caps: EngineCaps,
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
        if int(_blocks(held, bs).sum()) > total_blocks:
            return True
    return len(over) > 64


@lru_cache(maxsize=4096)
def _knee_key(costs, bw: float, phi: float, s: float) -> float:
    knee = rf.knee(costs, s, bw, phi)
    return math.inf if knee is None else knee  # inf stays internal: no concurrency reaches it


def _knee_cached(model: ThroughputModel, s: float) -> float:
    d = model.require("decode")
    return _knee_key(model.costs, d.bw_bytes_per_s, d.phi_flops_per_s, s)


def _summarise(model: ThroughputModel, st: _Steps, t: np.ndarray, decode_only: np.ndarray, lengths: np.ndarray,
               prompt_len: int, caps: EngineCaps, timeline_points: int) -> RolloutResult:
    overhead = float(model.gen_overhead_s)
    wall = overhead + float(t.sum())
    extra = t - decode_only  # time the prefill tokens add
    with np.errstate(invalid="ignore", divide="ignore"):
        recompute_share = np.where(st.q1 > 0, st.rq1 / st.q1, 0.0)
    recompute = float((extra * recompute_share).sum())
    prefill = float(extra.sum()) - recompute
    conc = (st.dec + st.new).astype(np.int64)
    # the knee moves with the context: look it up on a grid of contexts (nearest point)
    with np.errstate(invalid="ignore", divide="ignore"):
        s_mean = np.where(st.dec > 0, st.ctx / np.maximum(st.dec, 1), float(prompt_len))
    grid = np.unique(np.round(np.linspace(prompt_len, prompt_len + lengths.max(), 17) / 16) * 16)
    grid = np.maximum(grid, 1.0)
    knees = np.array([_knee_cached(model, float(s)) for s in grid])
    mid = (grid[1:] + grid[:-1]) / 2
    nearest = np.searchsorted(mid, s_mean)
    knee_step = knees[nearest]
    below = float(t[conc < knee_step].sum() / t.sum())
    dec_time = float(t[st.dec > 0].sum())
    s_avg = float((s_mean * t)[st.dec > 0].sum() / dec_time) if dec_time > 0 else float(prompt_len)
    knee = _knee_cached(model, float(round(s_avg)))
    starts_t = overhead + np.concatenate([[0.0], np.cumsum(t)[:-1]])
    idx = _timeline_index(conc, timeline_points)
    return RolloutResult(
        n_requests=len(lengths), prompt_len=int(prompt_len), output_tokens=int(lengths.sum()),
        response_len_mean=float(lengths.mean()), response_len_max=int(lengths.max()), wall_s=wall,
        decode_s=float(decode_only.sum()), prefill_s=prefill, recompute_s=recompute, steps=len(t),
        preemptions=st.preemptions, kv_limited=st.kv_limited, peak_concurrency=int(conc.max()),
        mean_concurrency=float((conc * t).sum() / t.sum()), overhead_s=overhead,
        knee_concurrency=None if knee is None or not math.isfinite(knee) else float(knee),
        below_knee_share=below, caps=caps,
        timeline_t_s=[float(x) for x in starts_t[idx]] + [wall],
        timeline_concurrency=[int(x) for x in conc[idx]] + [0],
    )


def _timeline_index(conc: np.ndarray, points: int) -> np.ndarray:
    """The steps where concurrency changes, thinned evenly to at most ``points``."""
    change = np.flatnonzero(np.diff(conc, prepend=-1) != 0)
    if len(change) > points:
        change = change[np.linspace(0, len(change) - 1, points).round().astype(int)]
    return change


def predict_rollout(model: ThroughputModel, n_requests: int, prompt_len: int, dist: LengthDist,
                    caps: Optional[EngineCaps] = None, seed: int = 0, **kw) -> RolloutResult:
    """Draw ``n_requests`` lengths from ``dist`` (deterministic for ``seed``) and simulate."""
    if n_requests < 1:
        raise UserError(f"the batch must hold at least one request, got {n_requests}")
    return simulate_rollout(model, dist.sample(n_requests, seed), prompt_len, caps, **kw)
