"""The model constants (Costs) and the step times of one device: bytes, FLOPs, rooflines, knees."""

from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np
from pydantic import BaseModel, ConfigDict

from throughputlab.models.spec import ModelSpec, experts_touched

ADAM_BYTES_PER_PARAM = 16  # 16-bit weights and grads, fp32 master copy, two fp32 Adam moments (ZeRO paper: 2+2+12)
VLLM_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default gpu_memory_utilization (vllm/config/cache.py)


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
    total_params: Optional[float] = None  # every parameter, counted (None in costs stored before it)
    hidden_size: Optional[int] = None  # for the tensor-parallel all-reduces (None in fits stored before them)
    num_layers: Optional[int] = None
    num_kv_heads: Optional[int] = None
    mlp_width: Optional[float] = None  # MLP intermediate width one token uses (top-k experts' for MoE)
    vocab_size: Optional[int] = None

    @classmethod
    def from_spec(cls, spec: ModelSpec, bytes_per_param: int, kv_value_bytes: Optional[int] = None) -> "Costs":
        """The constants at ``bytes_per_param``; ``kv_value_bytes``: bytes per cached K/V value (default:
        16-bit activations for 8-bit weights, vLLM's --kv-cache-dtype auto). 8-bit weights keep the
        input embedding and the LM head at 16 bits (vLLM's Fp8Config quantizes linear layers only;
        ModelOpt and llm-compressor FP8 checkpoints leave lm_head unquantized), and so do the linear layers a
        quantized checkpoint's own config leaves unquantized (``spec.params_16bit_*``, models/quant.py)."""
        moe = spec.moe
        kv = kv_value_bytes if kv_value_bytes is not None else max(bytes_per_param, 2)
        wide = 2 - bytes_per_param if bytes_per_param < 2 else 0  # extra bytes of the 16-bit embedding/head
        head = (spec.params_lm_head + spec.params_16bit_active) * wide
        extra_total = (spec.params_embedding + spec.params_16bit_total) * wide \
            + (0 if spec.tie_word_embeddings else spec.params_lm_head * wide)
        width = float(spec.intermediate_size)
        if moe:
            width = (moe.top_k * moe.expert_params + moe.shared_expert_params) / (3 * spec.hidden_size)
        return cls(
            bytes_per_param=bytes_per_param,
            weight_bytes=spec.weight_bytes_per_step(bytes_per_param, 1) + head,
            kv_bytes_per_token=spec.kv_bytes_per_token(kv),
            flops_per_token=spec.flops_per_token,
            attn_flops_per_ctx_token=spec.attn_flops_per_ctx_token,
            moe_num_experts=moe.num_experts if moe else None,
            moe_top_k=moe.top_k if moe else None,
            moe_layers=moe.moe_layers if moe else 0,
            moe_expert_bytes=float(moe.expert_params * bytes_per_param) if moe else 0.0,
            total_weight_bytes=float(spec.params_total * bytes_per_param + extra_total),
            total_params=float(spec.params_total),
            hidden_size=spec.hidden_size, num_layers=spec.num_layers, num_kv_heads=spec.num_kv_heads,
            mlp_width=width, vocab_size=spec.vocab_size,
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
    k = costs.moe_top_k or 1
    touched = experts_touched(costs.moe_num_experts, k, tokens)
    w = costs.weight_bytes + costs.moe_layers * (touched - k) * costs.moe_expert_bytes
    return _out(np.where(tokens <= 1, costs.weight_bytes, w))


def sync_weight_bytes(costs: Costs) -> float:
    """What a weight sync moves from the trainer: every weight at the trainer's 16 bits whatever the engine's
    dtype. An 8-bit engine quantizes the weights as it loads them (NeMo-RL's FP8 refit: the vLLM worker's
    load_weights casts each incoming bf16 tensor, nemo_rl/models/generation/fp8.py at v0.5.0; vLLM's online
    fp8 likewise), so 8-bit costs count 2 bytes a parameter; 16 and 32 bits as they are."""
    if costs.bytes_per_param >= 2:
        return all_weight_bytes(costs)
    params = costs.total_params if costs.total_params is not None else all_weight_bytes(costs) / costs.bytes_per_param
    return 2.0 * params


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


CHECKPOINTING_MODES = ("none", "selective", "full")


def checkpointing_mode(recompute) -> str:
    """none|selective|full from a mode or the older on/off (True: full, False/None: none)."""
    if recompute is True:
        return "full"
    if recompute is False or recompute is None:
        return "none"
    if recompute not in CHECKPOINTING_MODES:
        raise ValueError(f"activation checkpointing {recompute!r}: use one of {', '.join(CHECKPOINTING_MODES)}")
    return recompute


def recompute_passes(recompute) -> tuple[float, float]:
    """Forwards recomputed in the backward, (of the dense FLOPs F, of the attention core S*a/2):
    none (0, 0); full, each block's forward again (1, 1; Chen et al. 2016); selective, the attention
    core alone (QK^T, softmax, scores x V) again (0, 1): Korthikanti et al. 2022, section 4.2, whose
    selective recompute adds 2.7% (GPT-3 175B) to 1.6% (530B) FLOPs; Llama 3 8B at S 8192 ~4%."""
    return {"none": (0.0, 0.0), "selective": (0.0, 1.0), "full": (1.0, 1.0)}[checkpointing_mode(recompute)]


def train_flops(costs: Costs, b, seq_len, recompute=False):
    """Forward + backward of b sequences of S tokens ~ 3x the forward, 3*b*S*(F + S*a/2)
    (Kaplan et al. 2020; nanoGPT's estimate_mfu), plus the forward FLOPs checkpointing recomputes
    (``recompute``: none|selective|full or on/off, :func:`recompute_passes`): full 4x."""
    dense, attn = recompute_passes(recompute)
    a = np.asarray(seq_len, dtype=float) * costs.attn_flops_per_ctx_token / 2
    return _out(np.asarray(b, dtype=float) * seq_len * ((3.0 + dense) * costs.flops_per_token + (3.0 + attn) * a))


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
                  t_seq: float = 0.0, bw_attn: Optional[float] = None, bw_mem: Optional[float] = None):
    """t_dec(c, s) = t0 + c*t_seq + max(W(c)/BW + c*s*k/BW_kv, c*(F + s*a)/PHI)  (Williams et al. 2009's
    roofline per step; t_seq: a per-sequence cost near neither roof, fitted only with an overhead probe;
    BW_kv: :func:`kv_read_rate`, BW unless ``bw_mem`` is lower).
    ``bw_attn`` (per-kernel form): GEMMs and attention on their own rooflines, in sequence:
    t0 + c*t_seq + max(W(c)/BW, c*F/PHI) + attention_s(c*s)."""
    if bw_attn is None:
        return _out(t0 + c * t_seq + combine(decode_mem_s(costs, c, s, bw, bw_mem), decode_flops(costs, c, s) / phi, p))
    gemm = combine(weight_bytes(costs, c) / bw, c * costs.flops_per_token / phi, p)
    return _out(t0 + c * t_seq + gemm + attention_s(costs, c * s, kv_read_rate(bw, bw_attn, bw_mem), phi))


