"""Partial rollouts (APRIL, as slime runs them): over-provision, stop when the batch is done, carry the rest.

With over-provisioning ``over``, an engine that owes ``b`` prompts to the step keeps
``ceil(b * (1 + over))`` prompts' responses in flight: the responses carried over from the last
rollout first (they resume by recomputing their KV, a prefill of prompt + generated tokens, which
the scheduler counts as recomputation), then fresh prompts. The rollout ends after the engine step
in which ``b`` prompts have all their responses done (GRPO needs whole groups; the oldest
complete prompts are trained, any beyond ``b`` wait in a buffer for the next step); every unfinished response carries into the next
rollout with the tokens it had generated, and a prompt's finished responses wait for the rest of
their group.

Steady state: what one rollout carries over is the next one's head start, so ``ROLLOUTS``
consecutive rollouts are simulated from an empty start and the last one is reported. Its
off-policy share is, over the responses it trains on, the tokens generated in an earlier rollout
(under an older policy) divided by all their tokens. Step costs come from the same scheduler and
the same throughput model as a full rollout (no cost of its own).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Callable, Optional

import numpy as np

from throughputlab.decide.rollout import EngineCaps, RolloutResult, price_steps
from throughputlab.decide.schedule import _KVLoop, _steps
from throughputlab.records.base import Record
from throughputlab.throughput import ThroughputModel

ROLLOUTS = 4  # consecutive rollouts simulated; the carried-over work settles within two or three


class PartialRollout(Record):
    """A step's generation with partial rollouts against the same engines without them."""

    over_provision: float  # extra prompts in flight, as a share of the batch
    rollouts_simulated: int
    gen_s: float  # the slowest engine's rollout, in steady state
    full_gen_s: float  # the slowest engine's rollout without partial rollouts
    saved_s: float
    saved_share: float  # saved_s / full_gen_s
    off_policy_token_share: float  # of the trained responses' tokens, those generated under an older policy
    carried_responses: int  # unfinished responses carried out of the last rollout (all engines)


def simulate_partial(model: ThroughputModel, prompt_len: int, caps: EngineCaps, prompts: int, group: int,
                     share: int, over: float, draw: Callable[[int, int], np.ndarray],
                     context_max: Optional[int] = None, rollouts: int = ROLLOUTS) -> tuple[RolloutResult, float, int]:
    """The steady-state rollout of one engine that owes ``prompts`` prompts of ``group`` responses
    per step; ``share`` > 1: a prompt's responses share its prefill and KV. ``draw(n, k)`` gives the
    response lengths of ``n`` fresh prompts (``n * group`` values, prompt by prompt) for rollout ``k``.
    Returns the last rollout, its off-policy token share and the responses it carries over."""
    in_flight = math.ceil(prompts * (1 + over) - 1e-9)
    carried: list[tuple[int, int, int]] = []  # (prompt, length, tokens generated) of unfinished responses
    done: dict[int, int] = {}  # open prompts: responses finished
    old_tokens: dict[int, int] = {}  # open prompts: tokens of their finished responses
    next_prompt = 0
    result, off_share = None, 0.0
    for k in range(rollouts):
        open_prompts = sorted({p for p, _, _ in carried} | set(done))  # oldest first
        fresh = max(in_flight - len(open_prompts), 0)
        fresh_lengths = np.asarray(draw(fresh, k), dtype=np.int64).reshape(fresh, group) if fresh else \
            np.zeros((0, group), dtype=np.int64)
        ids = open_prompts + list(range(next_prompt, next_prompt + fresh))
        next_prompt += fresh
        local = {p: j for j, p in enumerate(ids)}
        lengths = [x[1] for x in carried] + [int(x) for x in fresh_lengths.ravel()]
        group_of = [local[x[0]] for x in carried] + [local[p] for p in ids[len(open_prompts):] for _ in range(group)]
        generated = [x[2] for x in carried]
        sim = _KVLoop(np.asarray(lengths), prompt_len, caps, share, group_of)
        n, c = len(lengths), len(carried)
        state = (0, 0, {}, [], [0] * sim.bs, 0, 0, deque(zip(range(c), generated)), c, [0] * len(ids), 0, n, None)
        done_local = [done.get(p, 0) for p in ids]
        ready = sum(d >= group for d in done_local)  # prompts already complete, waiting in the buffer
        records, st, _ = sim.run(state, n, [], stop=max(min(prompts, len(ids)) - ready, 1), done=done_local,
                                 sizes=[group] * len(ids))
        T, run, waiting, nxt = st[1], st[2], st[7], st[8]
        left = {i: lengths[i] - (end - T) for i, (off, end) in run.items()}
        left.update({i: g for i, g in waiting})
        left.update({i: 0 for i in range(nxt, n)})
        before = generated + [0] * (n - c)  # tokens each response had at the start of this rollout
        off = tot = n_trained = 0
        trained: list[int] = []
        carried, new_done, new_old = [], {}, {}
        members_of: list[list[int]] = [[] for _ in ids]
        for i, j in enumerate(group_of):
            members_of[j].append(i)
        for j, p in enumerate(ids):
            members = members_of[j]
            fin = [i for i in members if i not in left]
            if done_local[j] >= group and n_trained < prompts:  # done: trained, oldest first
                n_trained += 1
                trained.extend(fin)
                off += old_tokens.get(p, 0) + sum(before[i] for i in fin)
                tot += old_tokens.get(p, 0) + sum(lengths[i] for i in fin)
            else:
                carried.extend((p, lengths[i], left[i]) for i in members if i in left)
                if done_local[j]:  # (a complete prompt beyond the batch waits for the next step)
                    new_done[p] = done_local[j]
                    new_old[p] = old_tokens.get(p, 0) + sum(lengths[i] for i in fin)
        done, old_tokens = new_done, new_old
        steps = _steps(records, st[10], st[11] < n)
        result = price_steps(model, steps, np.asarray([lengths[i] for i in trained] or lengths), prompt_len, caps,
                             int(context_max or max(lengths)))
        off_share = off / tot if tot else 0.0
    return result, off_share, len(carried)


def partial_rolls(model: ThroughputModel, dist, caps: EngineCaps, prompt_len: int, counts: list[int], group: int,
                  share: int, over: float, seed: int, full_s: float) -> tuple[list[RolloutResult], PartialRollout]:
    """Each engine's steady-state rollout with partial rollouts (:func:`simulate_partial`) for its ``counts``
    prompts of ``group``, each engine drawing its own lengths from ``dist``; and the step's summary against
    ``full_s``, the same batch's rollout without them."""
    rolls, shares, carried = [], [], 0
    for e, c in enumerate(counts):
        base = seed * 1_000_003 + 7919 * e

        def draw(n: int, k: int, base=base) -> np.ndarray:
            return dist.sample(n * group, base + 104_729 * (k + 1), group)
        roll, off, left = simulate_partial(model, prompt_len, caps, c, group, share, over, draw, dist.longest())
        rolls.append(roll)
        shares.append(off)
        carried += left
    gen_s = max(r.wall_s for r in rolls)
    return rolls, PartialRollout(over_provision=over, rollouts_simulated=ROLLOUTS, gen_s=gen_s, full_gen_s=full_s,
                                 saved_s=full_s - gen_s, saved_share=(full_s - gen_s) / full_s if full_s > 0 else 0.0,
                                 off_policy_token_share=float(np.mean(shares)), carried_responses=carried)
