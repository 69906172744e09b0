"""Memory: training's memory line and state, activations per sequence, an engine's KV capacity."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from throughputlab.models.spec import ModelSpec
from throughputlab.roofline.core import (
    ADAM_BYTES_PER_PARAM,
    VLLM_GPU_MEMORY_UTILIZATION,
    Costs,
    _out,
    all_weight_bytes,
    checkpointing_mode,
)
from throughputlab.roofline.engine import kv_tokens_from_bytes, vllm_kv_bytes

LOGIT_BYTES = 8  # fp32 logits and their log-softmax (or gradient) per vocabulary entry and token


def block_activation_bytes(seq_len, hidden_size: int, bytes_per_param: int = 2) -> float:
    """One transformer block's activations for a sequence: 34*S*h bytes at 16 bits with flash attention
    (Korthikanti et al. 2022, table 2, without the 5*a*S^2 attention-score term)."""
    return seq_len * hidden_size * 34 * bytes_per_param / 2


def forward_bytes_per_sequence(costs: Costs, seq_len: float) -> Optional[float]:
    """What a forward pass without gradients (a log-prob pass) holds per sequence at its peak: one block's
    activations (34*S*h bytes at 16 bits, as in :func:`activation_bytes_per_sequence`) and the fp32 logits
    with their log-softmax; nothing is kept for a backward. None without the model's shape."""
    if not costs.hidden_size or not costs.vocab_size:
        return None
    return float(block_activation_bytes(seq_len, costs.hidden_size) + seq_len * costs.vocab_size * LOGIT_BYTES)


def memory_line(b, mem0: float, mem_per_sample: float):
    """Peak training memory of a micro-batch of b sequences: M(b) = M0 + b*m."""
    return _out(mem0 + np.asarray(b, dtype=float) * mem_per_sample)


def max_micro_batch(mem0: Optional[float], mem_per_sample: Optional[float], device_bytes: Optional[float],
                    smallest_oom: Optional[int] = None) -> Optional[int]:
    """Largest b with M0 + b*m within device memory, capped below the smallest OOM micro-batch;
    None when the line or the device memory is unknown."""
    if mem0 is None or not mem_per_sample or mem_per_sample <= 0 or not device_bytes:
        return None
    b = max(int(math.floor((device_bytes - mem0) / mem_per_sample)), 0)
    if smallest_oom is not None and smallest_oom <= b:
        b = smallest_oom - 1
    return b


def kv_cache_tokens(costs: Costs, device_bytes: float, utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
                    reserved_bytes: float = 0.0, block_tokens: int = 1) -> int:
    """KV-cache tokens of a vLLM engine whose device holds ``costs`` (one device's share): vLLM's rule
    (:func:`vllm_kv_bytes`) with every weight, and ``reserved_bytes`` for the activation peak, non-torch
    memory and CUDA graphs, in whole blocks."""
    kv = vllm_kv_bytes(device_bytes, utilization, all_weight_bytes(costs), reserved_bytes)
    return kv_tokens_from_bytes(kv, costs.kv_bytes_per_token, block_tokens)


def training_state_bytes(costs: Costs) -> float:
    """Weights, gradients and Adam states of mixed-precision training, 16 bytes per parameter."""
    return ADAM_BYTES_PER_PARAM * all_weight_bytes(costs) / costs.bytes_per_param


def activation_bytes_per_sequence(spec: ModelSpec, seq_len: int, bytes_per_param: int, checkpointing=False) -> float:
    """Activations kept for backward per sequence: 34*S*h per layer at 16 bits with flash attention
    (Korthikanti et al. 2022, table 2, without the 5*a*S^2 attention-score term), plus fp32 logits and
    their gradient. ``checkpointing`` none|selective|full (or on/off): selective recompute of the
    attention core (their section 4.2) keeps exactly that 34*S*h and drops the score term, which flash
    attention never stores, so it equals none here; full, per block: each block's input (S*h values)
    and one block's activations while it is recomputed (their section 4, full recomputation)."""
    block = block_activation_bytes(seq_len, spec.hidden_size, bytes_per_param)
    logits = seq_len * spec.vocab_size * LOGIT_BYTES
    if checkpointing_mode(checkpointing) == "full":
        return spec.num_layers * seq_len * spec.hidden_size * bytes_per_param + block + logits
    return spec.num_layers * block + logits


