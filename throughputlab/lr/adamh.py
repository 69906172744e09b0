"""AdamH: Adam whose matrix updates are scaled to the weight norm and re-projected onto the initial norm.

For each 2-D weight matrix W with initial Frobenius norm R and Adam direction
u = m_hat / (sqrt(v_hat) + eps):

    W <- R * normalize(W - lr * R * normalize(u))

so ||W|| stays R. By default (`tangent=True`) the radial part of u (along W) is removed
first: re-projection would cancel it anyway, and without it the step moves W by the angle
atan(lr), a relative step ||dW|| / ||W|| = 2 sin(atan(lr) / 2) = lr (1 - 3 lr^2 / 8 + ...),
i.e. the learning rate to 4e-7 relative at lr = 1e-3. `tangent=False` applies the formula to
u as it is; then the relative step is lr * sqrt(1 - c^2) + O(lr^2), c the cosine between u and
W, which drifts below lr as training aligns the update with the weight. Every other parameter (embeddings, norms, biases) takes
a plain AdamW step. Which parameters are matrices: 2-D tensors unless their group sets
`adamh=False`; `adamh_param_groups(model)` puts nn.Linear weights in AdamH groups and
everything else (nn.Embedding included) in AdamW groups.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn


class AdamH(torch.optim.Optimizer):
    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, tangent: bool = True):
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}")
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, tangent=tangent, adamh=None)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if self._is_matrix(group, p):
                    norm = float(torch.linalg.vector_norm(p.detach().float()))
                    if norm == 0:
                        raise ValueError("AdamH needs non-zero initial weight matrices (their norm is kept)")
                    self.state[p]["init_norm"] = norm

    @staticmethod
    def _is_matrix(group, p) -> bool:
        flag = group.get("adamh")
        return (p.ndim == 2) if flag is None else bool(flag)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("AdamH does not support sparse gradients")
                state = self.state[p]
                if "step" not in state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                u = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt_().add_(eps))
                if self._is_matrix(group, p):
                    r = state.get("init_norm")
                    if r is None:  # parameter added after construction (add_param_group)
                        r = state["init_norm"] = float(torch.linalg.vector_norm(p.float()))
                    if group["tangent"]:
                        w_hat = p / torch.linalg.vector_norm(p)
                        u = u - (u * w_hat).sum() * w_hat
                    u_norm = torch.linalg.vector_norm(u)
                    if u_norm == 0:
                        continue
                    p.sub_(u, alpha=lr * r / float(u_norm))
                    p.mul_(r / float(torch.linalg.vector_norm(p)))
                else:
                    if wd:
                        p.mul_(1 - lr * wd)
                    p.sub_(u, alpha=lr)
        return loss


def adamh_param_groups(model: nn.Module, lr: float, other_lr: float | None = None,
                       weight_decay: float = 0.0) -> list[dict]:
    """Two groups: nn.Linear weights (AdamH, named "matrices") and everything else (AdamW, "other").

    A weight shared with an nn.Embedding (tied output head) counts as an embedding.
    """
    embed_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    matrices, other, seen = [], [], set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            if isinstance(module, nn.Linear) and name == "weight" and id(p) not in embed_ids:
                matrices.append(p)
            else:
                other.append(p)
    groups = []
    if matrices:
        groups.append(dict(params=matrices, lr=lr, adamh=True, name="matrices"))
    if other:
        groups.append(dict(params=other, lr=lr if other_lr is None else other_lr, adamh=False,
                           weight_decay=weight_decay, name="other"))
    return groups


def expected_relative_step(lr: float) -> float:
    """||dW|| / ||W|| of one tangent AdamH step: the chord of the angle atan(lr)."""
    return 2 * math.sin(math.atan(lr) / 2)


def relative_step(before: Iterable[torch.Tensor], after: Iterable[torch.Tensor]) -> list[float]:
    """||after - before|| / ||before|| per tensor (a check helper)."""
    return [float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)) for b, a in zip(before, after)]
