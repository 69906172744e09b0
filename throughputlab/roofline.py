"""The throughput model's physics: every step cost, written once (equations: docs/model.md).

Small pure functions of the model constants (:class:`Costs`: W, k, F, a and what MoE needs)
and the rates (t0, BW, PHI). Each takes floats or numpy arrays alike (arrays broadcast; a
scalar in gives a float out), so the fit evaluates a sweep and the rollout simulation
thousands of steps in one call. ``fit``, ``predict``, ``report`` and ``decide`` call these
and derive nothing themselves. Times in seconds, sizes in bytes. No torch, no scipy.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict

from throughputlab.models.spec import ModelSpec

ADAM_BYTES_PER_PARAM = 16  # 16-bit weights and grads, fp32 master copy, two fp32 Adam moments (ZeRO paper: 2+2+12)
VLLM_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of device memory for weights + KV cache


def _out(x):
    """A 0-d result back to a Python float; arrays stay arrays."""
    return float(x) if np.ndim(x) == 0 else x


class Costs(BaseModel):
    """Per-model constants at one dtype (docs/model.md: W, k, F, a), plus what MoE needs for W(c)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    bytes_per_param: int
    weight_bytes: float  # W at one token per step (the active size; the input embedding is a gather)
    kv_bytes_per_token: float  # k
    flops_per_token: float  # F
    attn_flops_per_ctx_token: float  # a
    moe_num_experts: Optional[int] = None
    moe_top_k: Optional[int] = None
    moe_layers: int = 0
    moe_expert_bytes: float = 0.0  # one expert in one layer
    total_weight_bytes: Optional[float] = None  # every parameter (all experts, input embedding); None: not recorded
    hidden_size: Optional[int] = None  # for the tensor-parallel all-reduces (None in fits stored before them)
    num_layers: Optional[int] = None
    num_kv_heads: Optional[int] = None

    @classmethod
    def from_spec(cls, spec: ModelSpec, bytes_per_param: int) -> "Costs":
        moe = spec.moe
        return cls(
            bytes_per_param=bytes_per_param,
            weight_bytes=spec.weight_bytes_per_step(bytes_per_param, 1),
            kv_bytes_per_token=spec.kv_bytes_per_token(bytes_per_param),
            flops_per_token=spec.flops_per_token,
            attn_flops_per_ctx_token=spec.attn_flops_per_ctx_token,
            moe_num_experts=moe.num_experts if moe else None,
            moe_top_k=moe.top_k if moe else None,
            moe_layers=moe.moe_layers if moe else 0,
            moe_expert_bytes=float(moe.expert_params * bytes_per_param) if moe else 0.0,
            total_weight_bytes=float(spec.params_total * bytes_per_param),
            hidden_size=spec.hidden_size, num_layers=spec.num_layers, num_kv_heads=spec.num_kv_heads,
        )

    def weight_bytes_for(self, tokens):
        """W(c): see :func:`weight_bytes`."""
        return weight_bytes(self, tokens)


# ---------------------------------------------------------------- bytes and FLOPs


def weight_bytes(costs: Costs, tokens):
    """W(c): weight bytes one step reads when it processes ``tokens`` tokens. MoE: the shared
    weights plus the experts touched, E*(1 - (1 - k/E)^c) per layer (uniform routing)."""
    tokens = np.asarray(tokens, dtype=float)
    if not costs.moe_num_experts:
        return _out(np.full_like(tokens, costs.weight_bytes))
    e, k = costs.moe_num_experts, costs.moe_top_k or 1
    touched = e * (1.0 - (1.0 - k / e) ** tokens)
    w = costs.weight_bytes + costs.moe_layers * (touched - k) * costs.moe_expert_bytes
    return _out(np.where(tokens <= 1, costs.weight_bytes, w))


def all_weight_bytes(costs: Costs) -> float:
    """Every weight (all experts, an untied input embedding): what a weight sync moves and the
    optimizer updates; without a recorded total, W plus the experts no token touches."""
    if costs.total_weight_bytes is not None:
        return costs.total_weight_bytes
    k = costs.moe_top_k or 1
    return costs.weight_bytes + costs.moe_layers * ((costs.moe_num_experts or k) - k) * costs.moe_expert_bytes


def mean_context(prompt_len, output_len):
    """Mean context over a static batch's decode steps: p + o/2."""
    return _out(prompt_len + np.asarray(output_len, dtype=float) / 2)


