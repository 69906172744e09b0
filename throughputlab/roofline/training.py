"""How RL frameworks batch a training phase, and what each pass costs besides its FLOPs: padded or packed
sequences, token-budget micro-batches, the host time of an eager pass, Ulysses sequence parallelism's
all-to-alls and the RL loss's pass over the vocabulary's logits.

Each rule is one function with its source (docs/model.md, "Training as frameworks batch it");
``decide`` calls them and derives nothing itself. Times in seconds.
"""

from __future__ import annotations

from typing import Optional

from throughputlab.roofline.core import Costs, recompute_passes
from throughputlab.roofline.engine import ACTIVATION_BYTES, kv_activation_bytes_per_layer

# An eager PyTorch forward pass exposes ~0.34 ms per transformer layer of kernel launches and Python
# when the device work per kernel is small: vllm-omni issue #7960 (Qwen2.5-Omni-7B thinker on A800, 28
# layers, ~22.5 ms a decode step eager against 13 ms with CUDA graphs, (22.5 - 13)/28). Decode takes
# the max of host and device (roofline.engine.eager_step_s, 0.80 ms of host time per layer from the same
# rows); a training pass takes the additive form: the host waits for the device every layer (see
# pass_launch_s). A Hugging Face layer's plain forward costs about as much host time (0.22-0.23 ms a layer
# on a 2-core EPYC, benchmarks/train_host_overhead.py).
TRAIN_LAYER_LAUNCH_S = 0.34e-3
# A training framework's passes cost more host time than that plain forward: FSDP's hooks run around every
# layer, the training forward records the autograd graph, the backward runs about two kernels per forward
# kernel plus the hooks' reduce-scatters, and checkpointing reruns the forward under autograd. Measured with
# Hugging Face's Qwen2 layers under FSDP2 at tiny widths, as multiples of the plain forward
# (benchmarks/train_host_overhead.py, three runs of five rounds on a 2-core EPYC:
# reports/cpu-amd-epyc-2026-12-05/train_host_overhead.txt): a forward under FSDP 1.75-1.82x, a training
# micro-step (forward, loss, backward) 6.72-6.91x, full checkpointing 3.49-4.28x more.
FORWARD_HOST_RATIO = 1.8
TRAIN_STEP_HOST_RATIO = 6.8
RECOMPUTE_HOST_RATIO = 3.9
# Megatron-core's layers (Transformer Engine's fused modules, gradient buckets instead of per-layer FSDP hooks)
# are not measured: their passes count kernels instead, a backward about two kernels per forward kernel (each
# weight GEMM has a data-gradient and a weight-gradient GEMM, each elementwise op its own backward: the same 2x
# that makes training 3x the forward's FLOPs, Kaplan et al. 2020), the recompute one forward again.
BACKWARD_LAUNCH_RATIO = 2.0


def pass_launch_s(num_layers: Optional[int], backward: bool = False, recompute=False,
                  layer_s: float = TRAIN_LAYER_LAUNCH_S, fsdp: bool = True) -> float:
    """The host cost of one micro-batch's pass through ``num_layers`` layers in eager PyTorch under
    FSDP: ``layer_s`` per layer times FORWARD_HOST_RATIO for a forward, TRAIN_STEP_HOST_RATIO for a
    training micro-step (forward and backward), plus RECOMPUTE_HOST_RATIO where checkpointing recomputes
    every block (``recompute``: none|selective|full; selective recomputes the attention core alone, a few
    kernels, not counted). ``fsdp=False`` (Megatron-core): 1 for a forward, 1 + BACKWARD_LAUNCH_RATIO for a
    micro-step, 1 more for the recompute.

    It adds to the device time instead of hiding under it: every layer the host waits for the device
    (FSDP's all-gather of the next layer is rate-limited on the previous one's events; flash-attention's
    variable-length path reads the batch's longest sequence back to the host, ``.item()``), so the host
    cannot run ahead. It matters where a layer's device work is short: small models, small micro-batches.
    0 without a layer count."""
    if not num_layers:
        return 0.0
    forward, step, again = ((FORWARD_HOST_RATIO, TRAIN_STEP_HOST_RATIO, RECOMPUTE_HOST_RATIO) if fsdp
                            else (1.0, 1.0 + BACKWARD_LAUNCH_RATIO, 1.0))
    passes = forward
    if backward:
        dense, _ = recompute_passes(recompute)
        passes = step + again * dense
    return float(num_layers * layer_s * passes)


