"""The throughput model of DESIGN.md as small pure functions, and the fitted-parameter object.

No torch, no measurement: ``fit`` estimates the parameters, ``predict`` fills them from a
datasheet, ``decide`` and ``report`` evaluate them. Times in seconds, sizes in bytes.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict

from throughputlab.models.spec import ModelSpec


class Costs(BaseModel):
    """Per-model constants at one dtype (DESIGN.md: W, k, F, a), plus what MoE needs for W(c)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    bytes_per_param: int
    weight_bytes: float  # W at one token per step (the active size)
    kv_bytes_per_token: float  # k
    flops_per_token: float  # F
    attn_flops_per_ctx_token: float  # a
    moe_num_experts: Optional[int] = None
    moe_top_k: Optional[int] = None
    moe_layers: int = 0
    moe_expert_bytes: float = 0.0  # one expert in one layer

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
        )

    def weight_bytes_for(self, tokens: float) -> float:
        """W(c): bytes of weights one step reads when it processes ``tokens`` tokens (MoE: experts touched)."""
        if not self.moe_num_experts or tokens <= 1:
            return self.weight_bytes
        e, k = self.moe_num_experts, self.moe_top_k or 1
        touched = e * (1.0 - (1.0 - k / e) ** tokens)  # uniform routing, DESIGN.md
        return self.weight_bytes + self.moe_layers * (touched - k) * self.moe_expert_bytes


def smooth_max(x: float, y: float, p: float) -> float:
    """(x^p + y^p)^(1/p): tends to max(x, y) as p grows; p is fitted when the smooth form is chosen."""
    if x <= 0 or y <= 0:
        return max(x, y)
    m = max(x, y)
    return m * ((x / m) ** p + (y / m) ** p) ** (1.0 / p)


def _combine(mem: float, comp: float, p: Optional[float]) -> float:
    return max(mem, comp) if p is None else smooth_max(mem, comp, p)


def decode_step_s(c: float, s: float, costs: Costs, t0: float, bw: float, phi: float,
                  p: Optional[float] = None, t_seq: float = 0.0) -> float:
    """t_dec(c, s) = t0 + c*t_seq + max((W(c) + c*s*k)/BW, c*(F + s*a)/PHI)  (DESIGN.md, decode step).

    ``t_seq`` is a per-sequence cost outside the roofline terms (attention and sampling kernels
    far from either roof, per-sequence bookkeeping). It is zero unless an overhead probe measured it.
    """
    mem = (costs.weight_bytes_for(c) + c * s * costs.kv_bytes_per_token) / bw
    comp = c * (costs.flops_per_token + s * costs.attn_flops_per_ctx_token) / phi
    return t0 + c * t_seq + _combine(mem, comp, p)


def prefill_s(c: float, prompt_len: float, costs: Costs, t0: float, bw: float, phi: float,
              p: Optional[float] = None) -> float:
    """Prefill of c prompts of p tokens: t0 + max(W/BW, c*p*(F + p*a/2)/PHI)  (DESIGN.md)."""
    mem = costs.weight_bytes_for(c * prompt_len) / bw
    comp = c * prompt_len * (costs.flops_per_token + prompt_len * costs.attn_flops_per_ctx_token / 2) / phi
    return t0 + _combine(mem, comp, p)


def train_step_s(b: float, seq_len: float, costs: Costs, t0: float, phi_train: float) -> float:
    """Training micro-step: t0 + 3*b*S*(F + S*a/2)/PHI_train (forward + backward ~ 3x forward)."""
    return t0 + 3.0 * b * seq_len * (costs.flops_per_token + seq_len * costs.attn_flops_per_ctx_token / 2) / phi_train


def knee_concurrency(costs: Costs, s: float, bw: float, phi: float) -> Optional[float]:
    """c* = W / ((F + s*a)*BW/PHI - s*k); None when decode stays memory-bound at every concurrency.

    Dense form (W fixed). For MoE use :func:`knee_concurrency_numeric`, since W grows with c.
    """
    denom = (costs.flops_per_token + s * costs.attn_flops_per_ctx_token) * bw / phi - s * costs.kv_bytes_per_token
    if denom <= 0:
        return None
    return costs.weight_bytes / denom


def knee_concurrency_numeric(costs: Costs, s: float, bw: float, phi: float, c_max: float = 1e7) -> Optional[float]:
    """Where the memory and compute terms of t_dec cross, by bisection (handles W(c) of MoE)."""
    def gap(c: float) -> float:
        mem = (costs.weight_bytes_for(c) + c * s * costs.kv_bytes_per_token) / bw
        comp = c * (costs.flops_per_token + s * costs.attn_flops_per_ctx_token) / phi
        return comp - mem

    return first_crossing(gap, 1e-6, c_max)


