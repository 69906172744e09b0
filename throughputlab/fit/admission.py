"""The admission limit of a measured or imported generation sweep: how many requests the engine ran at
once, where it held the rest in its queue.

An engine runs at most min(concurrency, sequences its KV cache holds, max_num_seqs) (roofline.engine);
past that, tokens/s stays flat while the decode step stops growing: the queued requests wait, they do
not widen the batch. A compute-bound engine flattens too, but its decode step grows with every
request. The limit comes, in this order, from:

1. the engine's recorded settings (``Profile.engine``: the KV cache in tokens and its block size, as
   vLLM logs them, and max_num_seqs), evaluated at each point's lengths;
2. the curve: from the first concurrency past which tokens/s gains under ``FLAT_GAIN`` and the decode
   step (timed per step, or the inter-token latency of an HTTP benchmark) grows under ``FLAT_STEP``
   across at least one doubling of concurrency. Without step times a flat curve cannot say which it
   is, and is left to the roofline.

The generation fit then treats each point past the limit as batches of the limit (fit.observations).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Optional

from throughputlab import roofline as rf
from throughputlab.records.profile import GenPoint, Profile

FLAT_GAIN = 0.10  # tokens/s within 10% over a doubling of concurrency: no more requests in the batch
FLAT_STEP = 0.15  # while the decode step grows under 15% (compute-bound it would grow ~2x)


@dataclass
class Admission:
    admitted: Callable[[int, int, int], int]  # (concurrency, prompt, output) -> requests run at once
    limit: int  # at the sweep's widest shape
    bound: str  # "KV cache", "max_num_seqs" or "the curve"
    note: str
    from_curve: bool = False


def _step_s(p: GenPoint) -> Optional[float]:
    """The point's decode step: timed per step, else the median inter-token latency it recorded."""
    if p.decode_step_s:
        return p.decode_step_s
    itl = [x for s in p.samples for x in s.itl_s]
    return statistics.median(itl) if itl else None


def recorded(profile: Profile, points: list[GenPoint]) -> Optional[Admission]:
    """The limit the engine's recorded KV cache and max_num_seqs set, if it bites at a measured point."""
    e = profile.engine
    if e is None or (e.kv_cache_tokens is None and e.max_num_seqs is None):
        return None
    block = int(e.engine_args.get("block_size") or rf.BLOCK_TOKENS["vllm"])
    optimistic = e.name in rf.OPTIMISTIC_ADMISSION_ENGINES

    def admitted(c: int, p: int, o: int) -> int:
        return rf.admitted(c, rf.kv_sequences(e.kv_cache_tokens, p, o, block, optimistic), e.max_num_seqs)

    held = [q for q in points if admitted(q.concurrency, q.prompt_len, q.output_len) < q.concurrency]
    if not held:
        return None
    q = max(held, key=lambda x: x.prompt_len + x.output_len)
    limit = admitted(10**9, q.prompt_len, q.output_len)
    bound = rf.admission_bound(10**9, rf.kv_sequences(e.kv_cache_tokens, q.prompt_len, q.output_len, block, optimistic),
                               e.max_num_seqs) or "KV cache"
    bound = bound.removeprefix("admission: ")
    kv = f"a KV cache of {e.kv_cache_tokens:,} tokens" if e.kv_cache_tokens else "no KV figure"
    return Admission(admitted, limit, bound,
                     f"admission: the engine recorded {kv} and max_num_seqs {e.max_num_seqs}: it runs at most {limit} "
                     f"requests of {q.prompt_len} + {q.output_len} tokens at once ({bound}); {len(held)} point(s) "
                     "past it are fitted as batches of that many", from_curve=False)


def from_curve(points: list[GenPoint]) -> Optional[Admission]:
    """The concurrency past which tokens/s and the decode step stay flat, at one shape (the most points)."""
    shapes: dict[tuple[int, int], list[GenPoint]] = {}
    for p in points:
        shapes.setdefault((p.prompt_len, p.output_len), []).append(p)
    pts = sorted(max(shapes.values(), key=len), key=lambda p: p.concurrency)
    if len(pts) < 4:
        return None
    for i, base in enumerate(pts[:-1]):
        rest = pts[i + 1:]
        if rest[-1].concurrency < 2 * base.concurrency or i == 0:
            continue
        steps = [_step_s(p) for p in (base, *rest)]
        if any(s is None for s in steps):
            return None
        tps = [p.tokens_per_s for p in (base, *rest)]
        gain_ok = all(t <= tps[0] * (1 + FLAT_GAIN) for t in tps[1:])
        step_ok = all(s <= steps[0] * (1 + FLAT_STEP) for s in steps[1:])
        # below the limit the batch still widened: tokens/s rose into it
        rising = pts[i - 1].tokens_per_s < tps[0] / (1 + FLAT_GAIN)
        if gain_ok and step_ok and rising:
            limit = base.concurrency
            return Admission(lambda c, p, o: min(c, limit), limit, "the curve",
                             f"admission: from concurrency {limit} tokens/s stays within {FLAT_GAIN:.0%} and the decode "
                             f"step within {FLAT_STEP:.0%} up to {rest[-1].concurrency}: the engine ran at most about "
                             f"{limit} requests at once and queued the rest (identified from the curve; the engine's "
                             "KV cache or max_num_seqs was not recorded); the points past it are fitted as batches of "
                             f"{limit}", from_curve=True)
    return None


def admission_of(profile: Profile, points: list[GenPoint]) -> Optional[Admission]:
    """The recorded limit where the engine said it, else the one the curve shows, else None."""
    return recorded(profile, points) or from_curve(points)
