"""An inference engine's own rules: how much KV cache it allocates, how many sequences it admits at
once, and the fixed costs of its decode step (CUDA graphs or eager, the per-layer kernel floor).

Each rule is one function with its source (docs/model.md, "Engine and transfers"); ``predict``,
``throughput`` and ``decide`` call them and derive nothing themselves. Sizes in bytes, times in
seconds. KV capacities are per engine in tokens (every device of a TP engine holds the same tokens).
"""

from __future__ import annotations

from typing import Literal, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict

from throughputlab.roofline.core import Costs, _out, all_weight_bytes

GIB = 2**30
# Memory the CUDA runtime does not expose (torch.cuda.mem_get_info's total against nvidia-smi's):
# H100 80GB 79.21 of 79.65 GiB, H200 139.80 of 140.40 GiB, A100 80GB 79.25 of 80.00 GiB; mean 0.6 GiB.
CUDA_UNEXPOSED_BYTES = 0.6 * GIB
ACTIVATION_BYTES = 2  # 16-bit activations, whatever the weight dtype (FP8 checkpoints compute in BF16)
# vLLM's profile run ends with the sampler on min(max_num_seqs, max_num_batched_tokens) rows, top-k and
# top-p set (gpu_model_runner._dummy_sampler_run): 16-bit and fp32 logits and fp32 probabilities, about
# 12 bytes per vocabulary entry and row (FlashInfer's fused top-k/top-p sorts nothing; the PyTorch-native
# path adds a sort, values and int64 indices, to ~20). The Mistral-7B LLaVA log below implies 13.
SAMPLER_BYTES_PER_LOGIT = 12
# Memory outside torch's allocator that vLLM subtracts (gpu_worker.determine_available_memory,
# "non_torch_memory"): 0.05-0.35 GiB on one GPU in published logs, 0.25 GiB on each rank of a TP-2
# engine (vLLM issue #13061, NCCL included).
NON_TORCH_BYTES = 0.25 * GIB
# CUDA graphs' pool, which current vLLM estimates before sizing the KV cache ("Estimated CUDA graph
# memory"): 0.23-0.67 GiB for 7-8B dense models in published logs.
CUDA_GRAPH_BYTES = 0.5 * GIB
# Tokens per KV block: vLLM's block_size on CUDA (vllm/config/cache.py), SGLang's page_size,
# TensorRT-LLM's KvCacheConfig.tokens_per_block.
BLOCK_TOKENS = {"vllm": 16, "sglang": 1, "trtllm": 32}
# Decode fixed costs. With CUDA graphs: 0.15 ms per step plus 12.5 us per layer plus the GEMM floors below
# (SGLang PR #1401: Llama-3-8B at batch 1 takes 7.06 ms a step on H100; its 16.06 GB of weights at 80% of
# 3.35 TB/s take 5.99 ms and its 128 GEMM floors 0.51 ms, which leaves 0.55 ms). That measurement fixes the sum
# for 32 layers; the split follows the kernels: a layer runs five small ones besides its GEMMs (two fused
# residual-add RMSNorms, rotary embedding with the KV-cache write, attention, the gated activation), about 2.5 us
# each in a graph, and the step a handful (embedding, final norm, the sampler's). Models of 80-126 layers at TP 4-8
# and batch 1-16 (Argonne's Llama-3-70B and Qwen2-72B, AMD's Llama-3.1-70B on MI300X, ML.ENERGY's and dstack's
# Llama-3.1-405B FP8) were 4-19% optimistic with the whole 0.55 ms per step, 1-15% with the split.
# Eager (no CUDA graphs): the host launches every layer's kernels one by one while the device runs the
# ones already queued, so a step takes max(host, device) (eager_step_s), the host's time being
# EAGER_LAYER_S per layer. vLLM 0.80 ms: vllm-omni issue #7960, Qwen2.5-Omni-7B on 2 A800s, thinker
# (28 layers) ~22-23 ms a token eager against ~13 ms with graphs, 22.5/28 = 0.80 ms; its talker (24 or
# 28 layers) ~19-20 against ~5.4-6 ms, 0.70-0.81 ms. Read additively, the same rows give 0.34 and
# 0.49-0.58 ms a layer for the same engine's layers; the max form agrees at both device times. SGLang
# 0.29 ms: PR #1401, Llama-3-8B on H100 at batch 1, 32 layers, 9.28 ms eager with the triton backend
# against 7.06 ms with graphs (flashinfer: 8.23 against 7.35 ms, 0.26 ms). TRT-LLM taken as vLLM's.
# Engines that run a prompt's prefill as a step of its own, the decodes waiting (SGLang: --enable-mixed-chunk off by
# default); vLLM V1 and TensorRT-LLM's in-flight batching mix it into the decode steps (vLLM V0 did either way).
SEPARATE_PREFILL_ENGINES = ("sglang",)
GRAPH_STEP_S = 0.15e-3
SMALL_KERNEL_S = 2.5e-6
LAYER_KERNELS_S = 5 * SMALL_KERNEL_S
# vLLM's V0 engine (before 0.8, when V1 became the default) schedules, prepares inputs and samples between
# device steps instead of overlapping them: 2.4 ms more a decode step. From Qwen2's speed benchmark (vLLM 0.4.2,
# A100 80GB, batch 1, 2048 tokens; QwenLM/Qwen2 docs/source/benchmark/speed_benchmark.rst): Qwen2-0.5B, 1.5B and
# 7B at 270.49, 175.55 and 80.45 tokens/s, 3.70, 5.70 and 12.43 ms a step, against this model's CUDA-graph step
# for the same shapes (1.57, 2.98, 10.04 ms): 2.13, 2.72 and 2.39 ms more; 2.4 taken. (vLLM issue #6854, before
# multi-step scheduling: "about 4ms of GPU bubble" a decode step, model and batch not stated.)
V0_STEP_HOST_S = 2.4e-3
# V0's multi-step scheduling (--num-scheduler-steps N, vLLM 0.6 to 0.7; RFC vllm-project/vllm#6854: "with
# multi-step-8, the 4ms only needs to be incurred once for every 8 decode" steps) runs N decode steps per host round:
# the V0 host time, and the per-sequence host time of a step, once per N steps.
V1_DEFAULT_VERSION = (0, 8)
# vLLM without async scheduling (before 0.14, where it became the default: vLLM PR #27614; DJL issue #3833 for the
# release) schedules step N+1, prepares its inputs and turns step N's sampled tokens into request outputs while the
# GPU waits: host work that grows with the running sequences and adds to every decode step. vLLM PR #23914 (A100,
# TP 2, engine in the caller's process as RL frameworks run it, 512 output tokens): overlapping the scheduling alone
# raised tokens/s by 1.1%, 2.3%, 4.2% and 5.4% at batch 32, 64, 128 and 256, i.e. 0.35 ms of a ~32 ms step at 32
# and 3.4 ms of a ~63 ms step at 256: 13 us per running sequence. Per-token log-probs (RL frameworks ask for them)
# add more host work per sequence (vLLM PR #57442: 0.67-0.73x tokens/s at 64-512 on a small model, serving path);
# not added here, no offline measurement.
SYNC_HOST_PER_SEQ_S = 13e-6
# vLLM's V0 engine across several GPUs (TP > 1) does more per running sequence a decode step: besides scheduling,
# the driver builds each sequence's metadata and broadcasts the step's inputs to the other ranks (vLLM issues
# #4440 and #6241 on that broadcast's cost). Two published V0 sweeps on H100 hosts, below the point where the KV
# cache limits the batch, grow ~0.12 ms a step per running sequence faster than the device's own work: Argonne's
# LLM-Inference-Bench, vLLM 0.5.4, Llama-3-70B and Qwen2-72B at TP 4, 128 to 2048 tokens in and out, batch 1 to 64
# (the step 19.2, 21.5, 25.6 and 29.3 ms at 1, 16, 32 and 64 against this model's 18.2, 19.8, 21.5 and 25 ms
# without it: +0.13 ms a sequence); dstack's Llama-3.1-405B-FP8 at TP 8, vLLM 0.6.3, 4 to 32 requests of
# 128 + 2048 tokens (34.8 to 38.2 ms a step: +0.12 ms a sequence). At TP 1 there is no broadcast and no published
# figure: SYNC_HOST_PER_SEQ_S is kept. Multi-step scheduling divides it like the rest of V0's host work.
V0_TP_HOST_PER_SEQ_S = 0.12e-3
# Per-token log-probs, which RL rollouts ask for (vLLM logprobs=0: each sampled token's), add host work per running
# sequence where the engine runs in the caller's process (VLLM_ENABLE_V1_MULTIPROCESSING=0: veRL's synchronous
# rollout under external_launcher, NeMo-RL's synchronous engine) without async scheduling: each step's log-prob
# records are built in Python, and with the text each log-prob token is decoded on its own (vLLM's
# convert_ids_list_to_tokens, one tokenizer.decode per id: 6-8 us a call in vLLM PR #42211). Measured side by side
# on the real engine (benchmarks/inprocess_logprobs_host.py: vLLM 0.32 in one process, the scheduler, the update from
# the step's output and the output processing timed per running sequence; record in reports/cpu-amd-epyc-2026-12-05),
# medians over 64, 256 and 512 sequences, the mean of two runs: 1.55x plain's host time with the log-probs alone
# ("ids": detokenize off, veRL; 1.62 and 1.48) and 2.66x with the text too ("text": NeMo-RL; 2.78 and 2.53). Taken as
# ratios, so that the GPU host's SYNC_HOST_PER_SEQ_S carries them: +0.55 and +1.66 of it a sequence. A server (the engine in its own process, the output work in the
# frontend's) or async scheduling overlaps this work with the device's step.
LOGPROBS_HOST_RATIO = {"off": 1.0, "ids": 1.55, "text": 2.66}
ASYNC_SCHEDULING_DEFAULT_VERSION = (0, 14)
# The default applies where the engine's executor can overlap: vLLM turns async scheduling on by itself only for the
# `mp`, `uni` and `external_launcher` executors (vllm/config/vllm.py, VllmConfig.__post_init__; later
# Executor.supports_async_scheduling(), which the compiled-graph RayDistributedExecutor does not override: vLLM PR
# #25887, Sept 2025, "async scheduling ... does not support Ray as a backend"). RL frameworks run an engine of
# several GPUs on Ray (NeMo-RL v0.3-v0.7 and OpenRLHF: distributed_executor_backend="ray" for TP > 1), so those
# engines keep the host work in their step. RayExecutorV2 (vLLM PR #36836, Mar 2026: MessageQueue control plane,
# async scheduling) replaced it as the "ray" default in 0.21 (SkyRL issue #1653: CI run with
# VLLM_USE_RAY_V2_EXECUTOR_BACKEND=1 "prior to vllm 0.21.0", closed on moving to 0.23.0 "where v2 is the
# default"; the release that flipped it is not named there, 0.21 taken).
RAY_ASYNC_SCHEDULING_VERSION = (0, 21)
EXECUTORS = ("mp", "uni", "external_launcher", "ray")
EAGER_LAYER_S = {"vllm": 0.80e-3, "sglang": 0.29e-3, "trtllm": 0.80e-3}
# A weight GEMM of a decode step costs a fixed ~4 us above its bytes' time (onnxruntime issue #32382,
# H100, M=1 GEMV kernels at decode shapes: 6.3-14 us for 1.6-14 MB, 16-62% of the achievable
# bandwidth); four per layer (QKV, O, gate-up, down). A TP shard reads 1/TP of the bytes per kernel
# but pays the same floor, so it reaches less of the bandwidth (llama.cpp issue #28863: splitting a
# batch-1 GEMV over two GPUs drops each card's DRAM utilisation from 66% to 43%).
GEMM_FLOOR_S = 4e-6
GEMMS_PER_LAYER = 4
# An MoE layer's fused expert path (router top-k, token sort and align, two grouped GEMMs, the weighted sum)
# costs a fixed ~28 us a step above its bytes' time, where the dense MLP's two GEMM floors are 8 us: 20 us
# more per MoE layer. From vLLM's fused_moe microbenchmarks under CUDA graphs (benchmark_moe.py, uniform
# routing): Qwen3-30B-A3B shape (128 experts, top 8, 2048 x 768) FP8 on H100, 40.4 us at 1 token (37.7 MB of
# experts) and 237.3 us at 64 (594 MB), both 27-29 us + bytes at 85% of 3.35 TB/s (vLLM PR #24700); Mixtral
# (8 experts, top 2, TP 2) bf16 on H100, 144 us at 1 token for 352 MB (same line: 152); Qwen3-30B-A3B bf16 on an
# A100 PCIe 40GB, 917 us at 64 tokens for 1,188 MB (vLLM PR #19049: the line gives 928).
MOE_LAYER_FLOOR_S = 20e-6
# Layers with more weight GEMMs than the four above pay a floor for each. Multi-head latent attention (DeepSeek-V2/V3,
# Kimi K2) decodes through five instead of QKV and O: the fused down-projection of the query and the latent KV, the
# query's up-projection, the absorbed key and value up-projections (two batched GEMMs per step, vLLM's MLA decode
# path and SGLang's alike) and O: three more. A shared expert (DeepSeek's, Qwen2-MoE's) runs as a dense MLP beside
# the fused routed path: its two GEMMs (gate-up, down) more in each MoE layer. The router's gate projection is one
# more in every MoE layer: the fused path's floor above was measured from router logits given (benchmark_moe.py
# draws them), and at TP 8 it holds (SGLang PR #11730: Qwen3-235B-A22B FP8 on H200, 31.7 us at one token for 19 MB
# of experts, 28 us + bytes at 85% of 4.8 TB/s).
MLA_EXTRA_GEMMS = 3
SHARED_EXPERT_GEMMS = 2
ROUTER_GEMMS = 1
# Small kernels beyond a layer's five (SMALL_KERNEL_S each): per-head RMSNorms of queries and keys (Qwen3, OLMo-2,
# Gemma-3: two launches), latent attention's norms of the compressed query and KV (two).
QK_NORM_KERNELS = 2
MLA_EXTRA_KERNELS = 2
QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe", "olmo2", "gemma3", "gemma3_text")


