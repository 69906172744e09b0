"""The rollout's schedulers: which requests decode and which prefill in each engine step.

Both give the same per-step record (decoding requests, their summed context, prefill tokens),
which the rollout simulation prices through the throughput model:

- without KV pressure, the schedule in steps does not depend on step costs, so it is list
  scheduling on ``cap`` slots (a heap over finish steps) and every per-step quantity is a
  cumulative sum of finish/start events;
- with KV pressure, an event loop jumps from one finish or preemption to the next, writing whole
  runs of constant-concurrency steps at once (vLLM's policy: the most recently admitted request
  is preempted and recomputed later), with O(block size) work per event whatever the concurrency.

Both admit first come, first served, so a batch of the first ``n`` requests runs as the whole
batch does up to the step where the whole batch admits request ``n``: one schedule of the
largest batch serves every smaller one, which only adds its own drain (:class:`Tail`).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Optional

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
    first = np.arange(n) % group == 0 if group > 1 else None
    return _slot_steps(starts, ends, prompt_len, first, 0), starts, ends


def slot_tail(starts: np.ndarray, ends: np.ndarray, prompt_len: int, group: int, cut: int) -> "Tail":
    """The steps from ``cut`` on of the slot schedule of these requests (a batch's first ``n``, whose
    starts do not depend on the requests after them)."""
    live = ends > cut
    first = (np.arange(len(starts)) % group == 0)[live] if group > 1 else None
    z = np.zeros(0)
    st = _slot_steps(starts[live], ends[live], prompt_len, first, cut) if live.any() else \
        Steps(dec=z, ctx=z, new=z, q1=z, q2=z, rq1=z)
    return Tail(cut=cut, steps=st, preemptions=0, kv_limited=False)


def _slot_steps(starts: np.ndarray, ends: np.ndarray, prompt_len: int, first: Optional[np.ndarray],
                j0: int) -> Steps:
    """Per-step record of steps ``j0`` onwards, from the requests' start and end steps (all ending
    after ``j0``); ``first`` marks each group's first request (None: no shared prompts)."""
    total = int(ends.max()) - j0
    s, e = starts - j0, ends - j0
    began = s >= 0
    sc = np.maximum(s, 0)
    n_start = np.bincount(sc, minlength=total + 1)
    n_end = np.bincount(e, minlength=total + 1)
    active = np.cumsum(n_start - n_end)[:total]
    s_start = np.bincount(sc, weights=starts.astype(float), minlength=total + 1)
    s_end = np.bincount(e, weights=starts.astype(float), minlength=total + 1)
    sum_start_active = np.cumsum(s_start - s_end)[:total]
    new = np.bincount(s[began], minlength=total + 1)[:total]
    j = np.arange(j0, j0 + total, dtype=float)
    dec = active - new
    # a request started at a_i decodes at step j with context p + j - a_i
    ctx = dec * (prompt_len + j) - (sum_start_active - new * j)
    # a group's later requests find the prompt cached and compute one token of it (vLLM recomputes
    # the last token of a fully cached prompt)
    prefilled = new if first is None else np.bincount(s[began & first], minlength=total + 1)[:total]
    cached = (new - prefilled).astype(float)
    q1 = prefilled * float(prompt_len) + cached
    return Steps(dec=dec.astype(float), ctx=ctx, new=new.astype(float), q1=q1,
                 q2=prefilled * float(prompt_len) ** 2 + cached, rq1=np.zeros(total))