def attention_s(costs: Costs, ctx, bw_attn: float, phi: float):
    """The decode attention over ``ctx`` context tokens summed over the sequences, as its own kernel:
    max(ctx*k/BW_attn, ctx*a/PHI) (FlashDecoding-style kernels read each sequence's KV once)."""
    return _out(np.maximum(ctx * costs.kv_bytes_per_token / bw_attn, ctx * costs.attn_flops_per_ctx_token / phi))


def kv_read_rate(bw: float, bw_attn: Optional[float] = None, bw_mem: Optional[float] = None) -> float:
    """The rate a decode step reads the KV cache at: the attention's own bandwidth (per-kernel form),
    else BW, but never above ``bw_mem``, the memory's measured read bandwidth. Each step streams
    the batch's KV cache from memory, so a fitted rate above that (t0 and W/BW not separately
    identified, or caches small enough to stay in the last-level cache) does not carry over to
    long contexts."""
    rate = bw_attn or bw
    return min(rate, bw_mem) if bw_mem else rate


def decode_mem_s(costs: Costs, c, s, bw: float, bw_mem: Optional[float] = None):
    """The memory time of a decode step: W(c)/BW + c*s*k/BW_kv, BW_kv = :func:`kv_read_rate` (without
    ``bw_mem``: decode_bytes/BW)."""
    return _out(weight_bytes(costs, c) / bw + c * s * costs.kv_bytes_per_token / kv_read_rate(bw, None, bw_mem))