def extra_decode_gemms(num_layers: int, mla: bool = False, shared_expert_layers: int = 0, moe_layers: int = 0) -> int:
    """Weight GEMMs a decode step runs beyond GEMMS_PER_LAYER a layer (MLA_EXTRA_GEMMS a layer of latent
    attention, SHARED_EXPERT_GEMMS a layer with a shared expert, ROUTER_GEMMS an MoE layer), each paying the GEMM
    floor."""
    return ((MLA_EXTRA_GEMMS * num_layers if mla else 0) + SHARED_EXPERT_GEMMS * shared_expert_layers
            + ROUTER_GEMMS * moe_layers)


def extra_decode_kernels(num_layers: int, mla: bool = False, qk_norm: bool = False) -> int:
    """Small kernels a decode step runs beyond the five of each layer (LAYER_KERNELS_S), SMALL_KERNEL_S each."""
    return num_layers * ((MLA_EXTRA_KERNELS if mla else 0) + (QK_NORM_KERNELS if qk_norm else 0))

Engine = Literal["vllm", "sglang", "trtllm"]
KVDtype = Literal["auto", "fp8"]


class EngineSettings(BaseModel):
    """The generation engine's settings a prediction used (stored with the model in the profile)."""

    model_config = ConfigDict(extra="forbid")
    name: Engine = "vllm"
    memory_fraction: float  # vLLM gpu_memory_utilization, SGLang mem_fraction_static, TRT-LLM free fraction
    max_num_seqs: int  # SGLang max_running_requests, TRT-LLM max_batch_size
    max_num_batched_tokens: int  # the chunked-prefill token budget (SGLang chunked_prefill_size, TRT max_num_tokens)
    max_model_len: Optional[int] = None
    kv_cache_dtype: KVDtype = "auto"
    kv_cache_gib: Optional[float] = None  # measured KV memory per GPU; overrides the rule
    enforce_eager: bool = False
    block_tokens: int = 16
    version: Optional[str] = None  # the engine's version where it changes the step (vLLM before 0.8: V0)
    async_scheduling: Optional[bool] = None  # vLLM: None = its version's default (on from 0.14; "ray" from 0.21)
    executor: Optional[Literal["mp", "uni", "external_launcher", "ray"]] = None  # vLLM distributed_executor_backend
    scheduler_steps: int = 1  # vLLM V0 multi-step scheduling: decode steps per host round
    logprobs: Literal["off", "ids", "text"] = "off"  # per-token log-probs an in-process engine returns (RL rollouts)
    host_factor: float = 1.0  # the host's dispatch time against an x86 H100 host's (calibration.Efficiencies)
    kv_rule: str = ""  # the rule (and source) that sized the KV cache, as printed
    kv_cache_bytes_per_gpu: Optional[float] = None  # what the rule gave on one device