def padded_length(prompt_cap: int, response_cap: int) -> int:
    """The tokens of every sequence of a pass that does not remove padding: veRL left-pads each prompt to
    data.max_prompt_length and right-pads each response to rollout.response_length (its rollout pads the
    batch's responses to the cap; use_remove_padding: False, ppo_trainer.yaml's default), so a pass
    computes prompt cap + response cap tokens per sequence, whatever the real lengths."""
    return int(prompt_cap) + int(response_cap)


def budget_micro_batch(token_budget: int, seq_len: float) -> int:
    """Sequences per micro-batch when micro-batches are filled up to a token budget per GPU (veRL
    use_dynamic_bsz with ppo_max_token_len_per_gpu, NeMo-RL sequence packing with train_mb_tokens,
    OpenRLHF --use_dynamic_batch): as many sequences of mean length ``seq_len`` as the budget holds,
    at least one (veRL's rearrange_micro_batches asks for ceil(tokens / budget) micro-batches)."""
    if token_budget < 1:
        raise ValueError(f"a token budget must be positive, got {token_budget}")
    return max(1, int(token_budget // max(seq_len, 1.0)))


def ulysses_comm_s(costs: Costs, tokens_per_gpu: float, sp: int, bytes_per_s: float, alpha_s: float = 0.0,
                   passes: float = 1.0) -> float:
    """DeepSpeed-Ulysses sequence parallelism over ``sp`` GPUs (Jacobs et al. 2023, section 3): before attention
    each GPU trades its share of the sequence's queries, keys and values for the whole sequence of 1/sp of the
    heads, after it the output back: all-to-alls of ``tokens_per_gpu`` x (2 x hidden + the K and V widths)
    16-bit values per layer, (sp - 1)/sp of them leaving the GPU, four per layer, each with its latency.
    ``passes``: 1 for a forward, 2 for forward and backward (the gradients cross back), 3 with full
    checkpointing (the forward's again). 0 for sp 1 or a model without its layer widths."""
    if sp <= 1 or not costs.num_layers or not costs.hidden_size:
        return 0.0
    per_layer = tokens_per_gpu * (2 * costs.hidden_size * ACTIVATION_BYTES + kv_activation_bytes_per_layer(costs)) \
        * (sp - 1) / sp
    return float(passes * costs.num_layers * (per_layer / bytes_per_s + 4 * alpha_s))


# An RL loss reads and writes the policy's logits more times than the cross-entropy of the FSDP runs the training
# shares come from: the log-probabilities of the sampled tokens (after the temperature's division) and the entropy
# of every position (log-softmax or softmax, logsumexp, a product and a sum), forward and backward. Counted with a
# dispatch mode over TRL 1.16's selective_log_softmax and entropy_from_logits on 16-bit logits (views left out):
# 20 bytes a logit forward, 46 backward, 66 in all, against 16 for a plain 16-bit cross-entropy (6 and 10); a
# log-prob pass without the entropy 4. The extra a training micro-step pays: 66 - 16 = 50 bytes a logit; a log-prob
# forward pass, with the entropy most frameworks log: 20 - 6 = 14. At the device's memory bandwidth, per token and
# vocabulary entry: Qwen2.5-0.5B's 151,936 entries add about 30% to an H100 micro-step, a 7B's about 2%.
RL_LOGITS_TRAIN_BYTES = 50
RL_LOGITS_FORWARD_BYTES = 14


def rl_logits_s(tokens, vocab: Optional[int], bytes_per_s: Optional[float], backward: bool = False,
                shards: int = 1) -> float:
    """The RL loss's extra pass over the logits of ``tokens`` tokens (RL_LOGITS_TRAIN_BYTES or _FORWARD_BYTES a
    logit, at the device's memory bandwidth), the vocabulary split ``shards`` ways (Megatron's vocabulary-parallel
    logits over TP; Ulysses' sequences over its group); 0 without a vocabulary or a bandwidth (a value head)."""
    if not vocab or not bytes_per_s:
        return 0.0
    per = RL_LOGITS_TRAIN_BYTES if backward else RL_LOGITS_FORWARD_BYTES
    return float(tokens * vocab * per / bytes_per_s / max(shards, 1))
