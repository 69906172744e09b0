"""The cluster and its placements: which devices generate, which train, and the engines.

``colocated`` (veRL's hybrid engine): every device generates, in ``gpus / tp`` engines, then every device trains
with FSDP, the weights resharded into the engines, which sleep and wake around training. ``split``: ``gen_gpus``
devices generate while the others train (one step off). ``search``: every placement and engine size that fits.

A placement turns the profile's throughput model into a generation model (engines of ``tp`` devices, KV cache at
the run's ``gpu_memory_utilization``, the run's rollout engine) and a training model (FSDP over the training
devices, activation checkpointing when set); every cost still comes from the roofline module.
"""

from __future__ import annotations

import logging
from typing import Literal, Optional

from pydantic import Field, model_validator

from throughputlab import roofline as rf
from throughputlab.calibration import DEFAULT_EFFICIENCIES
from throughputlab.errors import UserError
from throughputlab.records.base import Record, SettingsRecord
from throughputlab.records.peaks import INTER_NODE_BYTES_PER_S
from throughputlab.roofline import rl as rf_rl
from throughputlab.throughput import CommParams, ThroughputModel

log = logging.getLogger(__name__)

# one 400 Gb/s NIC per GPU at the stated collective efficiency: the network's rate per GPU
NIC_BUSBW_BYTES_PER_S = DEFAULT_EFFICIENCIES.comm_bw * INTER_NODE_BYTES_PER_S

COLOCATED_GPU_MEMORY_UTILIZATION = 0.5  # veRL's rollout default: the trainer's state stays on the devices
SPLIT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default on devices that only generate


class ClusterSpec(SettingsRecord):
    """The devices of the run and where each phase runs (flags or the spec's ``cluster``)."""

    gpus: Optional[int] = Field(None, description=(  # default: the profile's layout (1 for a measured profile)
        "Devices in the cluster."))
    nodes: int = Field(1, description="Machines the devices are spread over.")
    placement: Literal["colocated", "split", "search"] = Field("colocated", description=(
        "colocated: every device generates, then every device trains (veRL's hybrid engine); split: --gen-gpus "
        "generate while the rest train, one step off-policy; search: every placement and engine size that fits, "
        "ranked by time-to-target."))
    gen_gpus: Optional[int] = Field(None, description="Split placement: devices that generate.")  # the others train
    engine_tp: Optional[int] = Field(None, description="Devices per generation engine.")  # default: the profile's
    gpu_memory_utilization: Optional[float] = Field(None, description=(  # default 0.5 colocated, 0.9 split
        "The engines' share of device memory (KV cache = share - weights)."))
    # colocated on GPUs: vLLM's sleep and wake-up around each update (roofline.rl.sleep_wake_s)
    sleep_level: Literal[1, 2] = Field(1, description=(
        "Colocated engines' vLLM sleep level between rollouts: 1 copies each GPU's weights to host memory and back "
        "(NeMo-RL; veRL before vLLM 0.8.5), 2 discards them and the weight sync refills them (veRL since "
        "volcengine/verl#3082 with vLLM >= 0.8.5)."))
    sleep_wake_s: Optional[float] = None  # default roofline.rl.sleep_wake_s colocated on GPUs, 0 otherwise

    @model_validator(mode="after")
    def _gen_gpus_split_only(self) -> "ClusterSpec":
        if self.gen_gpus is not None and self.placement == "colocated":
            raise ValueError("gen_gpus (--gen-gpus) goes with --placement split (or search): colocated engines "
                             "generate on every device")
        return self