# ---------------------------------------------------------------- bytes


def kv_value_bytes(weight_bytes_per_param: int, kv_cache_dtype: str = "auto") -> int:
    """Bytes per cached K or V value: fp8 (vLLM's fp8, fp8_e4m3, fp8_e5m2) is 1; auto is the model's
    activation dtype, 16 bits for 16-bit and 8-bit weights alike (vLLM --kv-cache-dtype auto), fp32 for
    an fp32 model."""
    return 1 if str(kv_cache_dtype).startswith("fp8") else max(weight_bytes_per_param, ACTIVATION_BYTES)


def profile_activation_bytes(costs: Costs, tokens: int, rows: int, tp: int = 1) -> float:
    """The activation peak of an engine's profiling forward pass on one device: ``tokens`` tokens
    (max_num_batched_tokens) holding the residual and hidden streams and the MLP's gate-up and
    activation outputs, 16-bit, N*(2h + 3*w/TP)*2 bytes (w: the MLP width a token uses, top-k experts
    for MoE), then the sampler on ``rows`` rows of the full vocabulary (gathered on rank 0), 12 bytes a
    logit. Published vLLM peaks (gpu_worker's log): a Mistral-7B LLaVA on H100 at the offline defaults (16,384
    tokens, 1,024 rows) 1.97 GiB (this gives 1.93 GiB); Llama-3.1-8B on A100 1.44 GiB."""
    h, w, v = costs.hidden_size or 0, costs.mlp_width or 0, costs.vocab_size or 0
    return tokens * (2 * h + 3 * w / max(tp, 1)) * ACTIVATION_BYTES + rows * v * SAMPLER_BYTES_PER_LOGIT


