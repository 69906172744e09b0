"""Rollout drain simulation: the wall time of one synchronous rollout under continuous batching.

A batch of ``B`` requests starts at concurrency ``min(B, cap)``, drains as responses finish
and refills from the queue (DESIGN.md, "Rollout drain model"). The engine works in steps:
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
import re
from collections import deque
from pathlib import Path
from functools import lru_cache
from typing import Literal, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict

from throughputlab.errors import UserError
from throughputlab.roofline import ThroughputModel, knee_concurrency, knee_concurrency_numeric

TIMELINE_POINTS = 240  # points kept of the concurrency-over-time curve


# ---------------------------------------------------------------- response lengths


class LengthDist(BaseModel):
    """Response lengths in tokens: observed values (resampled) or a parametric form, cut at ``max_tokens``."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["observed", "lognormal", "uniform", "fixed"]
    mean: Optional[float] = None  # lognormal: mean length in tokens (before the cut)
    sigma: Optional[float] = None  # lognormal: standard deviation of log(length)
    low: Optional[int] = None  # uniform
    high: Optional[int] = None  # uniform, inclusive; fixed uses it as the length
    max_tokens: Optional[int] = None  # the generation cut; responses longer than it stop there
    values: list[int] = []  # observed
    source: Optional[str] = None  # where the observed values came from

    def sample(self, n: int, seed: int = 0) -> np.ndarray:
        """``n`` lengths, deterministic for a seed; always in [1, max_tokens]."""
        rng = np.random.default_rng(seed)
        if self.kind == "observed":
            x = rng.choice(np.asarray(self.values, dtype=np.int64), size=n, replace=True)
        elif self.kind == "lognormal":
            mu = math.log(self.mean) - self.sigma ** 2 / 2  # so that E[length] = mean
            x = np.rint(rng.lognormal(mu, self.sigma, size=n))
        elif self.kind == "uniform":
            x = rng.integers(self.low, self.high + 1, size=n)
        else:
            x = np.full(n, self.high)
        x = np.maximum(np.asarray(x, dtype=np.int64), 1)
        if self.max_tokens is not None:
            x = np.minimum(x, self.max_tokens)
        return x

    def describe(self) -> str:
        cut = f", cut at {self.max_tokens}" if self.max_tokens else ""
        if self.kind == "observed":
            return f"{len(self.values)} observed lengths from {self.source or 'a list'} (resampled){cut}"
        if self.kind == "lognormal":
            return f"lognormal, mean {self.mean:g} tokens, sigma {self.sigma:g}{cut}"
        if self.kind == "uniform":
            return f"uniform {self.low}..{self.high} tokens{cut}"
        return f"fixed {self.high} tokens{cut}"


_DIST_KEYS = {"lognormal": {"mean", "sigma", "max"}, "uniform": {"min", "max"}, "fixed": {"len"}}


def parse_length_dist(text: str, option: str = "--response-dist") -> LengthDist:
    """``lognormal:mean=300,sigma=0.6,max=1024`` | ``uniform:min=16,max=512`` | ``fixed:len=256``."""
    kind, _, rest = str(text).strip().partition(":")
    kind = kind.strip().lower()
    if kind not in _DIST_KEYS:
        raise UserError(f"{option} {text!r}: unknown form {kind!r}; use lognormal:mean=..,sigma=..,max=.. "
                        "or uniform:min=..,max=.. or fixed:len=..")
    kv = parse_kv(rest, option, text)
    unknown = set(kv) - _DIST_KEYS[kind]
    missing = {"mean", "sigma"} - set(kv) if kind == "lognormal" else _DIST_KEYS[kind] - set(kv)
    if unknown or missing:
        what = f"unknown key(s) {', '.join(sorted(unknown))}" if unknown else f"missing {', '.join(sorted(missing))}"
        raise UserError(f"{option} {text!r}: {what}; {kind} takes {', '.join(sorted(_DIST_KEYS[kind]))}")
    try:
        if kind == "lognormal":
            mean, sigma = float(kv["mean"]), float(kv["sigma"])
            cut = _pos_int(kv["max"], option, "max") if "max" in kv else None
            if not (mean > 0 and sigma >= 0 and math.isfinite(mean) and math.isfinite(sigma)):
                raise ValueError
            return LengthDist(kind="lognormal", mean=mean, sigma=sigma, max_tokens=cut)
        if kind == "uniform":
            lo, hi = _pos_int(kv["min"], option, "min"), _pos_int(kv["max"], option, "max")
            if hi < lo:
                raise UserError(f"{option} {text!r}: max must be at least min")
            return LengthDist(kind="uniform", low=lo, high=hi, max_tokens=hi)
        n = _pos_int(kv["len"], option, "len")
        return LengthDist(kind="fixed", high=n, max_tokens=n)
    except ValueError:
        raise UserError(f"{option} {text!r}: mean must be positive and sigma non-negative numbers") from None


