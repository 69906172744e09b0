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
