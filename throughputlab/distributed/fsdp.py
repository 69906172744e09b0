"""FSDP2 as torchtitan and veRL apply it, and the bytes a rank holds, measured.

``fully_shard`` goes on every decoder block, then on the root (embeddings, final norm, LM head
and whatever else is left). Activation checkpointing (non-reentrant) wraps each block before
it is sharded. With bfloat16 the sharded parameters and AdamW states stay in float32 and the
forward and backward run in bfloat16 (``MixedPrecisionPolicy(param_dtype=bfloat16,
reduce_dtype=float32)``); with float32 there is no policy.
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch
from torch import nn


def decoder_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(qualified name, module) of each decoder block, outermost matches only.

    The blocks are the classes transformers keeps whole when it splits a model
    (``_no_split_modules``), as veRL's wrap policy reads them; without that attribute, the
    children of the largest ``nn.ModuleList``.
    """
    names = set(getattr(model, "_no_split_modules", None) or [])
    found: list[tuple[str, nn.Module]] = []
    if names:
        for name, mod in model.named_modules():
            if type(mod).__name__ in names and not any(name.startswith(f"{n}.") for n, _ in found):
                found.append((name, mod))
    if found:
        return found
    lists = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        return []
    name, biggest = max(lists, key=lambda nm: len(nm[1]))
    return [(f"{name}.{i}", m) for i, m in enumerate(biggest)]


def _replace(model: nn.Module, qualified: str, new: nn.Module) -> None:
    parent_name, _, child = qualified.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    parent.add_module(child, new)  # ModuleList children are named "0", "1", ...


def apply_activation_checkpointing(model: nn.Module) -> int:
    """Wrap each decoder block in non-reentrant activation checkpointing; returns how many."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    blocks = decoder_blocks(model)
    for name, block in blocks:
        _replace(model, name, checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
    return len(blocks)


def mixed_precision(dtype: str):
    """The policy for a run in ``dtype``: bf16 compute with fp32 reductions, or None (fp32)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if dtype == "bfloat16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if dtype == "float32":
        return None
    raise ValueError(f"FSDP runs take float32 or bfloat16, got {dtype}")


def apply_fsdp(model: nn.Module, *, dtype: str, activation_checkpointing: bool = False, mesh=None) -> nn.Module:
    """Shard ``model`` (built in float32) in place: each block, then the root. Returns the model."""
    from torch.distributed.fsdp import fully_shard

    if activation_checkpointing:
        apply_activation_checkpointing(model)
    policy = mixed_precision(dtype)
    kwargs = {"mp_policy": policy} if policy is not None else {}
    if mesh is not None:
        kwargs["mesh"] = mesh
    blocks = decoder_blocks(model)
    if not blocks:
        raise ValueError(f"found no decoder blocks in {type(model).__name__} to shard")
    for _, block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def local_bytes(tensors: Iterable[Optional[torch.Tensor]]) -> int:
    """Bytes this rank holds of ``tensors``: the local shard of a DTensor, all of a plain tensor."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def param_bytes(model: nn.Module) -> int:
    return local_bytes(model.parameters())


def grad_bytes(model: nn.Module) -> int:
    return local_bytes(p.grad for p in model.parameters())


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return local_bytes(v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))