# ---------------------------------------------------------------- admission: requests an engine runs at once
# Engines that admit a request as soon as its prompt fits and make room later: vLLM allocates a waiting request's
# prompt blocks only and preempts the newest running request (recomputed later) when the running ones outgrow the
# cache; SGLang reserves a decaying share (new_token_ratio) of the remaining output and retracts. TensorRT-LLM's
# default GUARANTEED_NO_EVICT scheduler admits a request only with room for prompt + max_tokens. An optimistic cache
# stays full of requests at every stage of their lives; with the newest preempted first, the survivors are the older
# ones, so the mean request holds prompt + 0.6 x output, not prompt + output / 2: benchmarks/kv_admission.py on vLLM
# 0.32 (CPU engine, a 4,096-token cache in blocks of 32, requests submitted at once; reports/cpu-amd-epyc-2026-12-06)
# ran 12.1, 9.8 and 5.9 requests at once (means over the run's middle half) for 32 + 480, 256 + 256 and 16 + 1,008
# tokens, where reserving the whole request gives 8, 8 and 4, the output's half 14, 10 and 7, and 0.6 of it 12, 9, 6.
OPTIMISTIC_ADMISSION_ENGINES = ("vllm", "sglang")
OPTIMISTIC_OUTPUT_SHARE = 0.6


def sequence_footprint_tokens(prompt_len: int, output_len: int, block_tokens: int = 1) -> int:
    """KV tokens a sequence holds when it finishes, prompt + output, rounded up to whole blocks."""
    return math.ceil((prompt_len + output_len) / block_tokens) * block_tokens


def kv_sequences(kv_tokens: Optional[int], prompt_len: int, output_len: int, block_tokens: int = 1,
                 optimistic: bool = False) -> Optional[int]:
    """Sequences the engine runs from its KV cache (floored, never rounded up): KV tokens / (prompt + output) where
    admission reserves the whole request; ``optimistic`` (OPTIMISTIC_ADMISSION_ENGINES) KV tokens / (prompt +
    OPTIMISTIC_OUTPUT_SHARE x output), the running requests' mean footprint; footprints in whole blocks."""
    if kv_tokens is None:
        return None
    return kv_tokens // sequence_footprint_tokens(prompt_len, optimistic_output_tokens(output_len) if optimistic
                                                  else output_len, block_tokens)


def optimistic_output_tokens(output_len: int) -> int:
    """The output tokens the mean running request holds in an optimistic engine's cache: ceil(0.6 x output)."""
    return math.ceil(OPTIMISTIC_OUTPUT_SHARE * output_len)


def admitted(concurrency: int, kv_seqs: Optional[int], max_num_seqs: Optional[int]) -> int:
    """Sequences an engine runs at once: min(concurrency, KV-cache sequences, max_num_seqs); the rest queue."""
    caps = [x for x in (kv_seqs, max_num_seqs) if x is not None]
    return min([concurrency, *caps])


def admission_bound(concurrency: int, kv_seqs: Optional[int], max_num_seqs: Optional[int]) -> Optional[str]:
    """Which cap holds ``concurrency`` back ("admission: KV cache" or "admission: max_num_seqs"); None: none."""
    if admitted(concurrency, kv_seqs, max_num_seqs) >= concurrency:
        return None
    if kv_seqs is not None and (max_num_seqs is None or kv_seqs <= max_num_seqs):
        return "admission: KV cache"
    return "admission: max_num_seqs"