def kv_at_bw(costs: Costs, bw: float, bw_mem: Optional[float]) -> Costs:
    """Costs whose KV bytes, read at BW, take as long as the real ones at :func:`kv_read_rate`: how
    the knees see KV reads slower than the weights'."""
    rate = kv_read_rate(bw, None, bw_mem)
    return costs if rate >= bw else costs.model_copy(update={"kv_bytes_per_token": costs.kv_bytes_per_token * bw / rate})


def prefill_tokens_s(q1, q2, costs: Costs, t0: float, bw: float, phi: float, p: Optional[float] = None):
    """A prefill-only step over prompts whose lengths sum to q1 and whose squares sum to q2:
    t0 + max(W(q1)/BW, (q1*F + q2*a/2)/PHI)."""
    comp = (q1 * costs.flops_per_token + q2 * costs.attn_flops_per_ctx_token / 2) / phi
    return _out(t0 + combine(weight_bytes(costs, q1) / bw, comp, p))


def prefill_chunks(tokens, budget: Optional[int] = None):
    """Steps a prefill of ``tokens`` prompt tokens takes under a chunked-prefill token budget (vLLM
    max_num_batched_tokens, SGLang chunked_prefill_size, TRT-LLM max_num_tokens): ceil(tokens/budget),
    each reading the weights once; 1 without a budget."""
    if not budget:
        return _out(np.ones_like(np.asarray(tokens, dtype=float)))
    return _out(np.maximum(np.ceil(np.asarray(tokens, dtype=float) / budget), 1.0))


def prefill_s(c, prompt_len, costs: Costs, t0: float, bw: float, phi: float, p: Optional[float] = None):
    """Prefill of c prompts of p tokens: t0 + max(W(c*p)/BW, c*p*(F + p*a/2)/PHI)."""
    return prefill_tokens_s(c * prompt_len, c * prompt_len * prompt_len, costs, t0, bw, phi, p)


def mixed_step_s(costs: Costs, dec, ctx, q1, q2, t0: float, bw: float, phi: float, phi_prefill: float,
                 p: Optional[float] = None, t_seq: float = 0.0, bw_attn: Optional[float] = None,
                 bw_mem: Optional[float] = None):
    """A continuous-batching step: ``dec`` decodes of summed context ``ctx`` and q1 prefill tokens (q2:
    their squares summed per prompt); weights and KV read once, prefill FLOPs at the prefill's rate.
    q1 = 0: :func:`decode_step_s` at s = ctx/dec; ``bw_attn``: attention as its own kernel."""
    pre = (q1 * costs.flops_per_token + q2 * costs.attn_flops_per_ctx_token / 2) / phi_prefill
    rate = kv_read_rate(bw, bw_attn, bw_mem)
    if bw_attn is None:
        mem = weight_bytes(costs, dec + q1) / bw + ctx * costs.kv_bytes_per_token / rate
        comp = (dec * costs.flops_per_token + ctx * costs.attn_flops_per_ctx_token) / phi + pre
        return _out(t0 + dec * t_seq + combine(mem, comp, p))
    gemm = combine(weight_bytes(costs, dec + q1) / bw, dec * costs.flops_per_token / phi + pre, p)
    return _out(t0 + dec * t_seq + gemm + attention_s(costs, ctx, rate, phi))


