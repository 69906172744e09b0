"""Training with Megatron-core's layouts (TP, PP, EP) as RL frameworks run it, and tensor parallelism
that crosses nodes: the terms the FSDP model (``devices``) does not have. Times in seconds.

Megatron keeps each rank's weight shard resident, so there is no per-micro-batch all-gather; what it
pays instead:

- **TP**: the all-reduces of each layer's activations (Shoeybi et al. 2019, section 3: two in the
  forward, attention and MLP outputs, two in the backward), in 16-bit; with sequence parallelism they
  become a reduce-scatter and an all-gather of the same bytes (Korthikanti et al. 2022). A forward
  recomputed by checkpointing pays its two again.
- **PP**: the 1F1B schedule's bubble, (p - 1) / m of the ideal time for m micro-batches per
  mini-batch (Narayanan et al. 2021, section 2.2).
- **DP**: the distributed optimizer reduce-scatters the gradients and all-gathers the updated
  parameters once per optimizer step over the data-parallel ranks (Megatron-core's
  DistributedDataParallelConfig: grad_reduce_in_fp32 false by default, so 16-bit both ways).

- **EP**: two all-to-alls per MoE layer (dispatch, combine) of each token's top-k hidden states.

Not priced here: the memory of the layout (the FSDP memory line is kept); callers say so.

Also here: vLLM's sleep and wake-up around each update of colocated engines (:func:`sleep_wake_s`), and
scoring the responses on the host (:func:`reward_s`).
"""

from __future__ import annotations

import math

from throughputlab.roofline.core import ADAM_BYTES_PER_PARAM, Costs, all_weight_bytes, recompute_passes, transfer_s
from throughputlab.roofline.devices import allgather_s, reduce_scatter_s, tp_comm_s
from throughputlab.roofline.engine import ACTIVATION_BYTES, kv_activation_bytes_per_layer

MEGATRON_GRAD_BYTES = 2  # grad_reduce_in_fp32: False (Megatron-core DistributedDataParallelConfig default)
# A small all-reduce between nodes: 19-20 us for 8 to 64 bytes over InfiniBand HDR between two 8-GPU A100 nodes
# (NVIDIA/nccl-tests issue #150, all_reduce_perf, one GPU per node); NCCL's own tuner puts 4-8 KB at 26 us on an
# H100 cluster (NVIDIA/nccl issue #1453, NCCL_DEBUG's "Algo 0 proto 0 time 25.87"): 20 us taken.
INTER_NODE_ALPHA_S = 20e-6


def megatron_tp_comm_s(costs: Costs, tokens, tp: int, busbw: float, alpha_s: float = 0.0, backward: bool = False,
                       recompute=False) -> float:
    """TP all-reduces of one micro-batch of ``tokens`` tokens on a TP group of ``tp`` ranks: two per layer in
    a forward (:func:`tp_comm_s`), two more in the backward, two more per recomputed forward."""
    if tp <= 1:
        return 0.0
    passes = 1.0
    if backward:
        passes += 1.0 + recompute_passes(recompute)[0]
    return float(passes * tp_comm_s(costs, tokens, tp, busbw, alpha_s))


def megatron_ep_comm_s(costs: Costs, tokens, ep: int, busbw: float, alpha_s: float = 0.0, backward: bool = False,
                       recompute=False) -> float:
    """EP's token dispatch for one micro-batch of ``tokens`` tokens on a rank: per MoE layer an all-to-all that
    sends each token's hidden state to its top-k experts' ranks and one that brings the results back
    (Megatron-core's alltoall token dispatcher), 16-bit, the 1/ep of them routed to the rank itself staying
    put (nccl-tests' all-to-all bus factor (n-1)/n); the backward runs both again, a recomputed forward too."""
    if ep <= 1 or not costs.moe_layers or not costs.moe_top_k or not costs.hidden_size:
        return 0.0
    passes = 1.0
    if backward:
        passes += 1.0 + recompute_passes(recompute)[0]
    m = float(tokens) * costs.moe_top_k * costs.hidden_size * ACTIVATION_BYTES
    return float(passes * 2 * costs.moe_layers * allgather_s(m, ep, busbw, alpha_s))