def decode_bytes(costs: Costs, c, s):
    """Bytes one decode step of c sequences at mean context s reads: W(c) + c*s*k."""
    return weight_bytes(costs, c) + c * s * costs.kv_bytes_per_token


def decode_flops(costs: Costs, c, s):
    """FLOPs of one decode step: c*(F + s*a) (2 per weight per token; QK^T and AV over s tokens)."""
    return c * (costs.flops_per_token + s * costs.attn_flops_per_ctx_token)


def prefill_bytes(costs: Costs, c, p):
    """Bytes a prefill of c prompts of p tokens reads: W(c*p), the weights once (attention within
    the prompt stays on chip; the KV write is not counted, as in the prefill step time)."""
    return weight_bytes(costs, c * p)


def prefill_flops(costs: Costs, c, p):
    """FLOPs of a prefill of c prompts of p tokens: c*p*(F + p*a/2) (causal: half the attention)."""
    return c * p * (costs.flops_per_token + p * costs.attn_flops_per_ctx_token / 2)


def train_flops(costs: Costs, b, seq_len, recompute: bool = False):
    """Forward + backward of b sequences of S tokens ~ 3x the forward, 3*b*S*(F + S*a/2)
    (Kaplan et al. 2020; nanoGPT's estimate_mfu); activation checkpointing runs the forward
    again in the backward: 4x (Chen et al. 2016)."""
    return (4.0 if recompute else 3.0) * prefill_flops(costs, b, seq_len)


# ---------------------------------------------------------------- memory time against compute time


def combine(mem, comp, p: Optional[float] = None):
    """The step's roofline time from its memory and compute times: max(mem, comp), or the smooth
    maximum (mem^p + comp^p)^(1/p) when p is fitted (p = 1: the two add, no overlap)."""
    if p is None:
        return _out(np.maximum(mem, comp))
    m = np.maximum(mem, comp)
    safe = np.where(m > 0, m, 1.0)
    r = m * ((np.asarray(mem) / safe) ** p + (np.asarray(comp) / safe) ** p) ** (1.0 / p)
    return _out(np.where(m > 0, r, m))


# ---------------------------------------------------------------- step times


def decode_step_s(c, s, costs: Costs, t0: float, bw: float, phi: float, p: Optional[float] = None,
                  t_seq: float = 0.0, bw_attn: Optional[float] = None):
    """t_dec(c, s) = t0 + c*t_seq + max((W(c) + c*s*k)/BW, c*(F + s*a)/PHI)  (Williams et al. 2009's
    roofline per step; t_seq: a per-sequence cost near neither roof, fitted only with an overhead probe).
    ``bw_attn`` (per-kernel form): GEMMs and attention on their own rooflines, in sequence:
    t0 + c*t_seq + max(W(c)/BW, c*F/PHI) + attention_s(c*s)."""
    if bw_attn is None:
        return _out(t0 + c * t_seq + combine(decode_bytes(costs, c, s) / bw, decode_flops(costs, c, s) / phi, p))
    gemm = combine(weight_bytes(costs, c) / bw, c * costs.flops_per_token / phi, p)
    return _out(t0 + c * t_seq + gemm + attention_s(costs, c * s, bw_attn, phi))


def attention_s(costs: Costs, ctx, bw_attn: float, phi: float):
    """The decode attention over ``ctx`` context tokens summed over the sequences, as its own kernel:
    max(ctx*k/BW_attn, ctx*a/PHI) (FlashDecoding-style kernels read each sequence's KV once)."""
    return _out(np.maximum(ctx * costs.kv_bytes_per_token / bw_attn, ctx * costs.attn_flops_per_ctx_token / phi))


def prefill_tokens_s(q1, q2, costs: Costs, t0: float, bw: float, phi: float, p: Optional[float] = None):
    """A prefill-only step over prompts whose lengths sum to q1 and whose squares sum to q2:
    t0 + max(W(q1)/BW, (q1*F + q2*a/2)/PHI)."""
    comp = (q1 * costs.flops_per_token + q2 * costs.attn_flops_per_ctx_token / 2) / phi
    return _out(t0 + combine(weight_bytes(costs, q1) / bw, comp, p))


def prefill_s(c, prompt_len, costs: Costs, t0: float, bw: float, phi: float, p: Optional[float] = None):
    """Prefill of c prompts of p tokens: t0 + max(W(c*p)/BW, c*p*(F + p*a/2)/PHI)."""
    return prefill_tokens_s(c * prompt_len, c * prompt_len * prompt_len, costs, t0, bw, phi, p)


