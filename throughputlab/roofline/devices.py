"""Many devices: collectives (nccl-tests' bus bandwidth), tensor-parallel sharding and its
all-reduces, FSDP's traffic and memory per rank."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from throughputlab.roofline.core import Costs, _out, all_weight_bytes
from throughputlab.roofline.engine import ACTIVATION_BYTES
from throughputlab.roofline.memory import training_state_bytes

# Tensor-parallel all-reduces as published (latency alpha, nccl-tests' bus bandwidth), two regimes:
# NVLink, small tensors: vLLM's one-stage custom all-reduce on H100 under CUDA graphs (vLLM PR #24111,
#   benchmark_device_communicators, TP 4: 0.5, 1 and 2 MB in 10, 15 and 22 us; TP 2: 0.5 MB in 7 us):
#   alpha 6 us, bus bandwidth 200 GB/s, 0.44 of the 450 GB/s NVLink 4 link.
# NVLink, large tensors: NCCL or symmetric memory (same table: two-shot 2-4 MB in 23-29 us): alpha 17 us,
#   the link's bandwidth at the collective efficiency (comm_bw).
# PCIe: NCCL alone (vLLM's custom all-reduce needs NVLink beyond 2 GPUs): 57 us for 8 KB on 8 A800 PCIe
#   GPUs (vLLM issue #50576), alpha 50 us. (SGLang PR #2904, H100 without CUDA graphs: vLLM's custom
#   all-reduce 8.7-10.1 us up to 32 KB at TP 2-8; Triton-distributed issue #57: NCCL 19-25 us up to 512 KB
#   on 8 H100s, eager.)
TP_SMALL_ALPHA_S = 6e-6
TP_SMALL_BW_SHARE = 0.44
TP_NVLINK_ALPHA_S = 17e-6
TP_PCIE_ALPHA_S = 50e-6
# AMD Infinity Fabric (xGMI, 8 x MI300X), RCCL as published by AMD (rocm.blogs.amd.com, "MI300X RCCL xGMI",
#   2 Mar 2025; RCCL 2.22.3, ROCm 6.3, rccl-tests all_reduce_perf on 8 GPUs, float). Small tensors, run under
#   graphs (-G 1): 256 KB 10.26 us, 512 KB 14.26, 1 MB 19.40, 2 MB 35.0: a line of alpha 7.2 us and 150 GB/s
#   bus bandwidth, 0.335 of the 448 GB/s link (vLLM's ROCm custom all-reduce serves these sizes; no TP-8 table of
#   its own was found, so RCCL's). Large tensors: 16 MB 148.8 us, 64 MB 429.1, 256 MB 1,537 (305.6 GB/s), 1 GB
#   (314.7): 315 GB/s, 0.70 of the link, with alpha 56 us (the 16 and 64 MB points). The MI325X has the same
#   links; no rccl-tests table of its own was found, so the MI300X's figures stand for it.
XGMI_SMALL_ALPHA_S = 7.2e-6
XGMI_SMALL_BW_SHARE = 0.335
XGMI_ALPHA_S = 56e-6
XGMI_COMM_BW = 0.70


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth over algorithm bandwidth: 2(n-1)/n for all-reduce, (n-1)/n for
    all-gather and reduce-scatter (their bytes the full buffer), so rank counts compare."""
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def allreduce_s(nbytes, n: int, busbw: float, alpha_s: float = 0.0):
    """All-reduce of ``nbytes`` over n ranks: alpha + m*bus_factor/busbw; 0 on one rank."""
    if n <= 1:
        return _out(np.zeros_like(np.asarray(nbytes, dtype=float)))
    return _out(alpha_s + np.asarray(nbytes, dtype=float) * bus_factor("all_reduce", n) / busbw)


def allgather_s(nbytes, n: int, busbw: float, alpha_s: float = 0.0):
    """All-gather (or reduce-scatter) of a full buffer of ``nbytes``: alpha + m*bus_factor/busbw."""
    if n <= 1:
        return _out(np.zeros_like(np.asarray(nbytes, dtype=float)))
    return _out(alpha_s + np.asarray(nbytes, dtype=float) * bus_factor("all_gather", n) / busbw)