def static_batch_s(prefill_time, decode_step_time, output_len, overhead_s: float = 0.0):
    """One static batch: overhead, prefill, then output_len - 1 decode steps (prefill emits one)."""
    return overhead_s + prefill_time + np.maximum(np.asarray(output_len) - 1, 0) * decode_step_time


def served_tpot_s(decode_step_time, per_prompt_s, running, output_len):
    """Mean time between one request's tokens while ``running`` requests are served without pause (a
    fixed-concurrency benchmark's TPOT, (latency - TTFT) / (output - 1): vLLM's and SGLang's bench_serve,
    GuideLLM's inter-token latency). In one request's life each other running slot finishes its request and
    starts the next once, so its output_len - 1 decode steps also carry running - 1 prompts' prefills,
    ``per_prompt_s`` each (what a prompt adds to the steps it rides in, or its own step where the engine
    does not mix prefill into decode steps): decode + (running - 1) * per_prompt / (output_len - 1)."""
    others = np.maximum(np.asarray(running, dtype=float) - 1, 0)
    steps = np.maximum(np.asarray(output_len, dtype=float) - 1, 1)
    return _out(decode_step_time + others * per_prompt_s / steps)


def train_step_s(b, seq_len, costs: Costs, t0: float, phi_train: float, recompute=False,
                 phi_attn: Optional[float] = None, passes: float = 3.0):
    """Training micro-step: t0 + 3*b*S*(F + S*a/2)/PHI_train (forward + backward ~ 3x forward), plus
    what checkpointing recomputes (``recompute``: none|selective|full, :func:`recompute_passes`).
    ``phi_attn``: the causal attention, b*S*S*a/2 per pass, at a rate of its own:
    t0 + 3*b*S*F/PHI_train + 3*b*S*S*a/2/PHI_attn. ``passes`` = 1: a forward pass alone."""
    dense, attn_r = recompute_passes(recompute)
    tokens = np.asarray(b, dtype=float) * seq_len
    attn = (passes + attn_r) * tokens * np.asarray(seq_len, dtype=float) * costs.attn_flops_per_ctx_token / 2
    return _out(t0 + (passes + dense) * tokens * costs.flops_per_token / phi_train + attn / (phi_attn or phi_train))


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


def knee(costs: Costs, s: float, bw: float, phi: float, bw_mem: Optional[float] = None) -> Optional[float]:
    """The decode knee at context s: closed form for dense models, numeric for MoE (``bw_mem``: the
    KV reads' ceiling, :func:`kv_read_rate`)."""
    costs = kv_at_bw(costs, bw, bw_mem)
    if costs.moe_num_experts:
        return knee_concurrency_numeric(costs, s, bw, phi)
    return knee_concurrency(costs, s, bw, phi)


def short_context_knee(costs: Costs, bw: float, phi: float) -> Optional[float]:
    """The knee as the context goes to 0. Dense: (PHI/BW)*(W/F); MoE: numeric, since the bytes
    grow with the experts the batch touches (one token's weights would put it 10x too low)."""
    return knee(costs, 0.0, bw, phi)


def generation_knee(costs: Costs, prompt_len: float, output_len: int, bw: float, phi: float,
                    phi_prefill: float, bw_mem: Optional[float] = None) -> Optional[float]:
    """Where a whole static batch turns compute-bound: the memory time of its prefill and decode
    steps equals their compute time, prefill FLOPs included (a long prompt moves the bend of the
    tokens/s curve below the decode knee)."""
    s = mean_context(prompt_len, output_len)
    steps = max(output_len - 1, 0)
    costs = kv_at_bw(costs, bw, bw_mem)

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
