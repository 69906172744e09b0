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
"""

from __future__ import annotations

from throughputlab.roofline.core import Costs, all_weight_bytes, recompute_passes
from throughputlab.roofline.devices import allgather_s, reduce_scatter_s, tp_comm_s
from throughputlab.roofline.engine import ACTIVATION_BYTES

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


def megatron_dp_sync_s(costs: Costs, model_parallel: int, dp: int, busbw: float, alpha_s: float = 0.0) -> float:
    """The distributed optimizer's traffic per optimizer step and rank: its gradient shard reduce-scattered
    and its parameter shard all-gathered over ``dp`` ranks, each rank holding 1/``model_parallel`` of the
    weights (TP x PP)."""
    if dp <= 1:
        return 0.0
    params = all_weight_bytes(costs) / costs.bytes_per_param / max(model_parallel, 1)
    return float(reduce_scatter_s(params * MEGATRON_GRAD_BYTES, dp, busbw, alpha_s)
                 + allgather_s(params * costs.bytes_per_param, dp, busbw, alpha_s))


def cross_node_tp_link(intra_bytes_per_s: float, intra_alpha_s: float, tp: int, gpus_per_node: int,
                       inter_bytes_per_s: float, inter_alpha_s: float) -> tuple[float, float, bool]:
    """The bus bandwidth and latency of a TP all-reduce over ``tp`` ranks: the node's link when the group
    fits in a node, else a ring that crosses the network, no faster than the inter-node link and with its
    latency (the slower hop sets a ring's rate). Returns (busbw, alpha, crosses nodes)."""
    if tp <= gpus_per_node:
        return intra_bytes_per_s, intra_alpha_s, False
    return min(intra_bytes_per_s, inter_bytes_per_s), max(intra_alpha_s, inter_alpha_s), True