def kv_activation_bytes_per_layer(costs: Costs) -> float:
    """A token's keys and values in one layer as 16-bit activations (what collectives that move them carry,
    whatever the KV cache's dtype): k per layer at the model's 16-bit width."""
    return costs.kv_bytes_per_token / costs.num_layers / max(costs.bytes_per_param, 2) * ACTIVATION_BYTES


# ---------------------------------------------------------------- KV rules (bytes per device)


def vllm_kv_bytes(device_bytes: float, utilization: float, weight_bytes: float, activation_bytes: float = 0.0,
                  non_torch: float = 0.0, graph_bytes: float = 0.0) -> float:
    """vLLM (vllm/v1/worker/gpu_worker.py determine_available_memory): gpu_memory_utilization x the
    memory CUDA exposes, minus the weights, the profile run's activation peak, non-torch memory and
    the CUDA graphs' estimate."""
    return utilization * (device_bytes - CUDA_UNEXPOSED_BYTES) - weight_bytes - activation_bytes - non_torch - graph_bytes


def sglang_kv_bytes(device_bytes: float, mem_fraction_static: float, weight_bytes: float,
                    non_torch: float = 0.0) -> float:
    """SGLang (sglang/srt/model_executor/model_runner.py profile_max_num_token): the memory free after
    loading less (1 - mem_fraction_static) of the total, i.e. mem_fraction_static x total minus what is
    loaded; activations and CUDA graphs live in the remainder."""
    return mem_fraction_static * (device_bytes - CUDA_UNEXPOSED_BYTES) - weight_bytes - non_torch