reduce_scatter_s = allgather_s


def tp_shard(costs: Costs, tp: int) -> Costs:
    """One device's constants under tensor parallelism (Megatron-style, as vLLM shards): weights,
    FLOPs and attention split TP ways; KV heads too, at least one per device (vLLM replicates)."""
    if tp <= 1:
        return costs
    k = costs.kv_bytes_per_token
    if costs.num_kv_heads:
        k = k / costs.num_kv_heads * max(costs.num_kv_heads // tp, 1)
    else:
        k = k / tp
    total = None if costs.total_weight_bytes is None else costs.total_weight_bytes / tp
    return costs.model_copy(update={
        "weight_bytes": costs.weight_bytes / tp, "kv_bytes_per_token": k, "flops_per_token": costs.flops_per_token / tp,
        "attn_flops_per_ctx_token": costs.attn_flops_per_ctx_token / tp, "moe_expert_bytes": costs.moe_expert_bytes / tp,
        "total_weight_bytes": total})


def tp_allreduce_s(nbytes, n: int, busbw: float, alpha_s: float, small_alpha_s: Optional[float] = None,
                   small_busbw: Optional[float] = None):
    """A tensor-parallel all-reduce: the faster of two lines, as engines pick their algorithm by size
    (vLLM: its one-stage custom all-reduce for small tensors, NCCL or symmetric memory for large ones):
    min(alpha_small + m*f/busbw_small, alpha + m*f/busbw); one line without the small regime."""
    large = allreduce_s(nbytes, n, busbw, alpha_s)
    if small_alpha_s is None or not small_busbw or n <= 1:
        return large
    return _out(np.minimum(large, allreduce_s(nbytes, n, small_busbw, small_alpha_s)))


def tp_comm_s(costs: Costs, tokens, tp: int, busbw: float, alpha_s: float, small_alpha_s: Optional[float] = None,
              small_busbw: Optional[float] = None):
    """Two all-reduces per layer of tokens*hidden 16-bit values (attention output and MLP output,
    Megatron): the activations all-reduced are 16-bit whatever the weight dtype (FP8 weights too)."""
    if tp <= 1 or not costs.num_layers or not costs.hidden_size:
        return _out(np.zeros_like(np.asarray(tokens, dtype=float)))
    m = np.asarray(tokens, dtype=float) * costs.hidden_size * ACTIVATION_BYTES
    return _out(2 * costs.num_layers * tp_allreduce_s(m, tp, busbw, alpha_s, small_alpha_s, small_busbw))


# A decode step's small kernels move each token's activations through memory, and under tensor parallelism the
# hidden-width ones are not sharded: every rank runs the residual stream's norms on the whole hidden vector. Per
# token and layer, in 16-bit values (vLLM's and SGLang's Llama layer; the GEMMs' own inputs and outputs left out,
# under their compute at the batches where this matters): two fused residual-add RMSNorms, each reading the input
# and the residual and writing both, 8h, on every rank; the rotary embedding, reading and writing q and k, ~2h/TP;
# the gated activation, reading gate and up and writing their product, 3I/TP; an MoE layer's weighted sum of its
# routed outputs (vLLM's moe_sum under tensor-parallel experts), reading top-k rows of h and writing one, (top-k + 1)h
# on every rank. A kernel costs its floor (LAYER_KERNELS_S holds five a layer) plus its bytes' time at the decode
# bandwidth (vLLM's RMSNorm microbenchmark, PR #27931, B200, hidden 4,096: ~8 us plus ~6 ns a token, linear). Llama-3.1-70B
# at TP 8 with 1,516 sequences: 157 KB a token and layer, 7 ms of a ~75 ms step; Llama-3.1-8B at batch 128: 0.26 ms of 11.
ELEMENTWISE_HIDDEN_PASSES = 8
ELEMENTWISE_SHARDED_HIDDEN_PASSES = 2
ELEMENTWISE_MLP_PASSES = 3


def decode_elementwise_bytes(costs: Costs, tp: int = 1) -> float:
    """Bytes one token's small kernels (norms, rotary, gated activation, MoE's routed outputs) move per layer on
    one device of a TP group (ELEMENTWISE_*_PASSES; 0 without the model's widths)."""
    if not costs.hidden_size or not costs.num_layers:
        return 0.0
    h, tp = float(costs.hidden_size), max(tp, 1)
    values = ELEMENTWISE_HIDDEN_PASSES * h + (ELEMENTWISE_SHARDED_HIDDEN_PASSES * h
                                              + ELEMENTWISE_MLP_PASSES * (costs.mlp_width or 0.0)) / tp
    if costs.moe_layers:
        values += costs.moe_layers / costs.num_layers * ((costs.moe_top_k or 1) + 1) * h
    return values * max(ACTIVATION_BYTES, costs.bytes_per_param)


def decode_elementwise_s(costs: Costs, tokens, tp: int, bw: float):
    """The time a decode step's small kernels take beyond their floor (which the step's fixed cost holds):
    layers x tokens x :func:`decode_elementwise_bytes` / BW."""
    return _out((costs.num_layers or 0) * np.asarray(tokens, dtype=float) * decode_elementwise_bytes(costs, tp) / bw)


def fsdp_comm_s(costs: Costs, n: int, busbw: float, alpha_s: float = 0.0, reduce_bytes_per_param: int = 4,
                backward: bool = True) -> float:
    """FSDP's traffic per micro-step and rank: parameters all-gathered in the forward and again in
    the backward (2*P*bytes*(n-1)/n), gradients reduce-scattered (P*bytes_grad*(n-1)/n, fp32 by
    default), one collective of each per block and the root; ``backward=False``: one all-gather."""
    if n <= 1:
        return 0.0
    params = all_weight_bytes(costs) / costs.bytes_per_param
    groups = (costs.num_layers or 0) + 1
    gather = allgather_s(params * costs.bytes_per_param, n, busbw)
    if not backward:
        return float(gather + groups * alpha_s)
    scatter = reduce_scatter_s(params * reduce_bytes_per_param, n, busbw)
    return float(2 * gather + scatter + 3 * groups * alpha_s)


def exposed_s(compute_s, comm_s, hidden_share: float):
    """A step whose communication overlaps its compute: compute + the share of comm not hidden, and never
    less than the comm itself: overlap hides comm under compute, so at most as much comm as there is
    compute (a small micro-batch whose collectives outlast its compute waits for them):
    compute + max((1 - hidden) * comm, comm - compute)."""
    compute = np.asarray(compute_s, dtype=float)
    comm = np.asarray(comm_s, dtype=float)
    return _out(compute + np.maximum((1.0 - hidden_share) * comm, comm - compute))


def measured_memory_per_rank(mem0_measured: float, costs: Costs, n: int) -> float:
    """A one-device memory line's intercept on one of n FSDP ranks: the training state it holds
    (16 bytes per parameter) sharded n ways, the rest (buffers, the runtime) as measured."""
    return max(mem0_measured - training_state_bytes(costs) * (1 - 1 / max(n, 1)), 0.0)


def activations_at(mem_per_sample: float, seq_len, measured_seq_len: float, sq_share: float = 0.0):
    """A measured per-sequence activation slope m at another sequence length: linear in S (the
    flash-attention activations of Korthikanti et al. 2022), with a share ``sq_share`` of m growing
    as S^2 (attention scores kept): m(S) = m1*S + m2*S^2 through m at S_ref."""
    r = np.asarray(seq_len, dtype=float) / measured_seq_len
    return _out(mem_per_sample * ((1.0 - sq_share) * r + sq_share * r * r))


def fsdp_memory_per_rank_bytes(costs: Costs, n: int, b, activation_per_sequence: float):
    """(parameters + gradients + optimizer states) / N + b sequences of activations."""
    return _out(training_state_bytes(costs) / max(n, 1) + np.asarray(b, dtype=float) * activation_per_sequence)


# Training FLOP/s as a share of the datasheet peak of the dtype, per device family, from published FSDP
# runs, in this model's FLOP count (train_flops: causal attention halved, recomputed forwards counted;
# torchtitan's MFU counts 6N + 12*L*h*S without recompute, so its figures read higher):
# A100 (A800: same SMs), 16-bit, and H100 (H800; H200) 16-bit: the median over three published sources of
#   FSDP training of dense models on 8-128 GPUs, each source's own median (its rows' tokens/s per GPU read back
#   through this model's FLOP count; `benchmarks/published.py` holds every row with its source):
#   A100: torchtitan docs/performance.md at 1ea476e (April 2024, Llama 3 8B/70B, Llama 2 13B/70B on 64 A100 80GB)
#   53%, MosaicML llm-foundry scripts/train/benchmarking/README.md at 8c8dd48 (MPT 760M-70B on 8-128 A100 40/80GB)
#   62%, IBM fms-fsdp README at 4ffb9bd/ed74fd5 (Llama 2 7B-70B on 128 A100 80GB) 59%: 59%.
#   H100: llm-foundry (MPT 1B-70B on 8-128 H100 80GB) 46%, fms-fsdp (Llama 2 7B-70B on 96 H100) 43%, torchtitan's
#   Trainy record (Llama 3.1 8B FSDP on 32-64 H200, benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md) 36%:
#   43%. torchtitan's own H100 record (benchmarks/llama3_h100_202412_torchtitan.md at 820504e, Llama 3.1 8B on
#   H100s capped at 500 W with 96 GB HBM2e) reads 34% and is not taken: its parts are not the 700 W H100 SXM.
#   Larger models reach more of the peak in all three (llm-foundry H100: 7B 45%, 70B 52-58%).
# H100 fp8 (of the fp8 peak): torchtitan's 500 W H100 record, FSDP + compile + Float8 on 8 GPUs, 8532 tok/s/GPU:
#   23% (no other fp8 FSDP record found).
# H200 fp8: torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md at 4a61bd8, FSDP + compile +
#   Float8 (float8 all-gather) on 32 H200, 10938 tok/s/GPU: 29%.
# AMD CDNA3 16-bit: no published FSDP run. H100's 43% scaled by what dense BF16 GEMMs sustain on each (AMD's
#   max-achievable FLOPs, hipBLASLt: MI300X 708 of 1,307 TFLOP/s, 54%, MI325X 843, 64.5%; H100 about 720 of 989,
#   73%, SemiAnalysis Dec 2024: the shares calibration.py's CDNA3 rows scale decode and prefill by): MI300X 32%,
#   MI325X 38%.
# Other devices and dtypes: 40% (TRAIN_MFU_FALLBACK), no published run behind it.
_A100 = "median of torchtitan (64 A100), llm-foundry (MPT, 8-128 A100) and fms-fsdp (Llama 2, 128 A100) FSDP runs"
_H100 = "median of llm-foundry (MPT, 8-128 H100), fms-fsdp (Llama 2, 96 H100) and torchtitan (8B, 32-64 H200) FSDP runs"
TRAIN_MFU = {
    ("A100", "16-bit"): (0.59, _A100),
    ("A800", "16-bit"): (0.59, _A100 + " (A800: same SMs)"),
    ("H100", "16-bit"): (0.43, _H100),
    ("H800", "16-bit"): (0.43, _H100 + " (H800: same SMs)"),
    ("H200", "16-bit"): (0.43, _H100),
    ("H100", "fp8"): (0.23, "torchtitan llama3_h100_202412 record (500 W H100s), Llama 3.1 8B FSDP+compile+Float8"),
    ("H800", "fp8"): (0.23, "torchtitan llama3_h100_202412 record on 500 W H100s (H800: same SMs), Float8"),
    ("H200", "fp8"): (0.29, "torchtitan llama3-8b_h200_202506 record (Trainy), FSDP+compile+Float8 on 32 H200"),
    ("MI300X", "16-bit"): (0.32, "H100's FSDP share x the dense BF16 GEMM share on CDNA3 against H100 (AMD max-"
                                 "achievable FLOPs 54% of peak vs 73%): no published MI300X FSDP run"),
    ("MI325X", "16-bit"): (0.38, "H100's FSDP share x the dense BF16 GEMM share on CDNA3 against H100 (AMD max-"
                                 "achievable FLOPs 64.5% of peak vs 73%): no published MI325X FSDP run"),
}
TRAIN_MFU_FALLBACK = 0.40

# Megatron-core (TP/PP layouts, distributed optimizer, Transformer Engine kernels), same FLOP count. NVIDIA's DGX
# Cloud benchmarking recipes (github.com/NVIDIA/dgxc-benchmarking llama3.1/README_8b.md and README_70b.md at
# 143b90d, NeMo 24.09 container, sequences of 8192 tokens, no activation recompute listed) publish step times and
# MFU as NeMo counts it (attention's S^2 term in full: 57.9 GFLOP a token for Llama 3.1 8B, here 51.5 with the
# causal half):
# H100 16-bit: Llama 3.1 8B BF16, TP 1 PP 1 CP 2 on 8 H100: 12.91 s per 128 x 8192 tokens = 10,153 tok/s/GPU,
#   "59.37% MFU" as NeMo counts it, here 52.8% (52.1% on 128 GPUs); Llama 3.1 70B BF16, TP 4 PP 4 CP 2 VP 5 on 64
#   H100: 1,113 tok/s/GPU = 50.6% here (49.9% on 2048). 52% taken from the 8B run: no tensor or pipeline
#   parallelism, whose all-reduces and bubble decide/backend.py adds on its own. H800 (same SMs) and H200 (no
#   16-bit Megatron run published for it) take it.
# H100 fp8 (of the fp8 peak): same recipes, FP8: 8B 13,554 tok/s/GPU = 35.3% (34.7% on 128), 70B 33.8%: 35%.
# Not taken: A100 (Megatron-LM README, 2022: 22B GPT 41.5% MFU, 40.8% here with selective recompute, measured at
#   TP 8, its all-reduces inside the figure), B200/GB200 (NeMo's Megatron-Bridge performance summaries publish
#   Llama 3 at FP8 only). Those keep the FSDP share and say so.
TRAIN_MFU_MEGATRON = {
    ("H100", "16-bit"): (0.52, "NVIDIA dgxc-benchmarking Llama 3.1 8B BF16, NeMo 24.09 Megatron TP1 PP1 CP2 on 8 H100"),
    ("H800", "16-bit"): (0.52, "NVIDIA dgxc-benchmarking Llama 3.1 8B BF16 on 8 H100 (H800: same SMs)"),
    ("H200", "16-bit"): (0.52, "NVIDIA dgxc-benchmarking Llama 3.1 8B BF16 on 8 H100 (no 16-bit H200 run published)"),
    ("H100", "fp8"): (0.35, "NVIDIA dgxc-benchmarking Llama 3.1 8B FP8, NeMo 24.09 Megatron TP1 PP1 CP2 on 8 H100"),
    ("H800", "fp8"): (0.35, "NVIDIA dgxc-benchmarking Llama 3.1 8B FP8 on 8 H100 (H800: same SMs)"),
    ("H200", "fp8"): (0.35, "NVIDIA dgxc-benchmarking Llama 3.1 8B FP8 on 8 H100 (no fp8 Megatron H200 run)"),
}


def train_mfu(device: str, dtype: str, backend: str = "fsdp") -> tuple[float, str]:
    """Training FLOP/s share of peak for a datasheet row and dtype (TRAIN_MFU, or TRAIN_MFU_MEGATRON for
    ``backend="megatron"``), and where it comes from."""
    width = "16-bit" if dtype in ("bfloat16", "float16", "bf16", "fp16") else dtype
    if backend == "megatron":
        for (prefix, d), (mfu, source) in TRAIN_MFU_MEGATRON.items():
            if device.startswith(prefix) and d == width:
                return mfu, source
        mfu, source = train_mfu(device, dtype)
        return mfu, f"no published Megatron run for {device} {dtype}: the FSDP share ({source})"
    for (prefix, d), (mfu, source) in TRAIN_MFU.items():
        if device.startswith(prefix) and d == width:
            return mfu, source
    return TRAIN_MFU_FALLBACK, f"no published FSDP run for {device} {dtype}: the {TRAIN_MFU_FALLBACK:.0%} fallback"


# Mixture-of-experts training reaches a smaller share of the peak than a dense model of the same software and GPU:
# each expert's GEMMs are as narrow as the expert, and routing, token permutation and the all-to-alls add work the
# model FLOPs do not count. The finer the experts, the lower. MoE MFU / dense MFU in the same release, on the
# same GPU and precision, active FLOPs counted (Megatron-Bridge docs/performance-summary.md and its archive;
# NVIDIA/dgxc-benchmarking 25.05.x READMEs):
# fine-grained, expert width <= 0.4 x hidden: DeepSeek-V3 (0.29) against Llama 3.1 405B on H100 BF16, 16.55% vs
#   55.34% MFU (dgxc 25.05.x): 0.30; Megatron-Bridge 26.04.01 on H100 FP8, Qwen3-30B-A3B (0.375) 10.4% and
#   Qwen3-235B-A22B (0.375) 12.8% against Llama 3 70B 36.9%: 0.28 and 0.35 (25.11: 0.17 and 0.32). 0.30 taken.
# coarse, expert width >= 3.5 x hidden: Mixtral 8x7B (3.5) against Llama 3 70B, FP8, on GB200 (NeMo 25.04) 0.82
#   and B200 (25.02) 0.87; Grok-1 (5.3) against Llama 3.1 405B on H100 (dgxc 25.05.x) 0.98 BF16, 0.76 FP8. 0.82.
# Between, log-linear in the width (Llama 4 Maverick, 1.6: 0.63 on the line; 0.56 FP8 and 0.74 BF16 published).
# Taken for FSDP runs too: no published FSDP MoE run pairs with a dense one. These were measured on H100-class
# devices, where a narrow expert's GEMM at a training micro-batch's few hundred tokens per expert sits below the
# ridge point (memory-bound), as do the permutations: the extra time is memory traffic. On a device with less
# compute per byte of bandwidth it weighs less against the compute (an H20 has 0.13x the H100's FLOP/s per
# byte/s), so the extra time (1/share - 1) scales with the device's balance over the H100's.
MOE_TRAIN_SHARE_FINE = (0.4, 0.30)  # (expert width / hidden, MoE MFU / dense MFU) on H100-class devices
MOE_TRAIN_SHARE_COARSE = (3.5, 0.82)


def moe_train_share(costs, balance: float = 1.0) -> tuple[float, str]:
    """The training FLOP/s of a mixture-of-experts model as a share of a dense model's (1 for dense), from its
    experts' width over the hidden size, on a device whose FLOP/s per byte/s is ``balance`` x the H100's
    (records.peaks.balance_vs_reference); and what it rests on."""
    if not costs.moe_num_experts or not costs.hidden_size or not costs.moe_expert_bytes:
        return 1.0, ""
    width = costs.moe_expert_bytes / costs.bytes_per_param / (3.0 * costs.hidden_size ** 2)
    (w0, s0), (w1, s1) = MOE_TRAIN_SHARE_FINE, MOE_TRAIN_SHARE_COARSE
    t = min(max(math.log(width / w0) / math.log(w1 / w0), 0.0), 1.0)
    on_h100 = s0 + t * (s1 - s0)
    share = 1.0 / (1.0 + (1.0 / on_h100 - 1.0) * balance)
    return share, (f"x {share:.2f} for experts {width:.2f}x the hidden size wide (MoE MFU over dense in published "
                   f"Megatron runs on H100s: 0.30 at 0.4x and below, 0.82 at 3.5x and above; here {on_h100:.2f}, its "
                   f"extra time scaled by this device's FLOP/s per byte/s, {balance:.2f}x the H100's)")


def backend_train_rate(phi_fsdp: float, device: str, dtype: str, backend: str) -> tuple[float, float, str]:
    """A training FLOP/s predicted at FSDP's share of the peak, at ``backend``'s share instead:
    phi x share(backend) / share(fsdp); with that share and its source."""
    share, source = train_mfu(device, dtype, backend)
    return phi_fsdp * share / train_mfu(device, dtype)[0], share, source


# Share of FSDP's traffic that stays exposed (not under compute), from published weak scaling:
# within a node 0: the MFU above comes from single-node FSDP runs, whose exposed NVLink traffic it holds.
# across nodes 5%: torchtitan llama3_h100_202412, Llama 3.1 8B FSDP, 8 -> 128 H100 (16 nodes, 400 Gb/s RDMA
#   per GPU): 5762 -> 5605 tok/s/GPU (-2.7%) eager, 6667 -> 6514 with compile, 8532 -> 8380 with Float8: the step
#   grows 0.080 s (0.058, 0.035) against fsdp_comm_s's 0.20 s (0.17 fp8) at the ring rate below (8 NICs of
#   50 GB/s x comm_bw 0.8, under NVLink's 450 x 0.8): 40% (29%, 21%) exposed; the eager 40% taken.
FSDP_EXPOSED_WITHIN_NODE = 0.0
FSDP_EXPOSED_ACROSS_NODES = 0.40


def network_ring_bytes_per_s(nic_bytes_per_s: float, gpus_per_group: int) -> float:
    """The bus bandwidth of an NCCL ring that crosses the network, from groups of ``gpus_per_group`` GPUs (a
    node, or an NVLink domain) with a NIC each: NCCL opens a channel per NIC and each channel leaves the group
    through a different GPU's NIC, so the ring runs at the group's NICs together (nccl-tests issue #290, an
    NCCL maintainer: "For NDR @ 400Gbps you should see 46-48GB/s per NIC"; 8 x 400 Gb/s NICs: ~370-400 GB/s
    of bus bandwidth, where one NIC alone would give 50)."""
    return nic_bytes_per_s * max(gpus_per_group, 1)


def own_nic_bytes_per_s(node_link_bytes_per_s: float, groups: int, nic_bytes_per_s: float) -> float:
    """The rate of traffic that leaves each GPU through its own NIC when it spans ``groups`` nodes (or NVLink
    domains): the node's link within one, else no faster than one NIC per GPU. So runs an all-to-all (MoE's
    token dispatch: every GPU sends its off-node share at once, each through its NIC), and a weight sync
    (refit), which moves the weights one tensor at a time (gathers over TP/PP/EP, broadcasts from the owning
    ranks), not as one ring over every NIC: published NeMo-RL refits across 16-32 nodes took 7-50 s
    (NVIDIA-NeMo/RL PR #449, ~30B on 16 nodes: dense 18 -> 7 s, MoE 430 -> 50 s; PR #686: 51 -> 47 s), where a
    ring over the nodes' NICs (:func:`network_ring_bytes_per_s`) would gather those weights in 0.2-4 s."""
    return node_link_bytes_per_s if groups <= 1 else min(node_link_bytes_per_s, nic_bytes_per_s)


def fsdp_link_bytes_per_s(link_bytes_per_s: float, nodes: int, nic_bytes_per_s: float, gpus_per_group: int = 1) -> float:
    """The per-GPU rate an FSDP ring runs at: the node's link within one node; across nodes the ring
    crosses the network too, so the slower of the node's link and its NICs together
    (:func:`network_ring_bytes_per_s`)."""
    return link_bytes_per_s if nodes <= 1 else min(link_bytes_per_s, network_ring_bytes_per_s(nic_bytes_per_s,
                                                                                            gpus_per_group))


def fsdp_exposed_share(nodes: int) -> tuple[float, str]:
    """Exposed share of FSDP's traffic on ``nodes`` machines, and its source, for the header."""
    if nodes <= 1:
        return FSDP_EXPOSED_WITHIN_NODE, ("within a node (the MFU's single-node FSDP runs already hold what NVLink "
                                          "leaves exposed)")
    return FSDP_EXPOSED_ACROSS_NODES, "across nodes (torchtitan 8 -> 128 H100 FSDP weak scaling, -2.7% tok/s/GPU)"