def first_crossing(gap, lo: float, hi: float) -> Optional[float]:
    """Where an increasing ``gap(c)`` (compute time minus memory time) turns positive, by
    bisection in log c; None when it never does below ``hi``."""
    if gap(hi) <= 0:
        return None
    if gap(lo) >= 0:
        return lo
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if gap(mid) > 0 else (mid, hi)
    return math.sqrt(lo * hi)


# ---------------------------------------------------------------- fitted parameters


class DecodeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    t0_s: float
    bw_bytes_per_s: float
    phi_flops_per_s: float
    smooth_p: Optional[float] = None  # None: the hard max form
    t_seq_s: float = 0.0  # per-sequence cost per step, fitted only with an overhead probe


class PrefillParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    t0_s: float
    bw_bytes_per_s: float
    phi_flops_per_s: float


class TrainParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    t0_s: float
    phi_flops_per_s: float
    optimizer_step_s: float = 0.0  # per mini-batch (AdamW update)
    mem0_bytes: Optional[float] = None  # M(b) = M0 + b*m
    mem_per_sample_bytes: Optional[float] = None
    device_memory_bytes: Optional[float] = None


class ThroughputModel(BaseModel):
    """Everything needed to evaluate step times for one model on one device."""

    model_config = ConfigDict(extra="forbid")
    source: Literal["fit", "analytic", "calibrated"]
    costs: Costs
    decode: Optional[DecodeParams] = None
    prefill: Optional[PrefillParams] = None
    train: Optional[TrainParams] = None
    kv_cache_tokens: Optional[int] = None  # engine KV capacity, when known
    max_num_seqs: Optional[int] = None
    gen_overhead_s: float = 0.0  # per generate call, outside prefill and decode steps (setup, sampling glue)

    def decode_step_s(self, c: float, s: float) -> float:
        d = self._need(self.decode, "decode")
        return decode_step_s(c, s, self.costs, d.t0_s, d.bw_bytes_per_s, d.phi_flops_per_s, d.smooth_p, d.t_seq_s)

    def decode_tokens_per_s(self, c: float, s: float) -> float:
        return c / self.decode_step_s(c, s)

    def prefill_s(self, c: float, prompt_len: float) -> float:
        pp = self.prefill
        if pp is None:  # fall back on the decode parameters, which share the same physics
            d = self._need(self.decode, "decode")
            return prefill_s(c, prompt_len, self.costs, d.t0_s, d.bw_bytes_per_s, d.phi_flops_per_s)
        return prefill_s(c, prompt_len, self.costs, pp.t0_s, pp.bw_bytes_per_s, pp.phi_flops_per_s)

    def generation_tokens_per_s(self, c: float, prompt_len: float, output_len: int) -> float:
        """Static batch: prefill, then output_len - 1 decode steps at mean context (as the hf backend measures)."""
        steps = max(output_len - 1, 0)
        s_mean = prompt_len + output_len / 2
        total = self.gen_overhead_s + self.prefill_s(c, prompt_len) + steps * self.decode_step_s(c, s_mean)
        return c * output_len / total

    def knee(self, s: float) -> Optional[float]:
        d = self._need(self.decode, "decode")
        if self.costs.moe_num_experts:
            return knee_concurrency_numeric(self.costs, s, d.bw_bytes_per_s, d.phi_flops_per_s)
        return knee_concurrency(self.costs, s, d.bw_bytes_per_s, d.phi_flops_per_s)

    def train_step_s(self, b: float, seq_len: float) -> float:
        t = self._need(self.train, "training")
        return train_step_s(b, seq_len, self.costs, t.t0_s, t.phi_flops_per_s)

    def train_tokens_per_s(self, b: float, seq_len: float) -> float:
        """Tokens/s of one micro-step followed by its optimizer step (what a training point measures)."""
        t = self._need(self.train, "training")
        return b * seq_len / (self.train_step_s(b, seq_len) + t.optimizer_step_s)

    def max_micro_batch(self) -> Optional[int]:
        """Largest micro-batch with M0 + b*m below device memory; None when unknown."""
        t = self.train
        if not t or t.mem0_bytes is None or not t.mem_per_sample_bytes or not t.device_memory_bytes:
            return None
        b = math.floor((t.device_memory_bytes - t.mem0_bytes) / t.mem_per_sample_bytes)
        return max(b, 0)

    @staticmethod
    def _need(x, what: str):
        if x is None:
            from throughputlab.errors import UserError

            raise UserError(f"the throughput model has no {what} part: measure or predict {what} first")
        return x