def mixed_step_s(costs: Costs, dec, ctx, q1, q2, t0: float, bw: float, phi: float, phi_prefill: float,
                 p: Optional[float] = None, t_seq: float = 0.0, bw_attn: Optional[float] = None):
    """A continuous-batching step: ``dec`` decodes of summed context ``ctx`` and q1 prefill tokens (q2:
    their squares summed per prompt); weights and KV read once, prefill FLOPs at the prefill's rate.
    q1 = 0: :func:`decode_step_s` at s = ctx/dec; ``bw_attn``: attention as its own kernel."""
    pre = (q1 * costs.flops_per_token + q2 * costs.attn_flops_per_ctx_token / 2) / phi_prefill
    if bw_attn is None:
        mem = weight_bytes(costs, dec + q1) + ctx * costs.kv_bytes_per_token
        comp = (dec * costs.flops_per_token + ctx * costs.attn_flops_per_ctx_token) / phi + pre
        return _out(t0 + dec * t_seq + combine(mem / bw, comp, p))
    gemm = combine(weight_bytes(costs, dec + q1) / bw, dec * costs.flops_per_token / phi + pre, p)
    return _out(t0 + dec * t_seq + gemm + attention_s(costs, ctx, bw_attn, phi))


def static_batch_s(prefill_time, decode_step_time, output_len, overhead_s: float = 0.0):
    """One static batch: overhead, prefill, then output_len - 1 decode steps (prefill emits one)."""
    return overhead_s + prefill_time + np.maximum(np.asarray(output_len) - 1, 0) * decode_step_time


def train_step_s(b, seq_len, costs: Costs, t0: float, phi_train: float, recompute: bool = False,
                 phi_attn: Optional[float] = None, passes: float = 3.0):
    """Training micro-step: t0 + 3*b*S*(F + S*a/2)/PHI_train (forward + backward ~ 3x forward; 4x
    with activation checkpointing). ``phi_attn``: the causal attention, 3*b*S*S*a/2, at a rate of
    its own: t0 + 3*b*S*F/PHI_train + 3*b*S*S*a/2/PHI_attn. ``passes`` = 1: a forward pass alone."""
    n = (passes + recompute) / 3.0
    attn = 0.0 if phi_attn is None else n * train_flops(costs.model_copy(update={"flops_per_token": 0.0}), b, seq_len)
    return _out(t0 + (n * train_flops(costs, b, seq_len) - attn) / phi_train + (attn / phi_attn if phi_attn else 0.0))


def forward_pass_s(b, seq_len, costs: Costs, t0: float, phi_train: float, phi_attn: Optional[float] = None):
    """A forward pass only (log-probs, values): a third of the micro-step's compute."""
    return train_step_s(b, seq_len, costs, t0, phi_train, phi_attn=phi_attn, passes=1.0)


def transfer_s(nbytes: float, bytes_per_s: float, latency_s: float = 0.0) -> float:
    """Moving ``nbytes`` over a link of ``bytes_per_s``: latency + bytes/rate."""
    return latency_s + nbytes / bytes_per_s


def device_copy_s(nbytes: float, bw: float, latency_s: float = 0.0) -> float:
    """Copying ``nbytes`` within one device's memory: it reads and writes every byte, at BW/2."""
    return transfer_s(nbytes, bw / 2.0, latency_s)


# ---------------------------------------------------------------- knees


def knee_concurrency(costs: Costs, s: float, bw: float, phi: float) -> Optional[float]:
    """Dense closed form c* = W / ((F + s*a)*BW/PHI - s*k); None when decode stays memory-bound
    at every concurrency (KV reads grow as fast as the arithmetic)."""
    denom = (costs.flops_per_token + s * costs.attn_flops_per_ctx_token) * bw / phi - s * costs.kv_bytes_per_token
    if denom <= 0:
        return None
    return costs.weight_bytes / denom


def knee_concurrency_numeric(costs: Costs, s: float, bw: float, phi: float, c_max: float = 1e7) -> Optional[float]:
    """Where the memory and compute terms of t_dec cross, by bisection (MoE: W grows with c)."""
    return first_crossing(lambda c: decode_flops(costs, c, s) / phi - decode_bytes(costs, c, s) / bw, 1e-6, c_max)


def knee(costs: Costs, s: float, bw: float, phi: float) -> Optional[float]:
    """The decode knee at context s: closed form for dense models, numeric for MoE."""
    if costs.moe_num_experts:
        return knee_concurrency_numeric(costs, s, bw, phi)
    return knee_concurrency(costs, s, bw, phi)


