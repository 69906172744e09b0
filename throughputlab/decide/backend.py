"""The training backend of a step: FSDP (the throughput model's own training terms) or Megatron-core.

Megatron (``shape.train.backend: megatron``) is an approximation that says it is one: each model
replica is ``tp x pp`` GPUs holding its weight shard resident (no per-micro-batch all-gather), the other
factor of the training GPUs is data-parallel. A micro-batch of ``b`` sequences on a replica costs the
FSDP-free compute of ``b`` sequences divided over its ``tp x pp`` GPUs, and its stage's ``L / pp`` layers'
launches, TP all-reduces of its activations and EP all-to-alls; a mini-batch adds the 1F1B bubble and the
distributed optimizer's gradient and parameter traffic over the data-parallel ranks (roofline/rl.py).
EP adds its two all-to-alls per MoE layer at the node's link (the network's when the EP group spans
nodes). Memory: each rank's shard of the weights and gradients and its share of the distributed optimizer
(``megatron_state_bytes_per_rank``), and a micro-batch's activations split over TP (sequence parallel; 1F1B's
first stage holds ``pp`` micro-batches of its ``L / pp`` layers, one micro-batch's worth of the whole model).
"""

from __future__ import annotations

from typing import Callable, Optional

from pydantic import BaseModel, ConfigDict

from throughputlab import roofline as roof
from throughputlab.decide.cluster import NIC_BUSBW_BYTES_PER_S
from throughputlab.errors import UserError
from throughputlab.records.peaks import balance_vs_reference, lookup, peak_flops
from throughputlab.roofline import own_nic_bytes_per_s, recompute_passes, rl_logits_s, ulysses_comm_s
from throughputlab.roofline import rl as rf
from throughputlab.roofline.memory import forward_bytes_per_sequence
from throughputlab.throughput import ThroughputModel


