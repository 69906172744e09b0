"""Training state moved to host memory and back between the phases of a step (``shape.train.offload_*``):
NeMo-RL's colocated step (the policy's parameters, gradients and optimizer leave the GPUs for generation,
the reference model is swapped in from host memory for its log-probs) and veRL's ``param_offload`` /
``optimizer_offload``. The copies cross the host link at roofline.rl.host_copy_s's rate, every GPU of a node
copying at once."""

from __future__ import annotations

from typing import Optional

from throughputlab.roofline import rl as rf_rl
from throughputlab.throughput import ThroughputModel


def param_shards(model: ThroughputModel, gpus: int, layout=None) -> tuple[float, float]:
    """Parameters one training GPU holds, and its share of the optimizer state (in parameters): FSDP shards
    both over every training GPU; Megatron holds 1/(TP x PP) of the dense weights and 1/(TP x PP x EP) of the
    experts, its distributed optimizer a further 1/(DP x CP) of that."""
    if layout is None:
        shard = rf_rl.param_shard(model.costs, gpus)
        return shard, shard
    shard = rf_rl.param_shard(model.costs, layout.model_parallel, layout.ep)
    return shard, shard / max(layout.dp * layout.cp, 1)  # the optimizer over data-parallel x CP ranks


def offload_s(model: ThroughputModel, train, gpus: int, layout=None, per_node: int = 1,
              host_bytes_per_s: Optional[float] = None) -> float:
    """One step's host copies of ``train`` (a TrainShape) on ``gpus`` training GPUs (0 when none is set), over
    ``host_bytes_per_s`` (the placement's host link, Placement.host_rate; without one, PCIe Gen4)."""
    if not (train.offload_param_copies or train.offload_grad_copies or train.offload_optimizer_copies):
        return 0.0
    shard, opt = param_shards(model, gpus, layout)
    nbytes = rf_rl.offload_bytes(shard, opt, model.costs.bytes_per_param, train.offload_param_copies,
                                 train.offload_grad_copies, train.offload_optimizer_copies)
    host = host_bytes_per_s or rf_rl.HOST_LINK_BYTES_PER_S
    return rf_rl.host_copy_s(nbytes, min(per_node, gpus), host)
