"""Effective learning rate during training: ||dW|| / ||W|| per parameter group per optimizer step.

Works with any torch optimizer: the tracker copies the group's parameters before the step
and compares after it. Use it around `optimizer.step()`:

    tracker = EffectiveLRTracker(optimizer)        # groups named by their "name" key, else "group0", ...
    with tracker.step():                            # or tracker.before_step(); optimizer.step(); tracker.after_step()
        optimizer.step()
    tracker.last            # {"matrices": 1.0e-3, "other": 2.4e-4}: ||dW|| / ||W|| of this step
    tracker.last_norms      # {"matrices": (weight_norm, update_norm), ...}: the columns `lr fit` reads
    tracker.mean()          # per group, averaged over the recorded steps

For a group, ||dW|| and ||W|| are Frobenius norms over all its parameters together (the
group's parameters read as one vector). `per_param=True` records every parameter as well
(keys "group/param-index", or the names given in `param_names`). The copy costs one extra
set of the tracked weights in memory; track only some groups (`groups=[...]`) to save it.
"""

from __future__ import annotations

import contextlib
import math
from typing import Optional, Sequence

import torch


class EffectiveLRTracker:
    def __init__(self, optimizer: torch.optim.Optimizer, groups: Optional[Sequence[str]] = None,
                 per_param: bool = False, param_names: Optional[dict[int, str]] = None):
        """`param_names`: {id(parameter): name}, e.g. {id(p): n for n, p in model.named_parameters()}."""
        self.optimizer = optimizer
        self.names = [g.get("name", f"group{i}") for i, g in enumerate(optimizer.param_groups)]
        unknown = set(groups or []) - set(self.names)
        if unknown:
            raise ValueError(f"unknown parameter group(s) {sorted(unknown)}; the optimizer has {self.names}")
        self.groups = list(groups) if groups is not None else list(self.names)
        self.per_param = per_param
        self.param_names = param_names or {}
        self._before: Optional[list[list[torch.Tensor]]] = None
        self.history: list[dict[str, float]] = []
        self.last: dict[str, float] = {}
        self.last_norms: dict[str, tuple[float, float]] = {}

    def _tracked(self):
        for name, group in zip(self.names, self.optimizer.param_groups):
            if name in self.groups:
                yield name, group["params"]

    @torch.no_grad()
    def before_step(self) -> None:
        self._before = [[p.detach().clone() for p in params] for _, params in self._tracked()]

    @torch.no_grad()
    def after_step(self) -> dict[str, float]:
        if self._before is None:
            raise RuntimeError("call before_step() before after_step()")
        out: dict[str, float] = {}
        norms: dict[str, tuple[float, float]] = {}
        for (name, params), before in zip(self._tracked(), self._before):
            w2 = d2 = 0.0
            for i, (p, b) in enumerate(zip(params, before)):
                pw = float(torch.linalg.vector_norm(b.float())) ** 2
                pd = float(torch.linalg.vector_norm((p.detach() - b).float())) ** 2
                w2 += pw
                d2 += pd
                if self.per_param:
                    key = self.param_names.get(id(p), f"{name}/{i}")
                    out[key] = math.sqrt(pd / pw) if pw > 0 else None
            norms[name] = (math.sqrt(w2), math.sqrt(d2))
            out[name] = math.sqrt(d2 / w2) if w2 > 0 else None  # None: an all-zero group has no relative step
        self._before = None
        self.last, self.last_norms = out, norms
        self.history.append(out)
        return out

    @contextlib.contextmanager
    def step(self):
        """Wrap `optimizer.step()`; the result lands in `.last` and `.history`."""
        self.before_step()
        yield self
        self.after_step()

    def mean(self) -> dict[str, Optional[float]]:
        """Mean per group over the recorded steps (None for a group with no defined value)."""
        out = {}
        for name in self.groups:
            vals = [h[name] for h in self.history if h.get(name) is not None]
            out[name] = sum(vals) / len(vals) if vals else None
        return out