def pipeline_bubble(pp: int, micro_batches: int) -> float:
    """The 1F1B bubble as a share of the ideal time: (p - 1) / m, m the micro-batches of one mini-batch."""
    if pp <= 1 or micro_batches < 1:
        return 0.0
    return (pp - 1) / micro_batches


def value_model_costs(costs: Costs) -> Costs:
    """A PPO critic's costs from its language model's: a value model replaces the output projection over the
    vocabulary (2 x hidden x vocabulary FLOPs a token, 7% of Qwen2-7B's, a quarter of Qwen2.5-0.5B's) with a
    value head of one output (2 x hidden); its weights are left as they are (the embedding stays; an untied
    output projection's share of the weight traffic is a few percent)."""
    if not costs.hidden_size or not costs.vocab_size:
        return costs
    head = 2.0 * costs.hidden_size * (costs.vocab_size - 1)
    return costs.model_copy(update={"flops_per_token": max(costs.flops_per_token - head, 0.0)})


def context_parallel_comm_s(costs: Costs, tokens, cp: int, tp: int, busbw: float, alpha_s: float = 0.0,
                            backward: bool = False, recompute=False) -> float:
    """Megatron's context parallelism over ``cp`` GPUs: each holds 1/cp of a sequence's tokens and passes its keys
    and values round the ring so every rank attends over the whole sequence ((cp - 1) steps of its 1/cp share:
    each GPU sends (cp - 1)/cp of the ``tokens``' K and V, its TP shard of the heads, per layer), once for a
    forward; the backward sends them again and returns their gradients (2 more), a full recompute once more.
    Megatron overlaps these exchanges with attention; counted here without overlap, as the layout's other
    collectives. 0 for cp 1."""
    if cp <= 1 or not costs.num_layers:
        return 0.0
    dense, _ = recompute_passes(recompute)
    passes = 1 + (2 + dense if backward else 0)
    per_layer = tokens * kv_activation_bytes_per_layer(costs) / max(tp, 1) * (cp - 1) / cp
    return float(passes * costs.num_layers * (per_layer / busbw + (cp - 1) * alpha_s))


def megatron_microbatch_s(one_gpu_s: float, tp: int, pp: int, launch_s: float, collectives_s: float) -> float:
    """One micro-batch on a Megatron replica of ``tp x pp`` GPUs: the compute one GPU would take, split over
    them, plus one stage's share (``1/pp`` of the layers) of the model's per-layer launches and collectives."""
    return one_gpu_s / (tp * pp) + (launch_s + collectives_s) / pp


def megatron_minibatch_extra_s(passes_s: float, pp: int, micro_batches: int, dp_sync_s: float,
                               hidden_share: float) -> float:
    """What a Megatron mini-batch adds to its micro-batches' ``passes_s``: the 1F1B bubble, and the distributed
    optimizer's traffic (``megatron_dp_sync_s``) less the share hidden under compute."""
    return pipeline_bubble(pp, micro_batches) * passes_s + (1.0 - hidden_share) * dp_sync_s


def megatron_dp_sync_s(costs: Costs, model_parallel: int, dp: int, busbw: float, alpha_s: float = 0.0) -> float:
    """The distributed optimizer's traffic per optimizer step and rank: its gradient shard reduce-scattered
    and its parameter shard all-gathered over ``dp`` ranks, each rank holding 1/``model_parallel`` of the
    weights (TP x PP)."""
    if dp <= 1:
        return 0.0
    params = all_weight_bytes(costs) / costs.bytes_per_param / max(model_parallel, 1)
    return float(reduce_scatter_s(params * MEGATRON_GRAD_BYTES, dp, busbw, alpha_s)
                 + allgather_s(params * costs.bytes_per_param, dp, busbw, alpha_s))


