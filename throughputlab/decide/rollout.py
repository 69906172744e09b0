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

import math
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from throughputlab import roofline as rf
from throughputlab.decide.lengths import LengthDist  # noqa: F401  (simulate_rollout's callers pass one)
from throughputlab.decide.schedule import kv_blocks, schedule_kv, schedule_slots, Steps
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
    steps: Optional[Steps] = None
    if not force_event_loop or caps.kv_cache_tokens is None:
        steps, starts, ends = schedule_slots(lengths, prompt_len, slots, group)
        if caps.kv_cache_tokens is not None and _kv_overflows(steps, starts, ends, prompt_len, caps, group):
            steps = None
    if steps is None:
        steps = schedule_kv(lengths, prompt_len, caps.model_copy(update={"max_num_seqs": slots}), group)
    t, decode_only = step_costs(model, steps)
    return _summarise(model, steps, t, decode_only, lengths, prompt_len, caps, timeline_points)


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
def _knee_key(costs, bw: float, phi: float, s: float) -> float:
    knee = rf.knee(costs, s, bw, phi)
    return math.inf if knee is None else knee  # inf stays internal: no concurrency reaches it


def _knee_cached(model: ThroughputModel, s: float) -> float:
    d = model.require("decode")
    return _knee_key(model.costs, d.bw_bytes_per_s, d.phi_flops_per_s, s)


def _summarise(model: ThroughputModel, st: Steps, t: np.ndarray, decode_only: np.ndarray, lengths: np.ndarray,
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