class Placement(Record):
    kind: Literal["colocated", "split"]
    gpus: int
    gen_gpus: int
    train_gpus: int
    tp: int
    nodes: int = 1
    domain: Optional[int] = None  # GPUs in one NVLink domain (GB200 NVL72: 72); None: the node
    host_bytes_per_s: Optional[float] = None  # the device's host link each way (records.peaks.host_link); None: Gen4

    @property
    def host_rate(self) -> float:
        """The host link sleep, wake and offload copy over: the device's, else NVLink-C2C in a domain beyond the
        node (GB200 NVL72's Grace hosts), else PCIe Gen4."""
        if self.host_bytes_per_s:
            return self.host_bytes_per_s
        return rf_rl.C2C_BYTES_PER_S if self.domain else rf_rl.HOST_LINK_BYTES_PER_S

    @property
    def engines(self) -> int:
        return self.gen_gpus // self.tp

    @property
    def per_node(self) -> int:
        return max(self.gpus // max(self.nodes, 1), 1)

    @property
    def link_group(self) -> int:
        """GPUs joined at the node's link (NVLink): the node, or the NVLink domain where it is larger, so a
        collective within it never crosses the network."""
        return max(self.per_node, self.domain or 0)

    def domains(self, nodes: int) -> int:
        """Link groups (NVLink domains, else nodes) that ``nodes`` whole nodes span, packed in order."""
        return -(-nodes * self.per_node // self.link_group) if self.link_group > self.per_node else nodes

    @property
    def train_domains(self) -> int:
        return self.domains(self.train_nodes)

    @property
    def train_nodes(self) -> int:
        """Nodes the training devices span: all of them colocated; split, the fewest whole nodes that
        hold them (frameworks give each pool its own nodes: veRL's resource pools, NeMo-RL's
        generation.colocated.resources), so FSDP over one node's devices runs on that node's links."""
        if self.kind == "colocated" or self.nodes <= 1:
            return self.nodes
        per_node = max(self.gpus // self.nodes, 1)
        return min(self.nodes, -(-self.train_gpus // per_node))

    @property
    def label(self) -> str:
        return self.labelled()

    def labelled(self, trainer: str = "FSDP") -> str:
        """The placement in words, ``trainer`` naming the training backend (FSDP, or a Megatron layout)."""
        eng = f"{self.engines} engine{'s' if self.engines > 1 else ''} x TP {self.tp}"
        if self.kind == "colocated":
            return f"colocated on {self.gpus} GPU{'s' if self.gpus > 1 else ''}: {eng}, {trainer} over {self.train_gpus}"
        return f"split {self.gen_gpus}+{self.train_gpus}: {eng} generate, {trainer} over {self.train_gpus} train"


def _fits_weights(model: ThroughputModel, tp: int, util: float) -> bool:
    mem = device_memory(model)
    if mem is None or model.source == "fit":
        return True  # a measured engine ran: its weights fit
    return rf.all_weight_bytes(rf.tp_shard(model.costs, tp)) < util * mem


def device_memory(model: ThroughputModel) -> Optional[float]:
    return model.train.device_memory_bytes if model.train is not None else None


def decision_nodes(model: ThroughputModel, spec: ClusterSpec) -> int:
    """--nodes, else the profile's own nodes where the GPUs are the profile's too (no --gpus)."""
    if "nodes" in spec.model_fields_set or spec.gpus is not None:
        return spec.nodes
    return max(spec.nodes, model.nodes)


def placements(model: ThroughputModel, spec: ClusterSpec, domain: Optional[int] = None,
               host_bytes_per_s: Optional[float] = None, node_limit: Optional[tuple[str, int]] = None) -> list[Placement]:
    """The placements to evaluate: the one asked for, or every one that fits (``search``); ``domain``: GPUs
    in one NVLink domain of the device (link_domain); ``host_bytes_per_s``: its host link (host_link_rate);
    ``node_limit``: the device and the most of it a node holds (gpus_per_node_limit)."""
    measured_tp = model.tp if model.source != "fit" else max(model.tp, 1)
    gpus = spec.gpus if spec.gpus is not None else max(model.train_devices, measured_tp)
    nodes = decision_nodes(model, spec)
    for name, v in (("--gpus", gpus), ("--nodes", nodes)):
        if v < 1:
            raise UserError(f"{name} must be a positive integer, got {v}")
    if gpus % nodes:
        raise UserError(f"--nodes {nodes} does not divide --gpus {gpus}: give the same number of GPUs on every node")
    per_node = gpus // nodes
    if node_limit is not None and per_node > node_limit[1]:
        raise UserError(f"{gpus} GPUs on {nodes} node(s) (--gpus and --nodes, or the config's): a {node_limit[0]} node "
                        f"holds at most {node_limit[1]} GPUs; give --nodes {-(-gpus // node_limit[1])} or more")
    util = spec.gpu_memory_utilization
    if util is not None and not 0 < util <= 1:
        raise UserError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
    if spec.engine_tp is not None:
        if spec.engine_tp < 1:
            raise UserError(f"--engine-tp must be a positive integer, got {spec.engine_tp}")
        if spec.engine_tp > per_node and (spec.engine_tp % per_node or spec.engine_tp > gpus):
            why = (f"and than the {gpus} GPU(s) of the run" if spec.engine_tp > gpus else
                   "and not a whole number of nodes: an engine spans whole nodes or stays within one")
            raise UserError(f"--engine-tp {spec.engine_tp} is larger than the {per_node} GPU(s) of a node {why}")
        tps = [spec.engine_tp]
    elif spec.placement == "search" and model.source != "fit":
        tps = [t for t in (1, 2, 4, 8, 16) if t <= per_node and per_node % t == 0]
    else:
        tps = [model.tp]
    if model.source == "fit" and any(t != model.tp for t in tps):
        raise UserError(f"--engine-tp {tps[0]}: the profile measured engines of {model.tp} device(s), whose fitted "
                        "rates are the engine's; use a predicted profile to change the engine size")
    kinds = ["colocated", "split"] if spec.placement == "search" else [spec.placement]
    out: list[Placement] = []
    for kind in kinds:
        u = util or (COLOCATED_GPU_MEMORY_UTILIZATION if kind == "colocated" else SPLIT_GPU_MEMORY_UTILIZATION)
        for tp in tps:
            if gpus % tp:
                if spec.placement != "search":
                    raise UserError(f"--engine-tp {tp} does not divide --gpus {gpus}")
                continue
            if not _fits_weights(model, tp, u):
                continue
            if kind == "colocated":
                out.append(Placement(kind=kind, gpus=gpus, gen_gpus=gpus, train_gpus=gpus, tp=tp, nodes=nodes,
                                     domain=domain, host_bytes_per_s=host_bytes_per_s))
                continue
            gens = [spec.gen_gpus] if spec.gen_gpus is not None else range(tp, gpus, tp)
            for g in gens:
                if g < 1 or g >= gpus:
                    raise UserError(f"--gen-gpus {g}: a split needs at least one generating and one training GPU "
                                    f"out of {gpus} (give --gpus 2 or more and --gen-gpus below it)")
                if g % tp:
                    if spec.placement != "search":
                        raise UserError(f"--gen-gpus {g} is not a multiple of the engine size {tp}")
                    continue
                out.append(Placement(kind=kind, gpus=gpus, gen_gpus=g, train_gpus=gpus - g, tp=tp, nodes=nodes,
                                     domain=domain, host_bytes_per_s=host_bytes_per_s))
    if not out:
        if spec.placement == "split" and gpus < 2:
            raise UserError("--placement split needs at least 2 GPUs (--gpus): one generates, one trains")
        raise UserError(f"the model fits no {spec.placement} placement on {gpus} GPU(s): its weights alone exceed the "
                        "engines' share of device memory; use more GPUs per engine (--engine-tp) or more GPUs")
    return out


def generation_model(model: ThroughputModel, pl: Placement, spec: ClusterSpec, engine=None) -> ThroughputModel:
    """One engine of the placement, its KV cache at the run's gpu_memory_utilization by the engine's own rule
    (a predicted profile's engine, with ``engine``'s overrides: the RL shape's ``engine`` settings)."""
    update: dict = {}
    mem = device_memory(model)
    util = spec.gpu_memory_utilization or (COLOCATED_GPU_MEMORY_UTILIZATION if pl.kind == "colocated"
                                           else SPLIT_GPU_MEMORY_UTILIZATION)
    eager = getattr(engine, "enforce_eager", None)
    if model.source != "fit":
        update["tp"] = pl.tp
        if model.comm is not None and pl.tp > pl.link_group:
            update["comm"] = cross_node_tp_comm(model.comm, pl.tp, pl.link_group)
        if model.engine is not None:
            update.update(_engine_update(model, pl.tp, util, mem, engine))
        elif mem is not None:
            update["kv_cache_tokens"] = rf.kv_cache_tokens(rf.tp_shard(model.costs, pl.tp), mem, util)
    elif {getattr(engine, k, None) for k in ("in_process_logprobs", "distributed_executor_backend", "name")} - {
            None, "off", "vllm"}:
        log.warning("engine.name, engine.in_process_logprobs and engine.distributed_executor_backend are not applied to "
                    "a measured engine: it stands as measured (its engine, its host time per sequence)")
    if model.source == "fit" and eager is not None:
        raise UserError("engine.enforce_eager (--enforce-eager) sets a predicted engine's fixed cost per step; this "
                        "profile's engine was measured as it ran: measure it again with --engine-arg "
                        "enforce_eager=true, or decide on a predicted profile")
    gib = getattr(engine, "kv_cache_gib", None)
    if gib is not None and model.source == "fit":
        update["kv_cache_tokens"] = kv_tokens_from_gib(model, 1, gib)
    if update.get("kv_cache_tokens") is not None and update["kv_cache_tokens"] < 16 and gib is None:
        raise UserError(f"an engine of TP {pl.tp} at gpu_memory_utilization {util:g} has no room for a KV cache once "
                        "its weights are loaded; raise --gpu-memory-utilization, give --kv-cache-gib, or use more GPUs "
                        "per engine (--engine-tp)")
    return model.model_copy(update=update)


def kv_tokens_from_gib(model: ThroughputModel, tp: int, gib: float) -> int:
    """The tokens a measured KV cache of ``gib`` per device holds (--kv-cache-gib), in the engine's blocks."""
    block = model.engine.block_tokens if model.engine else 1
    return rf.kv_cache_tokens_of(gib * rf.GIB, rf.tp_shard(model.costs, tp), block)


def _engine_update(model: ThroughputModel, tp: int, util: float, mem, engine) -> dict:
    """A predicted engine at the run's memory share and settings: its KV cache by the engine's rule
    (predict_engine.size_kv, the rule predict uses) and its caps, eager mode among them."""
    from throughputlab.predict_engine import as_engine, size_kv, t_seq_s

    old = model.engine
    names = {k: k for k in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "kv_cache_gib", "enforce_eager")}
    given = {k: getattr(engine, v, None) for k, v in {**names, "logprobs": "in_process_logprobs",
                                                      "executor": "distributed_executor_backend"}.items()}
    settings = as_engine(old, getattr(engine, "name", None)).model_copy(
        update={"memory_fraction": util, **{k: v for k, v in given.items() if v is not None}})
    settings, tokens = size_kv(settings, model.costs, tp, mem)
    # eager mode: the settings carry it (the step is max(host launches, device time), roofline.eager_step_s). The
    # host time per running sequence, priced at the profile's TP, log-probs and executor, moves with the engines'.
    moved = old.host_factor * (t_seq_s(settings, tp) - t_seq_s(old, model.tp or 1))
    out = {"engine": settings, "kv_cache_tokens": tokens, "max_num_seqs": settings.max_num_seqs}
    if moved and model.decode is not None:
        out["decode"] = model.decode.model_copy(update={"t_seq_s": max(model.decode.t_seq_s + moved, 0.0)})
    return out


def training_model(model: ThroughputModel, pl: Placement, checkpointing: bool, seq_len: float,
                   activation_per_sequence: Optional[float]) -> ThroughputModel:
    """FSDP over the placement's training devices at sequences of ``seq_len`` tokens.

    The memory line becomes one rank's: the training state (16 bytes per parameter) is sharded
    over the ranks, and the per-sequence activations follow the sequence length (predicted from
    the config when ``activation_per_sequence`` is given, else the measured slope scaled by the
    length)."""
    t = model.require("train")
    n = pl.train_gpus
    if model.source == "fit":
        mem0 = None if t.mem0_bytes is None else rf.measured_memory_per_rank(t.mem0_bytes, model.costs, n)
        per = t.mem_per_sample_bytes
        if per is not None and t.seq_len:
            per = model.activation_bytes(seq_len)  # m(S) as fitted: linear, or with its S^2 share
    else:
        mem0 = rf.fsdp_memory_per_rank_bytes(model.costs, n, 0, 0.0)
        per = activation_per_sequence if activation_per_sequence is not None else t.mem_per_sample_bytes
    train = t.model_copy(update={"mem0_bytes": mem0, "mem_per_sample_bytes": per,
                                 "smallest_oom_micro_batch": t.smallest_oom_micro_batch if n == 1 else None})
    comm = model.comm
    if comm is not None and model.source != "fit" and (pl.train_nodes != model.nodes
                                                        or pl.train_domains != pl.train_nodes):
        comm = relinked(comm, pl.train_domains, pl.link_group)  # within one NVLink domain: its link, as within a node
    return model.model_copy(update={"train": train, "train_devices": n, "nodes": pl.train_nodes, "comm": comm,
                                    "activation_checkpointing": checkpointing or model.activation_checkpointing})


def cross_node_tp_comm(comm: CommParams, tp: int, per_node: int) -> CommParams:
    """An engine whose tensor parallelism spans nodes (NeMo-RL runs vLLM at TP 16 over two 8-GPU nodes): its
    all-reduces run at the inter-node link's rate (one 400 Gb/s NIC per GPU at the stated collective
    efficiency: a decode step's all-reduces are small, which NCCL runs on few channels, so few NICs; nccl-tests
    issue #290, two 8 x H100 nodes: 38.6 GB/s bus bandwidth at 8 MB, where FSDP's large messages reach the NICs
    together, roofline.network_ring_bytes_per_s) and latency (roofline.rl.INTER_NODE_ALPHA_S), without the
    small-message regime of vLLM's custom all-reduce, which needs NVLink peers (roofline.rl.cross_node_tp_link)."""
    bw, alpha, _ = rf_rl.cross_node_tp_link(comm.tp_busbw_bytes_per_s, comm.tp_alpha_s, tp, per_node,
                                            NIC_BUSBW_BYTES_PER_S,
                                            rf_rl.INTER_NODE_ALPHA_S)
    return comm.model_copy(update={"tp_busbw_bytes_per_s": bw, "tp_alpha_s": alpha, "tp_small_alpha_s": None,
                                   "tp_small_busbw_bytes_per_s": None})


def cross_node_note(pl: Placement, model: ThroughputModel) -> Optional[str]:
    """What the output says when an engine spans nodes."""
    if pl.tp <= pl.per_node:
        return None
    if pl.tp <= pl.link_group:
        return (f"engines of TP {pl.tp} span {pl.tp // pl.per_node} nodes of {pl.per_node} GPUs within one NVLink "
                f"domain of {pl.link_group}: their all-reduces stay on NVLink")
    c = model.comm
    rate = f" at {c.tp_busbw_bytes_per_s / 1e9:.0f} GB/s bus bandwidth, {c.tp_alpha_s * 1e6:.0f} us each" if c else ""
    group = "nodes" if pl.link_group == pl.per_node else "NVLink domains"
    return (f"engines of TP {pl.tp} span {pl.tp // pl.link_group} {group} of {pl.link_group} GPUs: their "
            f"all-reduces go across {group}, over the network{rate} (the inter-node link, not NVLink)")


def relinked(comm: CommParams, nodes: int, gpus_per_group: int) -> CommParams:
    """A predicted profile's links for the decision's node count: FSDP within a node at the node's link
    (the tensor-parallel rate, the same link), across nodes no faster than the network (one 400 Gb/s NIC per
    GPU at the stated collective efficiency, a ring over each group's NICs together), with the exposed share
    published for that many nodes. ``nodes`` counts link groups of ``gpus_per_group``: the NVLink domains
    spanned where a domain holds more than a node (GB200 NVL72)."""
    return comm.model_copy(update={
        "fsdp_busbw_bytes_per_s": rf.fsdp_link_bytes_per_s(comm.tp_busbw_bytes_per_s, nodes, NIC_BUSBW_BYTES_PER_S,
                                                           gpus_per_group),
        "fsdp_hidden_share": 1.0 - rf.fsdp_exposed_share(nodes)[0]})


def sync_s(model: ThroughputModel, pl: Placement, spec: ClusterSpec, link_bytes_per_s: Optional[float],
           latency_s: float, on_gpu: bool, pipelined: bool = False) -> float:
    """Moving the trained weights into the engines: gather them from the FSDP shards, copy each engine's TP
    shard into place (colocated) or send the weights over the link (split), plus the engines' sleep and wake
    when colocated on GPUs; ``pipelined``: in buckets from two buffers, the longer of gather and move."""
    w, engine_w = rf.sync_weight_bytes(model.costs), rf.all_weight_bytes(model.costs)
    comm = model.comm
    gather = 0.0
    if pl.train_gpus > 1 and comm is not None:
        gather = rf.allgather_s(w, pl.train_gpus, _refit_rate(model, pl.train_domains), comm.fsdp_alpha_s)
    d = model.require("decode")
    if pl.kind == "colocated" and link_bytes_per_s is None:
        move = rf.device_copy_s(w / max(pl.tp, 1), d.bw_bytes_per_s)
    else:
        # split pools on nodes of their own: the weights cross the network between them (NVLink within a domain)
        rate = link_bytes_per_s or (_refit_rate(model, pl.domains(pl.nodes)) if comm is not None else None)
        if rate is None:
            raise UserError("the weights cross devices but the profile has no link bandwidth: set "
                            "shape.sync.bytes_per_s (bytes/s) in the RL shape file")
        move = rf.transfer_s(w, rate)
    sleep = spec.sleep_wake_s if spec.sleep_wake_s is not None else (
        rf_rl.sleep_wake_s(engine_w / max(pl.tp, 1), spec.sleep_level, pl.per_node, pl.host_rate)
        if pl.kind == "colocated" and on_gpu else 0.0)
    return float(rf_rl.weight_sync_s(gather, move, pipelined, latency_s) + sleep)


def _refit_rate(model: ThroughputModel, groups: int) -> float:
    """A weight sync's gather rate over ``groups`` nodes or NVLink domains (roofline.own_nic_bytes_per_s); a
    fitted profile's measured FSDP rate as it is."""
    comm = model.comm
    if model.source == "fit":
        return comm.fsdp_busbw_bytes_per_s
    return rf.own_nic_bytes_per_s(comm.tp_busbw_bytes_per_s, groups, NIC_BUSBW_BYTES_PER_S)


def split_over_engines(prompts: int, engines: int) -> list[int]:
    """Prompts per engine when the batch is divided over ``engines`` replicas (whole prompts, so a
    group's responses stay on one engine, as veRL's dispatch keeps them)."""
    base, extra = divmod(prompts, engines)
    return [base + (1 if i < extra else 0) for i in range(engines) if base + (1 if i < extra else 0) > 0]


def idle_shares(pl: Placement, gen_s: float, gen_mean_s: float, learn_s: float, step_s: float) -> dict[str, float]:
    """Share of a step each device group waits: colocated engines for the slowest replica; a split's
    generating and training groups for each other."""
    if step_s <= 0:
        return {}
    if pl.kind == "colocated":
        return {"all devices": max(gen_s - gen_mean_s, 0.0) / step_s}
    return {"generation devices": max(1 - gen_s / step_s, 0.0), "training devices": max(1 - learn_s / step_s, 0.0)}



def domain_note(pl: Placement, source: str) -> Optional[str]:
    """What the output says when the NVLink domain joins more than a node's GPUs."""
    if pl.nodes <= 1 or pl.link_group <= pl.per_node:
        return None
    within = ("all in one NVLink domain" if pl.domains(pl.nodes) == 1
              else f"in {pl.domains(pl.nodes)} NVLink domains of {pl.link_group}")
    return (f"{pl.gpus} GPUs on {pl.nodes} nodes of {pl.per_node}, {within} ({source}): FSDP, EP and engine TP "
            "within a domain run at the NVLink rate, not the network's")


def layout_notes(model: ThroughputModel, placement: Optional[str], spec: ClusterSpec,
                 domain: Optional[int] = None) -> list[str]:
    """Where the profile's own layout differs from the decision's: which one sets the links."""
    gpus, nodes = spec.gpus or model.train_devices, decision_nodes(model, spec)
    if (gpus, nodes) == (model.train_devices, model.nodes):
        return []
    if model.source == "fit":
        return [f"the profile was measured on {model.train_devices} device(s) on {model.nodes} node(s) and the "
                f"decision is for {gpus} on {nodes}: its measured collective rates are kept, so links across nodes "
                "it did not measure are not in the figures"]
    one_domain = domain is not None and gpus // nodes < domain and gpus <= domain
    where = ("within one NVLink domain, over its link" if nodes > 1 and one_domain else
             "across nodes, no faster than the network" if nodes > 1 else "within one node, over its link")
    return [f"the profile was predicted for {model.train_devices} GPU(s) on {model.nodes} node(s) and the decision "
            f"is for {gpus} on {nodes}: the training links follow the decision ({where}), not the profile"]