def short_context_knee(costs: Costs, bw: float, phi: float) -> Optional[float]:
    """The knee as the context goes to 0. Dense: (PHI/BW)*(W/F); MoE: numeric, since the bytes
    grow with the experts the batch touches (one token's weights would put it 10x too low)."""
    return knee(costs, 0.0, bw, phi)


def generation_knee(costs: Costs, prompt_len: float, output_len: int, bw: float, phi: float,
                    phi_prefill: float) -> Optional[float]:
    """Where a whole static batch turns compute-bound: the memory time of its prefill and decode
    steps equals their compute time, prefill FLOPs included (a long prompt moves the bend of the
    tokens/s curve below the decode knee)."""
    s = mean_context(prompt_len, output_len)
    steps = max(output_len - 1, 0)

    def gap(c: float) -> float:
        mem = (steps * decode_bytes(costs, c, s) + prefill_bytes(costs, c, prompt_len)) / bw
        comp = steps * decode_flops(costs, c, s) / phi + prefill_flops(costs, c, prompt_len) / phi_prefill
        return comp - mem

    return first_crossing(gap, 1e-3, 1e8)


def first_crossing(gap: Callable[[float], float], lo: float, hi: float) -> Optional[float]:
    """Where an increasing ``gap(c)`` (compute minus memory time) turns positive, by bisection in
    log c; None when it never does below ``hi``."""
    if gap(hi) <= 0:
        return None
    if gap(lo) >= 0:
        return lo
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if gap(mid) > 0 else (mid, hi)
    return math.sqrt(lo * hi)


def decode_ceiling_tokens_per_s(costs: Costs, s, phi: float, t_seq: float = 0.0):
    """The compute ceiling of decode tokens/s at large concurrency: each sequence costs its FLOPs
    plus the per-sequence cost, 1/((F + s*a)/PHI + t_seq)."""
    return _out(1.0 / (decode_flops(costs, 1.0, s) / phi + t_seq))


def single_stream_bound(costs: Costs, peak_bw: float) -> float:
    """Upper bound of one sequence's decode tokens/s: peak bandwidth over the weight bytes per token."""
    return peak_bw / costs.weight_bytes


# ---------------------------------------------------------------- memory


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


def kv_cache_tokens(costs: Costs, device_bytes: float, utilization: float = VLLM_GPU_MEMORY_UTILIZATION) -> int:
    """KV-cache tokens an engine holds: its share of device memory minus every weight, over k."""
    free = utilization * device_bytes - all_weight_bytes(costs)
    return int(free / costs.kv_bytes_per_token) if free > 0 else 0


def training_state_bytes(costs: Costs) -> float:
    """Weights, gradients and Adam states of mixed-precision training, 16 bytes per parameter."""
    return ADAM_BYTES_PER_PARAM * all_weight_bytes(costs) / costs.bytes_per_param


def activation_bytes_per_sequence(spec: ModelSpec, seq_len: int, bytes_per_param: int,
                                  checkpointing: bool = False) -> float:
    """Activations kept for backward per sequence: 34*S*h per layer at 16 bits with flash attention
    (Korthikanti et al. 2022, table 2, without the s^2 term), plus fp32 logits and their gradient.
    With activation checkpointing per block: each block's input (S*h values) and one block's
    activations while it is recomputed (Korthikanti et al. 2022, section 4, full recomputation)."""
    block = seq_len * spec.hidden_size * 34 * bytes_per_param / 2
    logits = seq_len * spec.vocab_size * 8
    if checkpointing:
        return spec.num_layers * seq_len * spec.hidden_size * bytes_per_param + block + logits
    return spec.num_layers * block + logits


# ---------------------------------------------------------------- many devices


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


def tp_comm_s(costs: Costs, tokens, tp: int, busbw: float, alpha_s: float):
    """Two all-reduces per layer of tokens*hidden*bytes (attention output and MLP output, Megatron)."""
    if tp <= 1 or not costs.num_layers or not costs.hidden_size:
        return _out(np.zeros_like(np.asarray(tokens, dtype=float)))
    m = np.asarray(tokens, dtype=float) * costs.hidden_size * costs.bytes_per_param
    return _out(2 * costs.num_layers * allreduce_s(m, tp, busbw, alpha_s))


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
    """A step whose communication overlaps its compute: compute + the share of comm not hidden."""
    return _out(compute_s + (1.0 - hidden_share) * np.asarray(comm_s, dtype=float))


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
