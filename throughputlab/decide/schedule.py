"""The rollout's schedulers: which requests decode and which prefill in each engine step.

Both give the same per-step record (decoding requests, their summed context, prefill tokens),
which the rollout simulation prices through the throughput model:

- without KV pressure, the schedule in steps does not depend on step costs, so it is list
  scheduling on ``cap`` slots (a heap over finish steps) and every per-step quantity is a
  cumulative sum of finish/start events;
- with KV pressure, an event loop jumps from one finish or preemption to the next, writing whole
  runs of constant-concurrency steps at once (vLLM's policy: the most recently admitted request
  is preempted and recomputed later).
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np
from pydantic import BaseModel, ConfigDict

from throughputlab.errors import UserError


class Steps(BaseModel):
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


def schedule_slots(lengths: np.ndarray, prompt_len: int, slots: int,
                    group: int = 1) -> tuple[Steps, np.ndarray, np.ndarray]:
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
    steps = Steps(dec=dec.astype(float), ctx=ctx, new=new.astype(float), q1=q1,
                   q2=prefilled * float(prompt_len) ** 2 + cached, rq1=np.zeros(total))
    return steps, starts, ends


def kv_blocks(tokens, block: int):
    return -(-tokens // block)


def schedule_kv(lengths: np.ndarray, prompt_len: int, caps, group: int = 1) -> Steps:
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
        need = kv_blocks(run_ctx + 1 - shared, bs)
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
        if waiting and len(run_id) < max_seqs and not admission_blocked(run_ctx - shared, waiting[0][1],
                                                                         prompt_len - shared, bs, total_blocks):
            continue
        k = steps_that_fit(run_ctx - shared, int(run_left.min()), bs, total_blocks)
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
    return Steps(dec=col(0), ctx=col(1) + col(3) * within, new=col(4), q1=col(5), q2=col(6), rq1=col(7),
                  preemptions=preemptions, kv_limited=kv_limited)


def admission_blocked(run_ctx: np.ndarray, g: int, prompt_len: int, bs: int, total_blocks: int) -> bool:
    used = int(kv_blocks(run_ctx + 1, bs).sum())
    return used + int(kv_blocks(prompt_len + g, bs)) > total_blocks


def steps_that_fit(run_ctx: np.ndarray, k_max: int, bs: int, total_blocks: int) -> int:
    """Largest k <= k_max such that k decode steps from now need no preemption (bisection)."""
    def fits(k: int) -> bool:
        return int(kv_blocks(run_ctx + k, bs).sum()) <= total_blocks

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
