"""What the torch backends share: building a model from a ResolvedModel, synchronisation,
peak-memory accounting on CPU and GPU, and telling an out-of-memory error from a bug."""

from __future__ import annotations

import gc
import logging
import os
import re
from typing import Optional

import torch

from throughputlab.errors import UserError
from throughputlab.models import ResolvedModel

log = logging.getLogger(__name__)


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def build_config(resolved: ResolvedModel):
    from transformers import AutoConfig

    if resolved.source == "preset":
        cfg = dict(resolved.config)
        model_type = cfg.pop("model_type", None)
        if not model_type:
            raise UserError("model config has no model_type: transformers cannot build it")
        try:
            return AutoConfig.for_model(model_type, **cfg)
        except (ValueError, KeyError) as e:
            raise UserError(f"transformers cannot build model_type {model_type!r} ({e}); "
                            "upgrade transformers or pass --trust-remote-code for a custom model") from None
    return AutoConfig.from_pretrained(resolved.path, trust_remote_code=resolved.trust_remote_code)


def build_model(resolved: ResolvedModel, dtype: str, device: str, seed: int = 0, *,
                attn_implementation: Optional[str] = None, config_overrides: Optional[dict] = None):
    """A causal LM on ``device``: random weights from the config, or the folder/hub weights.

    ``config_overrides`` (set on the config, random weights only) build a variant of the
    network, such as the overhead probe; ``attn_implementation`` picks transformers' attention.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = build_config(resolved)
    for k, v in (config_overrides or {}).items():
        setattr(cfg, k, v)
    td = torch_dtype(dtype)
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        if resolved.random_weights or config_overrides:
            with torch.device(device):
                model = AutoModelForCausalLM.from_config(cfg, dtype=td, trust_remote_code=resolved.trust_remote_code,
                                                         **extra)
        else:
            model = AutoModelForCausalLM.from_pretrained(resolved.path, dtype=td,
                                                         trust_remote_code=resolved.trust_remote_code,
                                                         **extra).to(device)
    except ValueError as e:
        raise UserError(f"transformers cannot build {resolved.spec.name}: {str(e).splitlines()[0]}") from None
    return model


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def is_oom(exc: BaseException) -> bool:
    """CUDA OOM, or the CPU allocator refusing an allocation (which it does at once past RAM)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    msg = str(exc)
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        "out of memory" in msg.lower() or "can't allocate memory" in msg or "DefaultCPUAllocator" in msg
        or isinstance(exc, MemoryError))


def release(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


class PeakMemory:
    """Peak memory of this process: CUDA allocator peak, or peak RSS on CPU.

    On Linux the CPU peak (VmHWM) is reset by writing 5 to /proc/self/clear_refs, so each
    point gets its own peak without a polling thread.
    """

    def __init__(self, device: str):
        self.device = device
        self._can_reset_cpu = os.path.exists("/proc/self/clear_refs")

    def reset(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self._can_reset_cpu:
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                self._can_reset_cpu = False

    def peak_bytes(self) -> Optional[int]:
        if self.device.startswith("cuda"):
            return int(torch.cuda.max_memory_allocated(self.device))
        if not self._can_reset_cpu:
            return None
        try:
            with open("/proc/self/status") as f:
                m = re.search(r"VmHWM:\s+(\d+)\s+kB", f.read())
            return int(m.group(1)) * 1024 if m else None
        except OSError:
            return None


def synthetic_ids(batch: int, length: int, vocab: int, device: str, generator: torch.Generator) -> torch.Tensor:
    """Random token ids: throughput does not depend on the text. Avoids id 0..3 (special tokens)."""
    low = 4 if vocab > 8 else 0
    return torch.randint(low, vocab, (batch, length), generator=generator).to(device)


class InProcessTorchBackend:
    """What both torch backends do the same way: memory accounting, OOM test, this process's pid."""

    device: str
    _peak: PeakMemory

    def reset_peak_memory(self) -> None:
        self._peak.reset()

    def peak_memory_bytes(self) -> Optional[int]:
        return self._peak.peak_bytes()

    def is_oom(self, exc: BaseException) -> bool:
        return is_oom(exc)

    def release(self) -> None:
        release(self.device)

    def pids(self) -> list[int]:
        return [os.getpid()]