class MegatronLayout(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tp: int
    pp: int
    ep: int
    dp: int
    per_node: int = 8  # GPUs of a node: an EP group larger than that crosses the network
    cp: int = 1  # context parallelism: each sequence's tokens split over cp GPUs of a replica

    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp

    @property
    def replica(self) -> int:
        """GPUs of one model replica: TP x PP x CP (CP ranks hold the same weights, each a share of the tokens)."""
        return self.tp * self.pp * self.cp

    def describe(self, gpus: int) -> str:
        return (f"training backend: Megatron on {gpus} GPU(s), TP {self.tp} x PP {self.pp}"
                + (f" x CP {self.cp}" if self.cp > 1 else "") + f" (EP {self.ep}), "
                f"{self.dp} data-parallel replica(s): weights resident (no FSDP all-gather per micro-batch), TP "
                "all-reduces per layer at the node's link, EP's all-to-alls per MoE layer, the 1F1B bubble, the "
                "distributed optimizer's gradient and parameter traffic per optimizer step; memory per rank from its "
                "shards and the activations over TP" + (" and CP (its key-value exchange per layer at the node's "
                                                        "link)" if self.cp > 1 else "")
                + "; an approximation: no overlap of the TP, EP and CP collectives with compute")


def layout_for(train, devices: int, per_node: int = 8) -> Optional[MegatronLayout]:
    """The Megatron layout of ``shape.train`` on ``devices`` training GPUs; None for FSDP. The data-parallel
    size is what TP x PP x CP leaves (at least one replica); CP is ``train.sequence_parallel``."""
    if train.backend != "megatron":
        return None
    cp = train.sequence_parallel
    if devices % (train.tp * train.pp * cp):
        raise UserError(f"--train-tp {train.tp} x --train-pp {train.pp}" + (f" x context parallel {cp}" if cp > 1 else "")
                        + f" does not divide the {devices} training GPU(s): Megatron runs GPUs = TP x PP x CP x "
                        "data-parallel replicas; give sizes whose product divides them")
    return MegatronLayout(tp=train.tp, pp=train.pp, ep=train.ep, cp=cp,
                          dp=max(devices // (train.tp * train.pp * cp), 1), per_node=per_node)


def memory_model(model: ThroughputModel, layout: Optional[MegatronLayout], forward: bool = False,
                 sp: int = 1) -> ThroughputModel:
    """The model whose memory line the micro-batch checks use: under Megatron, a rank's
    (rf.megatron_memory_line); FSDP's line otherwise, its sequences split ``sp`` ways under Ulysses (each GPU
    holds 1/sp of a sequence's activations, so the line counts sequences per sequence-parallel group).
    ``forward``: a pass without a backward (log-probs), whose sequences hold one block's activations and their
    logits (memory.forward_bytes_per_sequence), not every layer's. A measured OOM belongs to the pass and the
    layout it was measured on and is dropped with either."""
    t = model.train
    if (layout is None and not forward and sp <= 1) or t is None or not t.mem_per_sample_bytes \
            or t.device_memory_bytes is None:
        return model
    per = forward_bytes_per_sequence(model.costs, t.seq_len) if forward and t.seq_len else None
    per = (t.mem_per_sample_bytes if per is None else min(per, t.mem_per_sample_bytes)) / max(sp, 1)
    update = {"mem_per_sample_bytes": per, "smallest_oom_micro_batch": None, "smallest_oom_by_seq_len": {}}
    if layout is not None:  # a CP rank holds 1/cp of each sequence's activations
        update["mem0_bytes"], update["mem_per_sample_bytes"] = rf.megatron_memory_line(
            model.costs, per / layout.cp, layout.tp, layout.pp, layout.ep, layout.tp * layout.pp * layout.dp * layout.cp)
    return model.model_copy(update={"train": t.model_copy(update=update)})


def fsdp_note(devices: int, sp: int = 1) -> str:
    return (f"training backend: FSDP over {devices} GPU(s): parameters all-gathered in every micro-batch's forward "
            "and backward, gradients reduce-scattered" + (
                f"; Ulysses sequence parallelism over groups of {sp} GPUs ({devices // sp} data-parallel groups): each "
                "GPU computes 1/{0} of a group's micro-batch and holds 1/{0} of its activations, four all-to-alls "
                "per layer around attention".format(sp) if sp > 1 else ""))


def megatron_pass(model: ThroughputModel, layout: MegatronLayout, backward: bool,
                  launch_s: float) -> Callable[[float, float], float]:
    """One micro-batch of ``b`` sequences of ``s`` tokens on one model replica (see the module's note);
    ``launch_s``: the whole model's per-layer launches of this pass, of which a stage runs 1/pp."""
    alone = model.model_copy(update={"train_devices": 1})  # the compute without FSDP's collectives
    step = alone.train_step_s if backward else alone.forward_s
    comm = model.comm
    recompute = model.activation_checkpointing

    ep_link = None
    if comm is not None and layout.ep > 1:
        # an all-to-all across nodes: each GPU's off-node tokens through its own NIC (roofline.own_nic_bytes_per_s)
        inter = comm.tp_busbw_bytes_per_s if layout.ep <= layout.per_node else (
            comm.fsdp_busbw_bytes_per_s if model.source == "fit" else
            own_nic_bytes_per_s(comm.tp_busbw_bytes_per_s, 2, NIC_BUSBW_BYTES_PER_S))
        ep_link = rf.cross_node_tp_link(comm.tp_busbw_bytes_per_s, comm.tp_alpha_s, layout.ep, layout.per_node,
                                        inter, rf.INTER_NODE_ALPHA_S)

    cp = layout.cp

    def one(b: float, s: float) -> float:  # a CP rank computes 1/cp of the micro-batch's tokens
        coll = 0.0
        if comm is not None and layout.tp > 1:
            coll += rf.megatron_tp_comm_s(model.costs, b * s / cp, layout.tp, comm.tp_busbw_bytes_per_s,
                                          comm.tp_alpha_s, backward, recompute)
        if ep_link is not None:  # each TP rank dispatches its share of the micro-batch's tokens
            coll += rf.megatron_ep_comm_s(model.costs, b * s / (layout.tp * cp), layout.ep, ep_link[0], ep_link[1],
                                          backward, recompute)
        if comm is not None and cp > 1:
            coll += rf.context_parallel_comm_s(model.costs, b * s, cp, layout.tp, comm.tp_busbw_bytes_per_s,
                                               comm.tp_alpha_s, backward, recompute)
        return rf.megatron_microbatch_s(float(step(b, s)), layout.tp * cp, layout.pp, launch_s, coll)
    return one


def megatron_minibatch_extra_s(model: ThroughputModel, layout: MegatronLayout, passes_s: float,
                               micro_batches: int, param_scale: float = 1.0) -> float:
    """What a mini-batch adds to its micro-batches' ``passes_s``: the 1F1B bubble and the distributed
    optimizer's traffic over the data-parallel ranks (the exposed share, as FSDP's)."""
    comm = model.comm
    if comm is None:
        return rf.megatron_minibatch_extra_s(passes_s, layout.pp, micro_batches, 0.0, 1.0)
    # CP ranks hold the same weights: the distributed optimizer shards and reduces over data-parallel x CP ranks
    sync = rf.megatron_dp_sync_s(model.costs, layout.model_parallel, layout.dp * layout.cp, comm.fsdp_busbw_bytes_per_s,
                                 comm.fsdp_alpha_s) * param_scale
    return rf.megatron_minibatch_extra_s(passes_s, layout.pp, micro_batches, sync, comm.fsdp_hidden_share)


def ulysses_pass(model: ThroughputModel, sp: int, backward: bool, launch_s: float) -> Callable[[float, float], float]:
    """One micro-batch of ``b`` sequences of ``s`` tokens on a sequence-parallel group of ``sp`` GPUs (veRL's
    Ulysses under FSDP): each GPU computes b/sp sequences' worth (its share of every sequence's tokens, and of
    the heads over the whole sequence), pays its layers' launches and FSDP's collectives as without it, and the
    all-to-alls around attention at the node's link (roofline.ulysses_comm_s)."""
    step = model.train_step_s if backward else model.forward_s
    comm = model.comm
    dense, _ = recompute_passes(model.activation_checkpointing)
    passes = 2 + dense if backward else 1

    def one(b: float, s: float) -> float:
        t = float(step(b / sp, s)) + launch_s
        if comm is not None:
            t += ulysses_comm_s(model.costs, b * s / sp, sp, comm.tp_busbw_bytes_per_s, comm.tp_alpha_s, passes)
        return t
    return one


def rl_logits_pass(model: ThroughputModel, layout: Optional[MegatronLayout], sp: int,
                   backward: bool) -> Callable[[float, float], float]:
    """The RL loss's extra pass over the policy's logits for a micro-batch of ``b`` sequences of ``s`` tokens on
    one GPU (roofline.rl_logits_s at the device's memory bandwidth): Megatron splits the vocabulary over TP,
    Ulysses the sequences over its group."""
    d = model.decode
    bw = (d.bw_mem_bytes_per_s or d.bw_bytes_per_s) if d is not None else None
    shards = layout.tp * layout.cp if layout is not None else sp
    return lambda b, s: rl_logits_s(b * s, model.costs.vocab_size, bw, backward, shards)


def backend_train_model(model: ThroughputModel, backend: str, device: Optional[str] = None
                        ) -> tuple[ThroughputModel, str]:
    """Megatron's share of the peak instead of FSDP's on a predicted profile (fitted, calibrated: kept; MoE: x share)."""
    t = model.require("train")
    if backend != "megatron" or model.source == "fit":
        return model, f"training at the profile's {'measured' if model.source == 'fit' else 'FSDP'} FLOP/s"
    dtype = {2: "bfloat16", 1: "fp8"}.get(model.costs.bytes_per_param, "float32")
    ds = lookup(device) if device else None
    peak, dense, moe = (peak_flops(ds, dtype), roof.train_mfu(ds.device, dtype)[0], roof.moe_train_share(
        model.costs, balance_vs_reference(ds, dtype))[0]) if ds is not None else (None, 0.0, 1.0)
    match = [m for m in (moe, 1.0) if peak and abs(dense * m * peak - t.phi_flops_per_s) <= 1e-6 * t.phi_flops_per_s]
    if not match:
        return model, ("training at the profile's stated FLOP/s (" + (f"{device or 'the profile names no device'}: no "
                       "datasheet row" if ds is None else f"not the {ds.device} row's FSDP share") + ": kept)")
    phi, share, source = roof.backend_train_rate(t.phi_flops_per_s * moe / match[0], ds.device, dtype, backend)
    note = (f"Megatron training at {phi / peak:.0%} of the {ds.device} {dtype} peak, {phi / 1e12:.0f} TFLOP/s ({source}"
            + (f"; x {moe:.2f} for a mixture of experts" if moe < 1 else "") + ")")
    return model.model_copy(update={"train": t.model_copy(update={"phi_flops_per_s": phi})}), note
