"""A measured generation point reduced to what the generation fit uses (medians over its raw samples),
as the engine ran it: where it admitted fewer requests at once than were sent, as batches of what it
admitted (fit.admission says how many)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from throughputlab import roofline as rf
from throughputlab.records.profile import GenPoint


@dataclass
class GenObs:
    """One generation point reduced to what the fit uses (medians over its raw samples)."""

    c: int
    p: int
    o: int
    tokens_per_s: float
    total_s: float  # one batch of c requests, as the tokens/s implies
    decode_step_s: Optional[float]
    prefill_s: Optional[float]
    overhead_s: Optional[float]  # total - prefill - decode, when the backend splits them
    point: Optional[GenPoint] = field(default=None, repr=False)
    probe_step_s: Optional[float] = None  # the overhead probe's mean decode step (hf backend)
    requested: int = 0  # the point's concurrency; c is what the engine ran at once (fewer where it held some back)

    @property
    def s(self) -> float:
        return rf.mean_context(self.p, self.o)


def _mean_step_s(p: GenPoint) -> Optional[float]:
    """Median over repeats of each repeat's mean decode step: what its tokens/s is made of (a
    stalled step counts as in the wall time), yet one bad repeat does not move it."""
    per = [s.decode_s / max(p.output_len - 1, 1) for s in p.samples if s.decode_s]
    return statistics.median(per) if per else p.decode_step_s


def _probe_step_s(p: GenPoint) -> Optional[float]:
    per = [statistics.fmean(s.probe_decode_step_s) for s in p.samples if s.probe_decode_step_s]
    return statistics.median(per) if per and len(per) == len(p.samples) else None


def gen_obs(p: GenPoint, admitted: Optional[Callable[[int, int, int], int]] = None) -> GenObs:
    """The point as the fit sees it. Where the engine ran ``a = admitted(c, p, o)`` < c requests at once, the
    c requests ran as c/a batches of a: tokens/s is a batch of a's; the decode step, timed per step (or the
    inter-token latency), is already one of a running; the time to the first token holds the queue's wait,
    so it says nothing of a prefill and is left out."""
    tps = p.tokens_per_s
    split = [s.total_s - s.prefill_s - s.decode_s for s in p.samples
             if s.prefill_s is not None and s.decode_s is not None]
    c = p.concurrency
    a = min(c, max(int(admitted(c, p.prompt_len, p.output_len)), 1)) if admitted else c
    queued = a < c
    return GenObs(c=a, p=p.prompt_len, o=p.output_len, tokens_per_s=tps,
                  total_s=a * p.output_len / tps, decode_step_s=_mean_step_s(p),
                  prefill_s=None if queued else p.prefill_s,
                  overhead_s=None if queued or not split else statistics.median(split), point=p,
                  probe_step_s=_probe_step_s(p), requested=c)


def resampled(p: GenPoint, rng: np.random.Generator, admitted=None) -> GenObs:
    idx = rng.integers(0, len(p.samples), len(p.samples))
    return gen_obs(p.model_copy(update={"samples": [p.samples[i] for i in idx]}), admitted)