def megatron_state_bytes_per_rank(costs: Costs, tp: int, pp: int, ep: int, world: int) -> float:
    """A Megatron rank's training state: its shard of the 16-bit weights and of the gradients
    (``MEGATRON_GRAD_BYTES``), and its share of the distributed optimizer's fp32 master weights and two Adam
    moments (12 bytes a parameter, sharded over the data-parallel ranks). The dense weights split ``tp x pp``
    ways, the experts ``ep x pp`` ways (expert TP 1, as NeMo-RL's recipes set it), each over its own
    data-parallel group (``world / (tp x pp)``, ``world / (ep x pp)``)."""
    bpp = costs.bytes_per_param
    experts = costs.moe_layers * (costs.moe_num_experts or 0) * costs.moe_expert_bytes / bpp
    dense = all_weight_bytes(costs) / bpp - experts
    ep = max(ep, 1)
    d_rank, e_rank = dense / (tp * pp), experts / (ep * pp)
    optimizer = ADAM_BYTES_PER_PARAM - ACTIVATION_BYTES - MEGATRON_GRAD_BYTES
    return float((ACTIVATION_BYTES + MEGATRON_GRAD_BYTES) * (d_rank + e_rank)
                 + optimizer * (d_rank / max(world // (tp * pp), 1) + e_rank / max(world // (ep * pp), 1)))


def megatron_memory_line(costs: Costs, per_sequence: float, tp: int, pp: int, ep: int, world: int) -> tuple[float, float]:
    """A Megatron rank's memory line (M0, m): its training state (:func:`megatron_state_bytes_per_rank`) and a
    sequence's activations ``per_sequence`` split over TP (sequence parallel; 1F1B's first stage holds ``pp``
    micro-batches of its ``L / pp`` layers, one micro-batch's worth of the whole model)."""
    return megatron_state_bytes_per_rank(costs, tp, pp, ep, world), per_sequence / tp


def cross_node_tp_link(intra_bytes_per_s: float, intra_alpha_s: float, tp: int, gpus_per_node: int,
                       inter_bytes_per_s: float, inter_alpha_s: float) -> tuple[float, float, bool]:
    """The bus bandwidth and latency of a TP all-reduce over ``tp`` ranks: the node's link when the group
    fits in a node, else a ring that crosses the network, no faster than the inter-node link and with its
    latency (the slower hop sets a ring's rate). Returns (busbw, alpha, crosses nodes)."""
    if tp <= gpus_per_node:
        return intra_bytes_per_s, intra_alpha_s, False
    return min(intra_bytes_per_s, inter_bytes_per_s), max(intra_alpha_s, inter_alpha_s), True


# ---------------------------------------------------------------- vLLM sleep and wake (colocated engines)
# Colocated engines sleep before training and wake for the next rollout; the KV cache is freed and re-mapped
# either way. Level 1 (NeMo-RL: vllm_worker.py `self.llm.sleep(level=1)`; veRL's sharding managers before
# Aug 2025, and still with layered_summon or EP on vLLM < 0.11) copies each GPU's weights to pinned host
# memory and back over the host link; level 2 (veRL with vLLM >= 0.8.5 since volcengine/verl#3082:
# VLLM_SLEEP_LEVEL, ServerAdapter.release) discards them, and the weight sync, priced on its own, refills them.
# Constants from the vLLM blog "Zero-Reload Model Switching with vLLM Sleep Mode" (2025-10-26,
# blog.vllm.ai/2025/10/26/sleep-mode.html; vLLM 0.11.0, level 1, per-event times in its plotly data): on an
# A100, sleep / wake of Qwen3-0.6B (1.2 GB) 0.09 / 0.26 s, Phi-3-vision (8.3 GB) 0.41 / 0.82 s, Qwen3-Coder-30B
# (61 GB) 2.78 / 2.87 s, Qwen3-235B-A22B FP8 at TP 4 (59 GB a GPU) 5.89 / 5.41 s. Least squares over the four,
# both directions at one rate: 21.6 GB/s a direction (0.675 of PCIe Gen4 x16's 32 GB/s) and 0.28 s fixed
# (0.12 sleep, 0.16 wake). The TP-4 row moves its 59 GB at half the one-GPU rate: read as two GPUs behind one
# PCIe switch uplink, as on HGX baseboards, when they copy at once. Not from the blog: Gen5 hosts (Hopper,
# Blackwell HGX; records.peaks.host_link) at 64 GB/s, and a Grace host (GB200) at its NVLink-C2C rate, both at
# the same efficiency (nvbandwidth's one-GPU copies: 25-26 GB/s on A100, 51-52 on H100 and H200, both about
# 0.8 of the link, so the blog's 0.675 carries over as 43 GB/s on Gen5).
HOST_LINK_BYTES_PER_S = 32e9  # PCIe Gen4 x16, each way: devices without a host-link row
C2C_BYTES_PER_S = 450e9  # GB200: NVLink-C2C, 900 GB/s both directions between a Grace CPU and its two GPUs
HOST_COPY_EFFICIENCY = 0.675
GPUS_PER_HOST_LINK = 2
SLEEP_FIXED_S = 0.12
WAKE_FIXED_S = 0.16


def _host_rate(gpus_copying: int, host_bytes_per_s: float) -> float:
    return host_bytes_per_s * HOST_COPY_EFFICIENCY / max(1, min(gpus_copying, GPUS_PER_HOST_LINK))


def _check_level(level: int) -> None:
    if level not in (1, 2):
        raise ValueError(f"vLLM sleep level is 1 or 2, got {level}")


def sleep_s(weight_bytes_per_gpu: float, level: int = 1, gpus_copying: int = 1,
            host_bytes_per_s: float = HOST_LINK_BYTES_PER_S) -> float:
    """vLLM's sleep on one GPU: level 1 offloads its ``weight_bytes_per_gpu`` to host memory (``gpus_copying``
    GPUs of the node at once share the host links), level 2 discards them; the KV cache is freed."""
    _check_level(level)
    move = transfer_s(weight_bytes_per_gpu, _host_rate(gpus_copying, host_bytes_per_s)) if level == 1 else 0.0
    return SLEEP_FIXED_S + move


def wake_s(weight_bytes_per_gpu: float, level: int = 1, gpus_copying: int = 1,
           host_bytes_per_s: float = HOST_LINK_BYTES_PER_S) -> float:
    """vLLM's wake-up on one GPU: memory re-mapped, the weights copied back at level 1 (level 2: the sync
    refills them, not counted here)."""
    _check_level(level)
    move = transfer_s(weight_bytes_per_gpu, _host_rate(gpus_copying, host_bytes_per_s)) if level == 1 else 0.0
    return WAKE_FIXED_S + move


def weight_sync_s(gather_s: float, move_s: float, pipelined: bool = False, latency_s: float = 0.0) -> float:
    """A weight sync's gather from the training shards and its move into the engines: one after the other, or,
    ``pipelined`` (buckets from two buffers, NeMo-RL's packed broadcast), the longer of the two."""
    return latency_s + (max(gather_s, move_s) if pipelined else gather_s + move_s)


def sleep_wake_s(weight_bytes_per_gpu: float, level: int = 1, gpus_copying: int = 1,
                 host_bytes_per_s: float = HOST_LINK_BYTES_PER_S) -> float:
    """One update's sleep and wake-up of a colocated engine's GPU (:func:`sleep_s` + :func:`wake_s`)."""
    return (sleep_s(weight_bytes_per_gpu, level, gpus_copying, host_bytes_per_s)
            + wake_s(weight_bytes_per_gpu, level, gpus_copying, host_bytes_per_s))


# ---------------------------------------------------------------- offload between phases (host link)
# Frameworks that move training state to host memory between phases pay each copy over the host link, at the
# rate measured for vLLM's sleep above (two GPUs to a PCIe link copying at once). Bytes a parameter: the
# parameters at the training dtype, gradients in fp32 (Megatron's main_grad, 4), the optimizer state as fp32
# master weights and Adam's two moments (12).
OFFLOAD_GRAD_BYTES = 4
OFFLOAD_OPTIMIZER_BYTES = 12


def offload_bytes(param_shard: float, optimizer_shard: float, param_bytes: int, param_copies: float,
                  grad_copies: float, optimizer_copies: float) -> float:
    """Bytes one GPU moves over the host link in a step: ``param_copies`` of its parameter shard (parameters a
    GPU holds, ``param_shard``), ``grad_copies`` of its fp32 gradients, ``optimizer_copies`` of its optimizer
    shard (``optimizer_shard`` parameters' worth)."""
    return (param_shard * (param_copies * param_bytes + grad_copies * OFFLOAD_GRAD_BYTES)
            + optimizer_shard * optimizer_copies * OFFLOAD_OPTIMIZER_BYTES)


def param_shard(costs: Costs, model_parallel: int = 1, ep: int = 1) -> float:
    """Parameters one GPU holds when a model is split ``model_parallel`` ways (FSDP: every GPU; Megatron: TP x
    PP) and its experts ``ep`` ways further (Megatron's expert parallelism)."""
    total = all_weight_bytes(costs) / costs.bytes_per_param
    experts = costs.moe_layers * (costs.moe_num_experts or 0) * costs.moe_expert_bytes / costs.bytes_per_param
    return (total - experts) / max(model_parallel, 1) + experts / (max(model_parallel, 1) * max(ep, 1))


def host_copy_s(bytes_per_gpu: float, gpus_copying: int = 1, host_bytes_per_s: float = HOST_LINK_BYTES_PER_S) -> float:
    """Copying ``bytes_per_gpu`` between a GPU and host memory while ``gpus_copying`` GPUs of the node copy too."""
    return transfer_s(bytes_per_gpu, _host_rate(gpus_copying, host_bytes_per_s)) if bytes_per_gpu > 0 else 0.0



# Scoring a math response with math-verify (Hugging Face's Math-Verify: answer extraction, then sympy
# equivalence), one process, as NeMo-RL's math environment calls it (env.math.math_verify_impl: hf_math_verify,
# on env.math.num_workers processes, each taking an equal chunk after the engines finish):
# benchmarks/math_verify_cost.py on a 2-core EPYC (reports/cpu-amd-epyc-2026-12-05/math_verify_cost.txt,
# math-verify 0.9.0, synthetic step-by-step responses): mean 0.5-2.5 ms with a boxed answer, 4.0-6.7 ms without
# one (every LaTeX span tried) at 200-3,000 tokens; 5 ms taken. Heavier workloads exist: veRL PR #1206 timed
# its one-process reward manager at over 200 s for 2,048 math responses (about 0.1 s each; model and lengths
# not stated); NeMo-RL's one-step-off 8B run (64.8 s a step, 2,048 responses, scored one at a time through one
# worker as its asynchronous rollout reads before v0.7) bounds its own below about 30 ms.
MATH_VERIFY_S = 0.005


def reward_s(responses: int, per_response_s: float, workers: int = 1) -> float:
    """Scoring ``responses`` on ``workers`` processes, each taking an equal chunk: ceil(n / workers) x the time
    of one response (0 when nothing is priced)."""
    if per_response_s <= 0 or responses <= 0:
        return 0.0
    return math.ceil(responses / max(workers, 1)) * per_response_s


def rl_step_s(rollout_s: float, reward_s: float, learn_s: float, sync_s: float, overlapped: bool) -> float:
    """One RL step from its phases (the rollout without scoring, scoring, log-probs + training + offload, the
    weight sync): in sequence, or, with generation a step ahead of training, the slowest of the three stages
    (generation on its GPUs, scoring on the host, learning on the training GPUs), plus the sync."""
    return (max(rollout_s, reward_s, learn_s) if overlapped else rollout_s + reward_s + learn_s) + sync_s
