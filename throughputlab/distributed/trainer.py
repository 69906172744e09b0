"""One FSDP2 training micro-step on this rank, with every outcome agreed by all ranks.

The model is built as the single-process torch backend builds it (same preset, same seed on
every rank, hence the same weights before sharding), sharded per decoder block then at the
root, and trained with AdamW (same settings as that backend). Every rank draws the same global
micro-batch of synthetic token ids and trains on its own slice.

**Uneven micro-batches.** A global micro-batch of ``b`` sequences over ``N`` ranks gives the
first ``b % N`` ranks ``b // N + 1`` sequences and the others ``b // N``. Each rank's loss is
weighted by ``n_r * N / b`` so that FSDP's average over ranks is the mean over all ``b``
sequences, the single-process loss. A rank with no sequence (``b < N``) still runs one, at
weight 0, because every rank must take part in the collectives. The step then lasts as long as
the rank with the most sequences.

**Agreement.** After each phase (forward, backward, optimizer) the ranks all-reduce a failure
code, so an out-of-memory error on one rank makes every rank raise :class:`RankFailure` with
the same verdict and the sweep records the point as ``oom`` on all of them. This holds for a
failure that leaves the collectives matched: the loss and logits at the end of the forward
(where large micro-batches run out of memory first), the optimizer step (its states appear on
the first step). A rank that fails inside a decoder block leaves the others waiting in a
collective; they stop after the process group's timeout and the run ends (the launcher records
the point in flight as ``error``).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.profiler import record_function

from throughputlab.backends.torch_common import build_model, is_oom, sync, synthetic_ids
from throughputlab.distributed import fsdp
from throughputlab.distributed.comm import PHASE_PREFIX
from throughputlab.distributed.ranks import RankContext, agree_max, gather_floats, gather_objects
from throughputlab.errors import first_line
from throughputlab.models import ResolvedModel
from throughputlab.records.distributed import RankPhases

log = logging.getLogger(__name__)

# Test hook, read by the ranks only: "oom:rank=1:micro_batch=4" raises an out-of-memory error at the
# loss on rank 1 when the global micro-batch is 4; "error:..." raises a RuntimeError there;
# "sleep:rank=1:micro_batch=4:seconds=60" makes that rank stall (so a test can kill it mid-point).
FAIL_ENV = "THROUGHPUTLAB_TEST_RANK_FAULT"

_OK, _ERROR, _OOM = 0, 1, 2
PHASES = ("forward", "backward", "optimizer")


class RankFailure(RuntimeError):
    """A micro-step failed on at least one rank; raised on every rank with the same message."""

    def __init__(self, message: str, oom: bool):
        super().__init__(message)
        self.oom = oom


def split_batch(b: int, n: int) -> list[int]:
    """Sequences per rank for a global micro-batch of ``b`` over ``n`` ranks (first ranks get the rest)."""
    return [b // n + (1 if r < b % n else 0) for r in range(n)]


def loss_weight(n_rank: int, b: int, n: int) -> float:
    """Weight of a rank's mean loss so that FSDP's average over ranks is the mean over all ``b`` sequences."""
    return n_rank * n / b


@dataclass
class Fault:
    kind: str  # oom | error | sleep
    rank: int
    micro_batch: Optional[int]
    seconds: float = 0.0

    @classmethod
    def from_env(cls) -> Optional["Fault"]:
        text = os.environ.get(FAIL_ENV, "").strip()
        if not text:
            return None
        kind, *items = text.split(":")
        opts = dict(i.split("=", 1) for i in items)
        return cls(kind=kind, rank=int(opts.get("rank", 0)),
                   micro_batch=int(opts["micro_batch"]) if "micro_batch" in opts else None,
                   seconds=float(opts.get("seconds", 0)))

    def fire(self, rank: int, micro_batch: int) -> None:
        if rank != self.rank or (self.micro_batch is not None and micro_batch != self.micro_batch):
            return
        if self.kind == "oom":
            raise torch.OutOfMemoryError(f"out of memory (injected by {FAIL_ENV} on rank {rank})")
        if self.kind == "error":
            raise RuntimeError(f"injected by {FAIL_ENV} on rank {rank}")
        if self.kind == "sleep":
            time.sleep(self.seconds)


class FSDPTrainer:
    """The sharded model and its optimizer on this rank."""

    def __init__(self, ctx: RankContext, resolved: ResolvedModel, *, dtype: str, seed: int = 0, lr: float = 1e-5,
                 activation_checkpointing: bool = False):
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"training on ranks takes float32 or bfloat16, got {dtype}")
        self.ctx = ctx
        self.resolved = resolved
        self.dtype = dtype
        self.seed = seed
        self.lr = lr
        self.activation_checkpointing = activation_checkpointing
        self.model = None
        self.optimizer = None
        self.fault = Fault.from_env()
        self.grad_bytes: Optional[int] = None  # this rank's gradient shards after the last backward
        self._gen = torch.Generator().manual_seed(seed + 1)  # the single-process backend's stream of ids

    @property
    def master_dtype(self) -> str:
        return "float32"

    @property
    def reduce_dtype(self) -> str:
        return "float32"

    def start(self) -> None:
        # float32 master weights on every dtype; bfloat16 runs compute through the mixed-precision policy
        model = build_model(self.resolved, self.master_dtype, self.ctx.device, self.seed)
        model.train()
        fsdp.apply_fsdp(model, dtype=self.dtype, activation_checkpointing=self.activation_checkpointing)
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=self.lr, weight_decay=0.0)

    def global_ids(self, micro_batch: int, seq_len: int) -> torch.Tensor:
        """The next global micro-batch: the same ids on every rank (same generator, same draws)."""
        return synthetic_ids(micro_batch, seq_len, self.resolved.spec.vocab_size, "cpu", self._gen)

    def rank_slice(self, ids: torch.Tensor) -> tuple[torch.Tensor, float]:
        """This rank's sequences of the global micro-batch and the weight of its loss."""
        b, n, r = ids.shape[0], self.ctx.world_size, self.ctx.rank
        counts = split_batch(b, n)
        start = sum(counts[:r])
        if counts[r] == 0:
            return ids[:1].to(self.ctx.device), 0.0
        return ids[start:start + counts[r]].to(self.ctx.device), loss_weight(counts[r], b, n)

    def step(self, ids: torch.Tensor, *, after_backward: Optional[Callable[[], None]] = None) -> list[RankPhases]:
        """One micro-step on the global micro-batch ``ids``; every rank's phases, agreed.

        Each phase is timed from the moment all ranks agreed the previous one (or the step's
        start) to this rank's device synchronisation. ``after_backward`` runs, untimed, with
        the reduced gradients in place (the parity check reads them there).
        """
        model, opt, ctx = self.model, self.optimizer, self.ctx
        mine, weight = self.rank_slice(ids)
        b = ids.shape[0]
        times: list[float] = []
        loss = None

        def forward():
            nonlocal loss
            out = model(input_ids=mine, labels=mine, use_cache=False)
            if self.fault is not None:
                self.fault.fire(ctx.rank, b)
            loss = out.loss if weight == 1.0 else out.loss * weight

        def backward():
            loss.backward()

        def optimizer():
            opt.step()
            opt.zero_grad(set_to_none=True)

        try:
            self._agree("start", None)
            for name, phase in zip(PHASES, (forward, backward, optimizer)):
                if name == "optimizer" and after_backward is not None:
                    after_backward()
                t0 = time.perf_counter()
                failure = None
                try:
                    with record_function(PHASE_PREFIX + name):  # the profiler's window (comm.split_trace)
                        phase()
                        sync(ctx.device)
                except Exception as e:  # agreed below: every rank raises, or none
                    failure = e
                times.append(time.perf_counter() - t0)
                self._agree(name, failure)
                if name == "backward":
                    loss = None
                    self.grad_bytes = fsdp.grad_bytes(model)
        finally:
            loss = None  # a failed step's graph (activations) goes now, not with the exception's frames
        rows = gather_floats(ctx, times)
        return [RankPhases(forward_s=f, backward_s=bw, optimizer_s=o) for f, bw, o in rows]

    def _agree(self, phase: str, failure: Optional[BaseException]) -> None:
        code = _OK if failure is None else _OOM if is_oom(failure) else _ERROR
        worst = agree_max(self.ctx, code)
        if worst == _OK:
            return
        what = None if failure is None else f"{type(failure).__name__}: {first_line(failure)}"
        reports = gather_objects(self.ctx, what)
        culprits = "; ".join(f"rank {r}: {w}" for r, w in enumerate(reports) if w)
        kind = "out of memory" if worst == _OOM else "failed"
        raise RankFailure(f"{kind} in the {phase} ({culprits})", oom=worst == _OOM) from failure

    def release(self) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)

    def close(self) -> None:
        self.model = self.optimizer = None