def parse_kv(rest: str, option: str, text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise UserError(f"{option} {text!r}: expected key=value pairs separated by commas, got {part!r}")
        out[key.strip()] = value.strip()
    return out


def _pos_int(v: str, option: str, key: str) -> int:
    try:
        f = float(v)
    except ValueError:
        f = -1.0
    if not (f >= 1 and f == int(f)):
        raise UserError(f"{option}: {key} must be a positive integer, got {v!r}")
    return int(f)


def read_lengths_file(path: str | Path, max_tokens: Optional[int] = None,
                      option: str = "--response-lengths") -> LengthDist:
    """Observed response lengths: numbers separated by whitespace or commas, a JSON list, or a
    CSV whose single column (or column named response_len, length or tokens) holds them."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise UserError(f"{option} {path}: cannot read it ({e.strerror or e})") from None
    values: list[float]
    stripped = text.strip()
    if stripped.startswith("["):
        import json

        try:
            values = [float(x) for x in json.loads(stripped)]
        except (ValueError, TypeError):
            raise UserError(f"{option} {path}: expected a JSON list of numbers") from None
    else:
        tokens = [t for t in re.split(r"[\s,;]+", stripped) if t]
        try:
            values = [float(t) for t in tokens]
        except ValueError:
            values = _lengths_from_csv(p, option)
    if not values:
        raise UserError(f"{option} {path}: holds no lengths; write one response length (tokens) per line")
    arr = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(arr)) or np.any(arr < 1) or np.any(arr != np.round(arr)):
        raise UserError(f"{option} {path}: lengths must be positive whole token counts")
    return LengthDist(kind="observed", values=[int(v) for v in arr], max_tokens=max_tokens, source=str(path))


def _lengths_from_csv(p: Path, option: str) -> list[float]:
    import pandas as pd

    try:
        df = pd.read_csv(p)
    except Exception as e:  # pandas raises several parser errors; all mean "not a table we can read"
        raise UserError(f"{option} {p}: not a list of numbers nor a readable CSV ({type(e).__name__})") from None
    for name in ("response_len", "response_length", "length", "tokens", "num_tokens"):
        if name in df.columns:
            col = df[name]
            break
    else:
        if len(df.columns) != 1:
            raise UserError(f"{option} {p}: CSV has columns {', '.join(map(str, df.columns))}; "
                            "name the length column response_len")
        col = df.iloc[:, 0]
    col = pd.to_numeric(col, errors="coerce")
    if col.isna().any():
        raise UserError(f"{option} {p}: the length column holds non-numbers")
    return col.astype(float).tolist()


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


def _schedule_slots(lengths: np.ndarray, prompt_len: int, slots: int) -> tuple[_Steps, np.ndarray, np.ndarray]:
    """List scheduling on ``slots`` slots in FCFS order; returns the steps and each request's start and end step."""
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
    q1 = new * float(prompt_len)
    steps = _Steps(dec=dec.astype(float), ctx=ctx, new=new.astype(float), q1=q1, q2=q1 * prompt_len,
                   rq1=np.zeros(total))
    return steps, starts, ends


def _blocks(tokens, block: int):
    return -(-tokens // block)


def _schedule_kv(lengths: np.ndarray, prompt_len: int, caps: EngineCaps) -> _Steps:
    """Event loop with KV-cache accounting in blocks, preemption by recomputation (vLLM V1 policy:
    the most recently admitted running request is preempted and goes back to the front of the queue;
    no admission in a step that preempted)."""
    n = len(lengths)
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
        need = _blocks(run_ctx + 1, bs)
        used = int(need.sum())
        while len(run_id) and used > total_blocks:
            i, left = run_id[-1], run_left[-1]
            waiting.appendleft((int(i), int(lengths[i] - left)))
            used -= int(need[-1])
            run_id, run_ctx, run_left, need = run_id[:-1], run_ctx[:-1], run_left[:-1], need[:-1]
            preemptions += 1
            preempted = kv_limited = True
        n_dec = len(run_id)
        ctx_sum = float(run_ctx.sum()) + n_dec
        # 2. admissions (prefill), not in a step that preempted
        new_ids, new_q = [], []
        if not preempted:
            while waiting and n_dec + len(new_ids) < max_seqs:
                i, g = waiting[0]
                q = prompt_len + g
                blocks = -(-q // bs)
                if used + blocks > total_blocks:
                    kv_limited = True
                    break
                waiting.popleft()
                used += blocks
                new_ids.append(i)
                new_q.append(q)
        if n_dec == 0 and not new_ids:
            raise UserError(f"one request needs {prompt_len + int(lengths.max())} KV-cache tokens but the cache holds "
                            f"{caps.kv_cache_tokens}: raise kv_cache_tokens or lower max_tokens")
        q1 = float(sum(new_q))
        records.append((n_dec, ctx_sum, 1, 0.0, len(new_ids), q1, float(sum(x * x for x in new_q)),
                        float(sum(x for x in new_q if x > prompt_len))))
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
            run_id, run_ctx, run_left = run_id[keep], run_ctx[keep], run_left[keep]
        if not len(run_id):
            continue
        # 4. jump: until the next finish nothing can be admitted (the cache only fills up and no slot
        #    frees), so run whole steps at constant concurrency while the growing contexts still fit
        if waiting and len(run_id) < max_seqs and not _admission_blocked(run_ctx, waiting[0][1], prompt_len,
                                                                         bs, total_blocks):
            continue
        k = _steps_that_fit(run_ctx, int(run_left.min()), bs, total_blocks)
        if k <= 0:
            continue
        d = len(run_id)
        records.append((d, float(run_ctx.sum()) + d, k, float(d), 0, 0.0, 0.0, 0.0))
        run_ctx = run_ctx + k
        run_left = run_left - k
        keep = run_left > 0
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


def _combine(mem, comp, p: Optional[float]):
    if p is None:
        return np.maximum(mem, comp)
    m = np.maximum(np.maximum(mem, comp), 1e-300)
    return m * ((mem / m) ** p + (comp / m) ** p) ** (1.0 / p)


def _weight_bytes(model: ThroughputModel, tokens: np.ndarray) -> np.ndarray:
    """Vectorised ``Costs.weight_bytes_for``: W(c), with the experts a step touches for MoE."""
    c = model.costs
    tokens = np.asarray(tokens, dtype=float)
    if not c.moe_num_experts:
        return np.full_like(tokens, c.weight_bytes)
    e, k = c.moe_num_experts, c.moe_top_k or 1
    touched = e * (1.0 - (1.0 - k / e) ** tokens)
    w = c.weight_bytes + c.moe_layers * (touched - k) * c.moe_expert_bytes
    return np.where(tokens <= 1, c.weight_bytes, w)


def step_costs(model: ThroughputModel, st: _Steps) -> tuple[np.ndarray, np.ndarray]:
    """Time of each step and the part that is decode alone (roofline.py formulas, vectorised).

    A mixed step is one forward pass: its memory term reads the weights and the decodes' KV,
    its compute term adds the prefill FLOPs (at the prefill's own FLOP rate when fitted).
    A step with prefill only is ``prefill_s`` exactly; one with decodes only, ``decode_step_s``.
    """
    d = model._need(model.decode, "decode")
    pp = model.prefill or d
    c = model.costs
    mem_dec = (_weight_bytes(model, st.dec + st.q1) + st.ctx * c.kv_bytes_per_token) / d.bw_bytes_per_s
    comp_dec = (st.dec * c.flops_per_token + st.ctx * c.attn_flops_per_ctx_token) / d.phi_flops_per_s
    comp_pre = (st.q1 * c.flops_per_token + st.q2 * c.attn_flops_per_ctx_token / 2) / pp.phi_flops_per_s
    per_seq = st.dec * d.t_seq_s
    mixed = d.t0_s + per_seq + _combine(mem_dec, comp_dec + comp_pre, d.smooth_p)
    pure_prefill = pp.t0_s + np.maximum(_weight_bytes(model, st.q1) / pp.bw_bytes_per_s, comp_pre)
    mem_only = (_weight_bytes(model, st.dec) + st.ctx * c.kv_bytes_per_token) / d.bw_bytes_per_s
    decode_only = np.where(st.dec > 0, d.t0_s + per_seq + _combine(mem_only, comp_dec, d.smooth_p), 0.0)
    has_dec = st.dec > 0
    t = np.where(has_dec, np.where(st.new > 0, mixed, decode_only), pure_prefill)
    return t, decode_only


# ---------------------------------------------------------------- the simulation


def simulate_rollout(model: ThroughputModel, lengths: Sequence[int] | np.ndarray, prompt_len: int,
                     caps: Optional[EngineCaps] = None, *, timeline_points: int = TIMELINE_POINTS,
                     force_event_loop: bool = False) -> RolloutResult:
    """Predict the rollout of one request per entry of ``lengths`` (response tokens), all with
    ``prompt_len`` prompt tokens, under ``caps`` (default: none)."""
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
    slots = min(n, caps.max_num_seqs or n)
    steps: Optional[_Steps] = None
    if not force_event_loop or caps.kv_cache_tokens is None:
        steps, starts, ends = _schedule_slots(lengths, prompt_len, slots)
        if caps.kv_cache_tokens is not None and _kv_overflows(steps, starts, ends, prompt_len, caps):
            steps = None
    if steps is None:
        steps = _schedule_kv(lengths, prompt_len, caps.model_copy(update={"max_num_seqs": slots}))
    t, decode_only = step_costs(model, steps)
    return _summarise(model, steps, t, decode_only, lengths, prompt_len, caps, timeline_points)


def _kv_overflows(st: _Steps, starts: np.ndarray, ends: np.ndarray, prompt_len: int, caps: EngineCaps) -> bool:
    """Whether the slot schedule ever needs more KV blocks than the cache holds (block rounding
    bounded above by one partial block per request)."""
    tokens_after = st.ctx + st.q1  # KV held during each step (decode contexts include the new token)
    active = st.dec + st.new
    bound = tokens_after + active * (caps.block_size - 1)
    if np.all(bound <= caps.kv_cache_tokens):
        return False
    # exact check of the block count, per step, only where the bound is exceeded
    bs = caps.block_size
    total_blocks = caps.kv_cache_tokens // bs
    over = np.flatnonzero(bound > caps.kv_cache_tokens)
    for j in over[:64]:  # beyond a few steps, the exact event loop is cheaper than checking them all
        live = (starts <= j) & (ends > j)
        held = prompt_len + (j - starts[live])  # includes the token processed in this step
        if int(_blocks(held, bs).sum()) > total_blocks:
            return True
    return len(over) > 64


@lru_cache(maxsize=4096)
def _knee_key(costs, t0: float, bw: float, phi: float, s: float) -> float:
    knee = (knee_concurrency_numeric(costs, s, bw, phi) if costs.moe_num_experts
            else knee_concurrency(costs, s, bw, phi))
    return math.inf if knee is None else knee  # inf stays internal: no concurrency reaches it


def _knee_cached(model: ThroughputModel, s: float) -> float:
    d = model._need(model.decode, "decode")
    return _knee_key(model.costs, d.t0_s, d.bw_bytes_per_s, d.phi_flops_per_s, s)


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