def trtllm_kv_bytes(device_bytes: float, free_fraction: float, weight_bytes: float, activation_bytes: float = 0.0,
                    non_torch: float = 0.0) -> float:
    """TensorRT-LLM (KvCacheConfig.free_gpu_memory_fraction, default 0.9): that fraction of the memory
    still free after the weights and a profiling forward pass at max_num_tokens."""
    return free_fraction * (device_bytes - CUDA_UNEXPOSED_BYTES - weight_bytes - activation_bytes - non_torch)


def kv_tokens_from_bytes(kv_bytes: float, kv_bytes_per_token: float, block_tokens: int = 1) -> int:
    """Whole blocks of KV cache in ``kv_bytes`` (one device's share, k per token on that device)."""
    if kv_bytes <= 0 or kv_bytes_per_token <= 0:
        return 0
    return int(kv_bytes // (kv_bytes_per_token * block_tokens)) * block_tokens


# ---------------------------------------------------------------- admission


# ---------------------------------------------------------------- fixed costs of a decode step


def decode_fixed_s(num_layers: int, step_s: float = GRAPH_STEP_S, gemm_floors: bool = True,
                   moe_layers: int = 0, floor_s: float = GEMM_FLOOR_S, extra_gemms: int = 0,
                   extra_kernels: int = 0) -> float:
    """A decode step's fixed device cost: the step's own (sampling, graph launch), each layer's small kernels
    (LAYER_KERNELS_S) and its weight GEMMs' floors (GEMMS_PER_LAYER x ``floor_s`` per layer, GEMM_FLOOR_S on Hopper;
    the same on a 1/TP shard; ``gemm_floors=False`` when ``step_s`` was measured with the per-layer costs inside),
    and MOE_LAYER_FLOOR_S more for each of ``moe_layers`` MoE layers (the fused expert path's own), and a floor
    for each of ``extra_gemms`` GEMMs beyond the four a layer (:func:`extra_decode_gemms`) and SMALL_KERNEL_S for each
    of ``extra_kernels`` small kernels beyond the five (:func:`extra_decode_kernels`).
    The same in eager mode: eager launches do not add to the device's time but bound the step from below
    (:func:`eager_step_s`)."""
    return step_s + (num_layers * LAYER_KERNELS_S + extra_kernels * SMALL_KERNEL_S
                     + (num_layers * GEMMS_PER_LAYER + extra_gemms) * floor_s + moe_layers * MOE_LAYER_FLOOR_S
                     if gemm_floors else 0.0)


def is_v0(engine: str, version: Optional[str]) -> bool:
    """vLLM before 0.8 (its V0 engine), the version given; a version not given is a current engine. A later
    version that ran V0 (VLLM_USE_V1=0, or a setting V1 lacks, e.g. VLLM_ATTENTION_BACKEND=XFORMERS on vLLM
    0.8, which logs "Falling back to V0") is written with a +v0 suffix: 0.8.4+v0."""
    if engine != "vllm" or not version:
        return False
    return str(version).strip().lower().endswith("+v0") or version_tuple(version)[:2] < V1_DEFAULT_VERSION


def engine_version_step_s(engine: str, version: Optional[str], scheduler_steps: int = 1) -> float:
    """The host time a decode step adds for an engine version: V0_STEP_HOST_S for vLLM before 0.8 (its V0
    engine; over ``scheduler_steps`` with multi-step scheduling), else 0 (vLLM's V1 engine, SGLang and
    TensorRT-LLM as the step's fixed cost holds them)."""
    return V0_STEP_HOST_S / max(scheduler_steps, 1) if is_v0(engine, version) else 0.0


def sync_host_per_seq_s(engine: str, version: Optional[str], async_scheduling: Optional[bool] = None,
                        scheduler_steps: int = 1, tp: int = 1, logprobs: str = "off",
                        executor: Optional[str] = None) -> float:
    """Host time per running sequence a decode step adds: V0_TP_HOST_PER_SEQ_S for vLLM's V0 engine over ``tp`` > 1
    GPUs; SYNC_HOST_PER_SEQ_S for vLLM without async scheduling (given, or :func:`async_scheduling_default`); else 0
    (SGLang's and TensorRT-LLM's overlap schedulers hide it). Where it is paid, an in-process engine's per-token
    ``logprobs`` ("ids" or "text") add LOGPROBS_HOST_RATIO's share."""
    if engine != "vllm":
        return 0.0
    steps = max(scheduler_steps, 1)
    extra = SYNC_HOST_PER_SEQ_S * (LOGPROBS_HOST_RATIO[logprobs] - 1.0) / steps
    if tp > 1 and is_v0(engine, version):
        return V0_TP_HOST_PER_SEQ_S / steps + extra
    if async_scheduling is None:
        async_scheduling = async_scheduling_default(version, executor)
    return 0.0 if async_scheduling else SYNC_HOST_PER_SEQ_S / steps + extra


def async_scheduling_default(version: Optional[str], executor: Optional[str] = None) -> bool:
    """Whether vLLM schedules asynchronously by itself: from 0.14 (ASYNC_SCHEDULING_DEFAULT_VERSION), and on the
    "ray" executor only from 0.21 (RAY_ASYNC_SCHEDULING_VERSION, RayExecutorV2); a version not given is a current
    engine (on)."""
    if not version:
        return True
    v = version_tuple(version)[:2]
    if executor == "ray" and v < RAY_ASYNC_SCHEDULING_VERSION:
        return False
    return v >= ASYNC_SCHEDULING_DEFAULT_VERSION


def version_tuple(version: str) -> tuple[int, ...]:
    """'0.6.3.post1' -> (0, 6, 3): the leading numeric components of a version string."""
    parts = []
    for p in str(version).strip().lstrip("v").split("."):
        digits = p[:len(p) - len(p.lstrip("0123456789"))]  # the leading digits: '2rc1' -> '2'
        if not digits:
            break
        parts.append(int(digits))
        if digits != p:
            break
    if not parts:
        raise ValueError(f"engine version {version!r}: give it as MAJOR.MINOR[.PATCH], e.g. 0.6.3")
    return tuple(parts)


def eager_host_s(num_layers: Optional[int], engine: str = "vllm", enforce_eager: bool = True) -> float:
    """The host's time to launch one eager step's kernels: EAGER_LAYER_S of the engine per layer; 0 with
    CUDA graphs (one graph launch, inside the step's own fixed cost) or without a layer count."""
    if not enforce_eager or not num_layers:
        return 0.0
    return num_layers * EAGER_LAYER_S.get(engine, EAGER_LAYER_S["vllm"])


def eager_step_s(device_s, host_s=0.0):
    """A forward step's time when the host launches its kernels asynchronously: max(host, device).
    The host enqueues while the device runs, so the slower of the two sets the step (with CUDA graphs
    ``host_s`` is 0 and the step is the device's). Floats or arrays (``host_s`` too)."""
    if not np.any(host_s):
        return device_s
    return _out(np.maximum(device_s, host_s))


def eager_host_step_s(launch_s: float, serial_s: float = 0.0, per_seq_s: float = 0.0, seqs=0.0):
    """The host's time for one eager step: its launches (:func:`eager_host_s`) plus the scheduling work it does
    before them, in turn (V0's step host time, ``serial_s``; sync scheduling's ``per_seq_s`` for each of ``seqs``
    running sequences). The device's step holds that work too (as its fixed cost), so with the launches the
    step is max(device, launches + scheduling): the launches cannot start before the scheduling ends. 0
    without launches (CUDA graphs: the device's step holds it all)."""
    if not launch_s:
        return 0.0
    return _out(launch_s + serial_s + per_seq_s * np.asarray(seqs, dtype=float))


# ---------------------------------------------------------------- one engine's KV cache


def engine_kv_bytes(engine: str, costs: Costs, device_costs: Costs, tp: int, device_bytes: float,
                    memory_fraction: float, batched_tokens: int, max_num_seqs: int,
                    enforce_eager: bool = False) -> float:
    """The KV memory one device of an engine allocates by its own rule (``device_costs``: that device's
    TP shard of ``costs``): vLLM with its profile run (``batched_tokens`` tokens, the sampler on
    min(max_num_seqs, batched_tokens) rows), non-torch memory and CUDA graphs (none when eager);
    SGLang; TensorRT-LLM with its profiling forward pass (the logits of a few requests neglected)."""
    weights, other = all_weight_bytes(device_costs), NON_TORCH_BYTES
    if engine == "sglang":
        return sglang_kv_bytes(device_bytes, memory_fraction, weights, other)
    if engine == "trtllm":
        act = profile_activation_bytes(costs, batched_tokens, 0, tp)
        return trtllm_kv_bytes(device_bytes, memory_fraction, weights, act, other)
    act = profile_activation_bytes(costs, batched_tokens, min(max_num_seqs, batched_tokens), tp)
    return vllm_kv_bytes(device_bytes, memory_fraction, weights, act, other, 0.0 if enforce_eager else CUDA_GRAPH_BYTES)


def kv_cache_tokens_of(kv_bytes: float, device_costs: Costs, block_tokens: int = 1) -> int:
    """Tokens the engine's KV cache holds: whole blocks of one device's k in that device's KV memory."""
    return kv_tokens_from_bytes(kv_bytes, device_costs.kv_bytes_per_token, block_tokens)


def sglang_max_running_requests(kv_tokens: int, context_len: int) -> int:
    """SGLang's default cap on running requests (model_runner.init_memory_pool's req_to_token pool):
    min(max(KV tokens / context_len * 512, 2048), 4096)."""
    return min(max(int(kv_tokens / max(context_len, 1) * 512), 2048), 4096)
