"""Training backend `torch`: one micro-step of forward, backward and AdamW on synthetic tokens.

Each phase is timed between device synchronisations. Out-of-memory is left to the caller
(the sweep runner records it as an `oom` point), after which ``release`` frees what the
failed step held so the sweep can go on.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from throughputlab.backends.torch_common import (
    InProcessTorchBackend,
    PeakMemory,
    build_model,
    release,
    sync,
    synthetic_ids,
)
from throughputlab.models import ResolvedModel
from throughputlab.records.profile import TrainSample


class TorchTrainingBackend(InProcessTorchBackend):
    name = "torch"

    def __init__(self, resolved: ResolvedModel, *, dtype: str, device: str, seed: int = 0,
                 lr: float = 1e-5, track_effective_lr: bool = False):
        self.resolved = resolved
        self.dtype = dtype
        self.device = device
        self.seed = seed
        self.lr = lr
        self.track_effective_lr = track_effective_lr
        self.model = None
        self.optimizer = None
        self.last_effective_lr: Optional[dict[str, float]] = None
        self._peak = PeakMemory(device)
        self._gen = torch.Generator().manual_seed(seed + 1)

    def start(self) -> None:
        self.model = build_model(self.resolved, self.dtype, self.device, self.seed)
        self.model.train()
        # fused/foreach AdamW as the default torch picks for the device; states in the model dtype
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=0.0)

    def run(self, micro_batch: int, seq_len: int) -> TrainSample:
        model, opt = self.model, self.optimizer
        ids = synthetic_ids(micro_batch, seq_len, self.resolved.spec.vocab_size, self.device, self._gen)
        tracker = self._tracker()
        sync(self.device)
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        sync(self.device)
        t1 = time.perf_counter()
        loss.backward()
        sync(self.device)
        t2 = time.perf_counter()
        if tracker is not None:
            tracker.before_step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(self.device)
        t3 = time.perf_counter()
        if tracker is not None:
            self.last_effective_lr = tracker.after_step()
        del loss, ids
        return TrainSample(step_s=t3 - t0, forward_s=t1 - t0, backward_s=t2 - t1, optimizer_s=t3 - t2)

    def _tracker(self):
        if not self.track_effective_lr:
            return None
        from throughputlab.lr.effective import EffectiveLRTracker

        return EffectiveLRTracker(self.optimizer)

    def release(self) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        super().release()

    def close(self) -> None:
        self.model = self.optimizer = None
        release(self.device)
