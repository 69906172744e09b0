"""Bytes an RL loss moves over the vocabulary's logits, per logit, against a plain cross-entropy.

A dispatch mode counts every aten op's inputs and outputs of logits size (views and detaches left out, as they move
nothing) while a loss runs forward and backward on 16-bit logits. The RL loss is TRL's own: selective_log_softmax
(the sampled tokens' log-probabilities, after the temperature's division) and entropy_from_logits (every
position's entropy), imported from an installed TRL (not a dependency: install it in a scratch environment, as
benchmarks/calibration_pair.py does). The difference from the plain cross-entropy is what
roofline.training.RL_LOGITS_TRAIN_BYTES and RL_LOGITS_FORWARD_BYTES take.

    python benchmarks/rl_loss_bytes.py        (with TRL installed)
"""

from __future__ import annotations

import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

TOKENS, VOCAB = 64, 4096
MOVES_NOTHING = ("detach", "view", "unbind", "split", "expand", "alias", "t", "transpose", "slice", "select",
                 "squeeze", "unsqueeze", "as_strided")


class _Bytes(TorchDispatchMode):
    """Sums the bytes of logits-sized tensors each op reads and writes."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "is_view", False) or func.__name__.split(".")[0] in MOVES_NOTHING:
            return out
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        self.bytes += sum(t.numel() * t.element_size() for t in tensors if t.numel() >= TOKENS * VOCAB // 2)
        return out


def per_logit(loss_fn) -> tuple[float, float]:
    """(forward, backward) bytes per logit of ``loss_fn(logits, ids)`` on bfloat16 logits."""
    logits = torch.randn(TOKENS, VOCAB, dtype=torch.bfloat16, requires_grad=True)
    ids = torch.randint(0, VOCAB, (TOKENS,))
    with _Bytes() as b:
        loss = loss_fn(logits, ids)
        fwd = b.bytes
        loss.backward()
    n = TOKENS * VOCAB
    return fwd / n, (b.bytes - fwd) / n


def main() -> int:
    try:
        from trl.trainer.utils import entropy_from_logits, selective_log_softmax
    except ImportError:
        print("error: TRL is not installed: install it in a scratch environment (pip install trl) and run this "
              "script with that environment's python", file=sys.stderr)
        return 2

    def plain(logits, ids):
        return torch.nn.functional.cross_entropy(logits, ids)

    def logps(logits, ids):
        return -selective_log_softmax(logits / 0.9, ids).mean()

    def rl(logits, ids):
        scaled = logits / 0.9
        return -selective_log_softmax(scaled, ids).mean() - 0.001 * entropy_from_logits(scaled).mean()

    rows = {"plain 16-bit cross-entropy": per_logit(plain), "TRL log-probs": per_logit(logps),
            "TRL log-probs and entropy": per_logit(rl)}
    import trl
    print(f"bytes per logit, 16-bit logits (TRL {trl.__version__}, torch {torch.__version__})")
    for name, (f, b) in rows.items():
        print(f"  {name:<30} forward {f:5.1f}  backward {b:5.1f}  in all {f + b:5.1f}")
    pf, pb = rows["plain 16-bit cross-entropy"]
    rf_, rb = rows["TRL log-probs and entropy"]
    print(f"the RL loss's extra: a training micro-step {rf_ + rb - pf - pb:.0f} bytes a logit, a log-prob forward with "
          f"the entropy {rf_ - pf:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
