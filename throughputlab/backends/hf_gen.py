"""Generation backend `hf`: a transformers model decoded by a plain torch loop.

A static batch of ``c`` sequences: synthetic prompts, a preallocated (static) KV cache where
the model supports it, greedy decoding of exactly ``output_len`` tokens (no EOS check), and
every decode step timed between device synchronisations.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from throughputlab.backends.torch_common import (InProcessTorchBackend, PeakMemory, build_model, release, sync,
                                                 synthetic_ids)
from throughputlab.models import ResolvedModel
from throughputlab.profile import EngineInfo, GenSample

log = logging.getLogger(__name__)


class HFGenerationBackend(InProcessTorchBackend):
    name = "hf"

    def __init__(self, resolved: ResolvedModel, *, dtype: str, device: str, seed: int = 0,
                 max_concurrency: int = 1, max_len: int = 0, engine_args: Optional[dict] = None):
        self.resolved = resolved
        self.dtype = dtype
        self.device = device
        self.seed = seed
        self.max_len = max_len
        self.model = None
        self.cache_kind: Optional[str] = None
        self.last_output_ids: Optional[torch.Tensor] = None  # tokens of the last run, for checking the loop
        self._peak = PeakMemory(device)
        self._gen = torch.Generator().manual_seed(seed)
        if engine_args:
            from throughputlab.errors import UserError

            raise UserError("--engine-arg applies to --backend vllm only")

    def start(self) -> None:
        self.model = build_model(self.resolved, self.dtype, self.device, self.seed)
        self.model.eval()

    def engine_info(self) -> Optional[EngineInfo]:
        import transformers

        return EngineInfo(name="transformers", version=transformers.__version__,
                          engine_args={"kv_cache": self.cache_kind or "static"})

    def _new_cache(self, batch: int, max_len: int):
        from transformers import DynamicCache, StaticCache

        cfg = self.model.config
        try:
            cache = StaticCache(config=cfg, max_cache_len=max_len)
            spec = self.resolved.spec
            cache.early_initialization(batch_size=batch, num_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                                       dtype=next(self.model.parameters()).dtype, device=torch.device(self.device))
            self.cache_kind = "static"
            return cache
        except Exception as e:  # architectures without static-cache support decode with a growing cache
            log.info("static KV cache unavailable (%s); using a dynamic cache", e)
            self.cache_kind = "dynamic"
            return DynamicCache()

    @torch.inference_mode()
    def run(self, concurrency: int, prompt_len: int, output_len: int) -> GenSample:
        model = self.model
        vocab = self.resolved.spec.vocab_size
        ids = synthetic_ids(concurrency, prompt_len, vocab, self.device, self._gen)
        cache = self._new_cache(concurrency, prompt_len + output_len)
        steps: list[float] = []

        sync(self.device)
        t_start = time.perf_counter()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True,
                    cache_position=torch.arange(prompt_len, device=self.device), logits_to_keep=1)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        sync(self.device)
        t_prefill = time.perf_counter() - t_start
        produced = [nxt]
        pos = torch.tensor([prompt_len], device=self.device)
        for _ in range(output_len - 1):  # the prefill already produced the first token
            t = time.perf_counter()
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True, cache_position=pos, logits_to_keep=1)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            pos += 1
            produced.append(nxt)
            sync(self.device)  # .argmax result is needed next step anyway; sync makes the step time exact
            steps.append(time.perf_counter() - t)
        total = time.perf_counter() - t_start
        self.last_output_ids = torch.cat(produced, dim=1)
        del cache, out
        return GenSample(total_s=total, output_tokens=concurrency * output_len, prefill_s=t_prefill,
                         decode_s=sum(steps), decode_step_s=steps)

    def close(self) -> None:
        self.model = None
        release(self.device)