def kv_blocks(tokens, block: int):
    return -(-tokens // block)


class Tail(BaseModel):
    """A smaller batch (the first ``n`` requests) read off a larger one's schedule: its steps are the
    larger schedule's first ``cut`` steps, then ``steps``."""

    cut: int
    steps: Steps
    preemptions: int  # in all, the shared steps' included
    kv_limited: bool


def schedule_kv(lengths: np.ndarray, prompt_len: int, caps, group: int = 1) -> Steps:
    """Event loop with KV-cache accounting in blocks, preemption by recomputation (vLLM V1 policy:
    the most recently admitted running request is preempted and goes back to the front of the queue;
    no admission in a step that preempted).

    ``group`` > 1 (a shared prompt per group of consecutive requests): each request holds its
    share of the prompt's blocks, prompt/group tokens, and a request whose group still runs
    another member finds the prompt cached and prefills only what it had generated."""
    return schedule_kv_prefixes(lengths, prompt_len, caps, group)[0]


def schedule_kv_prefixes(lengths: np.ndarray, prompt_len: int, caps, group: int = 1,
                         sizes=()) -> tuple[Steps, dict[int, Tail]]:
    """:func:`schedule_kv` for the whole of ``lengths`` and for each batch of its first ``n`` requests,
    ``n`` in ``sizes``.

    Requests are admitted first come, first served, so a batch of the first ``n`` requests runs
    exactly as the whole batch does until the step in which the whole batch would admit request
    ``n`` (or, at the end of a step, would take a single step to admit it where the smaller batch,
    with an empty queue, runs on): the loop saves its state there and each smaller batch only
    simulates its own drain from that state."""
    sim = _KVLoop(np.asarray(lengths, dtype=np.int64), prompt_len, caps, group)
    n = len(lengths)
    targets = sorted({int(s) for s in sizes if 0 < int(s) < n})
    records, state, snaps = sim.run(sim.initial(), n, targets)
    full = _steps(records, state[10], state[11] < n)
    tails: dict[int, Tail] = {}
    for m, snap in snaps.items():
        recs, st, _ = sim.run(snap, m, [])
        tails[m] = Tail(cut=snap[1], steps=_steps(recs, st[10], st[11] < m), preemptions=st[10],
                        kv_limited=st[11] < m)
    return full, tails


def _steps(records: list[tuple], preemptions: int, kv_limited: bool) -> Steps:
    if not records:
        z = np.zeros(0)
        return Steps(dec=z, ctx=z, new=z, q1=z, q2=z, rq1=z, preemptions=preemptions, kv_limited=kv_limited)
    rec = np.asarray(records, dtype=float)
    ks = rec[:, 2].astype(np.int64)
    first = np.cumsum(ks) - ks
    within = np.arange(int(ks.sum())) - np.repeat(first, ks)
    col = lambda i: np.repeat(rec[:, i], ks)  # noqa: E731
    return Steps(dec=col(0), ctx=col(1) + col(3) * within, new=col(4), q1=col(5), q2=col(6), rq1=col(7),
                 preemptions=preemptions, kv_limited=kv_limited)


def _too_long(prompt_len: int, lengths, kv_cache_tokens: int) -> UserError:
    """The one-line error for a sequence no engine's KV cache can hold, wherever the schedule meets it."""
    longest = int(max(lengths))
    return UserError(f"one request needs {prompt_len + longest} KV-cache tokens (prompt {prompt_len} + response "
                     f"{longest}) but an engine's cache holds {kv_cache_tokens}: give the engines more memory "
                     "(--gpu-memory-utilization, --kv-cache-gib, --engine-tp) or cap the responses lower "
                     "(--response-dist ...,max=N)")


class _KVLoop:
    """The event loop in plain Python integers, O(block) work per event whatever the concurrency.

    A running request ``i`` holds ``off_i + T`` KV tokens at the start of step ``T``, so its block
    count at that step is ``ceil((off_i + 1 - shared + T) / block)``: it grows by one at the steps
    where ``(off_i + 1 - shared + T) % block == 1``. A histogram of ``(off_i + 1 - shared) % block``
    over the running requests therefore gives the blocks the decodes need after any number of
    steps without touching each request; finishes come off a heap of finish steps (entries of
    preempted requests are skipped when they surface; an entry is ``end * n + i``), and the running requests sit in a dict in
    admission order, so the most recently admitted is the last item.

    A state is ``(phase, T, running, heap, histogram, blocks used, sum of off, preempted queue,
    next fresh request, running members per group, preemptions, kv marker, mid-step admissions)``;
    the kv marker is -1 once the cache limited anything (a preemption, or a preempted request that
    did not fit), else the smallest fresh request that did not fit (a batch of ``n`` requests is
    KV-limited when the marker is below ``n``). Phase 0 starts a step, 1 is in its admissions,
    2 decides whether to run several steps at once."""

    def __init__(self, lengths: np.ndarray, prompt_len: int, caps, group: int, group_of=None):
        self.lengths = [int(x) for x in lengths]
        self.n = len(self.lengths)
        # the prompt each request answers (default: consecutive requests in groups of ``group``)
        self.group_of = [int(x) for x in group_of] if group_of is not None else [i // group for i in range(self.n)]
        self.prompt_len = int(prompt_len)
        self.group = int(group)
        self.shared = prompt_len - prompt_len // group if group > 1 else 0  # prompt tokens a request does not hold alone
        self.bs = int(caps.block_size)
        self.kv_cache_tokens = int(caps.kv_cache_tokens) if caps.kv_cache_tokens else 10**15
        self.total = self.kv_cache_tokens // self.bs
        self.max_seqs = int(caps.max_num_seqs or self.n)

    def initial(self) -> tuple:
        return (0, 0, {}, [], [0] * self.bs, 0, 0, deque(), 0, [0] * (max(self.group_of, default=0) + 1),
                0, self.n, None)

    def run(self, state: tuple, limit: int, targets: list[int], stop: Optional[int] = None,
            done: Optional[list[int]] = None, sizes: Optional[list[int]] = None) -> tuple[list[tuple], tuple, dict]:
        """Run from ``state`` with the fresh requests below ``limit``; save a state per target size.

        ``stop``: end after the step in which that many prompts have all their responses done
        (``done[k]`` responses of prompt ``k`` are done so far, of ``sizes[k]``; both updated)."""
        (phase, T, run, heap, cnt, used, s_off, waiting, nxt, gr, preemptions, kv_min, mid) = state
        lengths, P, group, shared, bs, total, max_seqs = (self.lengths, self.prompt_len, self.group, self.shared,
                                                          self.bs, self.total, self.max_seqs)
        c1 = 1 - shared
        gof = self.group_of
        complete = 0
        M = self.n  # a heap entry is end step * M + request
        push, pop = heapq.heappush, heapq.heappop
        records: list[tuple] = []
        snaps: dict[int, tuple] = {}
        ti = 0
        target = targets[0] if targets else -1
        n_dec, preempted, adm_used, new = mid if mid is not None else (0, False, 0, [])
        new = list(new)
        guard = 0
        limit_guard = 50 * self.n + 10_000
        while True:
            guard += 1
            if guard > limit_guard:  # cannot happen with positive lengths; a loud failure beats a hang
                raise RuntimeError("rollout simulation made no progress")
            if phase == 2:
                # 4. jump: until the next finish nothing can be admitted (the cache only fills up and no
                #    slot frees), so run whole steps at constant concurrency while the contexts still fit
                phase = 0
                if used > total:  # the decodes outgrew the cache: the next step preempts
                    pass
                elif run:
                    if len(heap) > 2 * len(run) + 64:  # drop the entries of preempted requests in bulk
                        heap = [r[1] * M + i for i, r in run.items()]
                        heapq.heapify(heap)
                    head = -1
                    if waiting:
                        head_g = waiting[0][1]
                    elif nxt < limit:
                        head_g, head = 0, nxt
                    else:
                        head_g = None
                    blocked = head_g is not None and len(run) < max_seqs
                    if blocked and used - (-(P + head_g - shared) // bs) <= total:
                        if head == target >= 0:  # here the smaller batch, its queue empty, runs on
                            snaps[target] = (2, T, dict(run), list(heap), list(cnt), used, s_off, deque(waiting),
                                             nxt, list(gr), preemptions, kv_min, None)
                            ti += 1
                            target = targets[ti] if ti < len(targets) else -1
                    else:
                        if blocked and kv_min > head:  # the cache, not the sequence cap, holds the queue back
                            kv_min = head
                        while True:  # drop the entries of requests preempted since
                            end, i = divmod(heap[0], M)
                            r = run.get(i)
                            if r is not None and r[1] == end:
                                break
                            pop(heap)
                        k_max = end - T
                        free = total - used
                        d = len(run)
                        k = 0
                        if free >= 0:
                            m = free // d
                            if m * bs >= k_max:
                                k = k_max
                            else:  # the first step that would not fit lies in the next block period
                                k, acc = m * bs, m * d
                                while True:
                                    k += 1
                                    acc += cnt[(1 - T - k) % bs]
                                    if acc > free:
                                        break
                                k = min(k, k_max)
                        if k > 0:
                            records.append((d, s_off + d * (T + 1), k, d, 0, 0, 0, 0))
                            m, rest = divmod(k, bs)
                            inc = m * d
                            base = T + m * bs
                            for x in range(1, rest + 1):
                                inc += cnt[(1 - base - x) % bs]
                            used += inc
                            T += k
                            phase = 3
            if phase == 0:
                if not run and not waiting and nxt >= limit:
                    break
                if used > total:
                    # 1. decodes need one more token each; preempt the most recently admitted until they
                    #    fit. Such a step admits nothing, so steps that preempt follow each other here
                    kv_min = -1
                    while True:
                        while used > total:
                            i, (off, end) = run.popitem()
                            u = off + c1
                            used += (-(u + T)) // bs
                            cnt[u % bs] -= 1
                            s_off -= off
                            gr[gof[i]] -= 1
                            waiting.appendleft((i, lengths[i] - (end - T)))
                            preemptions += 1
                        d = len(run)
                        if not d:
                            raise _too_long(P, lengths, self.kv_cache_tokens)
                        records.append((d, s_off + d * (T + 1), 1, 0, 0, 0, 0, 0))
                        T += 1
                        used += cnt[(1 - T) % bs]
                        if used <= total or heap[0] < (T + 1) * M:
                            break
                    phase = 2
                else:
                    preempted = False
                    n_dec = len(run)
                    adm_used = used
                    new = []
                    phase = 1
            if phase == 1:
                # 2. admissions (prefill), not in a step that preempted
                if not preempted:
                    while n_dec + len(new) < max_seqs:
                        if waiting:
                            i, g = waiting[0]
                            fresh = False
                        elif nxt < limit:
                            i, g, fresh = nxt, 0, True
                        else:
                            break
                        q = P + g
                        b = -(-(q - shared) // bs)
                        if adm_used + b > total:
                            if kv_min > (i if fresh else -1):
                                kv_min = i if fresh else -1
                            break
                        if fresh:
                            if i == target:  # the smaller batch's queue ends here (fresh requests count from 0)
                                # (nothing decoding or admitted yet: the smaller batch has finished)
                                snaps[target] = (1 if n_dec or new else 0, T, dict(run), list(heap), list(cnt), used,
                                                 s_off, deque(waiting), nxt, list(gr), preemptions, kv_min,
                                                 (n_dec, preempted, adm_used, list(new)))
                                ti += 1
                                target = targets[ti] if ti < len(targets) else -1
                            nxt += 1
                        else:
                            waiting.popleft()
                        adm_used += b
                        gi = gof[i]
                        # a cached prompt is not computed again (vLLM recomputes the last token of a fully cached prompt)
                        new.append((i, q, (g if g > 1 else 1) if group > 1 and gr[gi] > 0 else q))
                        gr[gi] += 1
                if n_dec == 0 and not new:
                    raise _too_long(P, lengths, self.kv_cache_tokens)
                q1 = q2 = rq1 = 0
                for _, q, pre in new:
                    q1 += pre
                    q2 += pre * pre
                    if q > P:
                        rq1 += pre
                records.append((n_dec, s_off + n_dec * (T + 1), 1, 0, len(new), q1, q2, rq1))
                # 3. advance one step, then add the admitted requests
                T += 1
                used += cnt[(1 - T) % bs]
                for i, q, _ in new:
                    off = q - T
                    u = off + c1
                    cnt[u % bs] += 1
                    used -= (-(u + T)) // bs
                    s_off += off
                    end = T - 1 + lengths[i] - (q - P)
                    run[i] = (off, end)
                    push(heap, end * M + i)
                phase = 2
            elif phase == 3:
                phase = 0
            while heap and heap[0] < (T + 1) * M:  # requests that emitted their last token leave
                end, i = divmod(pop(heap), M)
                r = run.get(i)
                if r is not None and r[1] == end:
                    del run[i]
                    u = r[0] + c1
                    used += (-(u + T)) // bs
                    cnt[u % bs] -= 1
                    s_off -= r[0]
                    gk = gof[i]
                    gr[gk] -= 1
                    if stop is not None:
                        done[gk] += 1
                        if done[gk] == sizes[gk]:
                            complete += 1
            if stop is not None and complete >= stop and phase != 1:
                break
        state = (0, T, run, heap, cnt, used, s_off, waiting, nxt, gr, preemptions, kv_min, None)
        return records, state, snaps
