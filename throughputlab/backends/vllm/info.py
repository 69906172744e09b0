"""What a started vLLM engine reports about itself, as the profile's ``EngineInfo``: KV-cache
capacity (tokens, and requests of the sweep's length), scheduler limits, and the engine
arguments and environment the engine ran with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from throughputlab.records.profile import EngineInfo


@dataclass(frozen=True)
class KVCapacity:
    tokens: Optional[int]  # KV-cache size in tokens
    blocks: Optional[int]
    block_size: Optional[int]
    max_concurrency: Optional[float]  # requests of the sweep's length that fit at once
    engine_max_len: int  # the engine's max_model_len


def kv_capacity(vllm_config, max_len: int) -> KVCapacity:
    """The KV cache's size from the engine's config; concurrency for requests of ``max_len`` tokens."""
    cache = vllm_config.cache_config
    tokens = getattr(cache, "kv_cache_size_tokens", None)
    blocks = getattr(cache, "num_gpu_blocks", None)
    block = getattr(cache, "block_size", None)
    if tokens is None and blocks and block:
        tokens = blocks * block
    engine_max_len = vllm_config.model_config.max_model_len
    max_conc = getattr(cache, "kv_cache_max_concurrency", None)
    if max_len and engine_max_len != max_len:
        # The engine reported concurrency for its own max_model_len; ours is the sweep's request length.
        max_conc = (blocks / math.ceil(max_len / block)) if blocks and block else None
    return KVCapacity(tokens=int(tokens) if tokens else None, blocks=blocks, block_size=block,
                      max_concurrency=float(max_conc) if max_conc else None, engine_max_len=engine_max_len)


def read_engine_info(llm, version: str, engine_kwargs: dict[str, Any], *, max_len: int, hide_model: bool,
                     environment: dict[str, str], env_defaults: list[str]) -> EngineInfo:
    """EngineInfo of a running ``vllm.LLM``: its capacity, and ``engine_kwargs`` (``model`` left out
    when ``hide_model``: a temporary folder) with the engine's own settings and ``environment``."""
    cfg = llm.llm_engine.vllm_config
    cache = cfg.cache_config
    kv = kv_capacity(cfg, max_len)
    shown = {k: v for k, v in engine_kwargs.items() if k != "model" or not hide_model}
    shown = {k: (v if isinstance(v, (str, int, float, bool, type(None))) else str(v)) for k, v in shown.items()}
    shown.update(block_size=kv.block_size, num_kv_blocks=kv.blocks, max_model_len=kv.engine_max_len,
                 max_num_batched_tokens=cfg.scheduler_config.max_num_batched_tokens,
                 kv_cache_dtype=cache.cache_dtype, enable_prefix_caching=cache.enable_prefix_caching)
    shown.update(environment)
    if env_defaults:
        shown["env_set_by_throughputlab"] = ", ".join(env_defaults)
    return EngineInfo(name="vllm", version=version, kv_cache_tokens=kv.tokens, max_concurrency=kv.max_concurrency,
                      max_num_seqs=cfg.scheduler_config.max_num_seqs, engine_args=shown)
