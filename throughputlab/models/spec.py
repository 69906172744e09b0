"""ModelSpec: the model quantities the throughput model needs, computed from a config.

Pure Python (no torch, no transformers): a profile measured on a GPU box is analysed on a
laptop from the spec stored in it. Notation follows docs/model.md:

- ``W``  bytes of weights read per decode step (active parameters x bytes/param),
- ``k``  KV-cache bytes per context token, ``2 * layers * kv_heads * head_dim * bytes``,
- ``F``  FLOPs per token outside attention, ``2 * active non-embedding params`` + LM head,
- ``a``  attention FLOPs per context token, ``4 * layers * heads * head_dim``.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from throughputlab.errors import UserError
from throughputlab.models import quant
from throughputlab.records.base import Record

DTYPE_BYTES = {"float32": 4, "fp32": 4, "float16": 2, "fp16": 2, "bfloat16": 2, "bf16": 2, "fp8": 1, "int8": 1}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise UserError(f"unknown dtype {dtype!r}: use one of float32, bfloat16, float16") from None


class MoESpec(Record):
    num_experts: int
    top_k: int
    moe_layers: int
    expert_params: int  # parameters of one expert in one layer
    shared_expert_params: int = 0  # per MoE layer, always active
    router_params: int = 0  # per MoE layer


ROPE_SCALING_TYPES = ("yarn", "linear", "dynamic")  # the types that stretch the positions by a factor


def parse_rope_scaling(text: str, max_position_embeddings: Optional[int] = None) -> dict:
    """``TYPE:FACTOR[:ORIGINAL]`` as a config's rope_scaling, e.g. ``yarn:4`` or ``yarn:4:32768`` (yarn's
    original_max_position_embeddings; default the config's max_position_embeddings). ValueError names the fix."""
    parts = text.split(":")
    try:
        kind, factor = parts[0], float(parts[1])
        original = int(parts[2]) if len(parts) == 3 else max_position_embeddings
        ok = kind in ROPE_SCALING_TYPES and factor >= 1 and len(parts) <= 3 and (original is None or original > 0)
    except (IndexError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"--rope-scaling {text}: give TYPE:FACTOR[:ORIGINAL] with TYPE one of "
                         f"{', '.join(ROPE_SCALING_TYPES)}, FACTOR 1 or more, e.g. yarn:4 or yarn:4:32768")
    rs = {"rope_type": kind, "factor": factor}
    if kind == "yarn" and original is not None:
        rs["original_max_position_embeddings"] = original
    return rs


class ModelSpec(Record):
    """Architecture numbers and the derived per-token costs (parameter counts, not bytes)."""

    name: str
    source: str  # "preset", "folder" or "hub"
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: Optional[int] = None
    moe: Optional[MoESpec] = None
    # multi-head latent attention (DeepSeek-V2/V3, Kimi K2): one cached latent per layer of
    # kv_lora_rank + qk_rope_head_dim values shared by every head (None: K and V per KV head)
    kv_values_per_layer: Optional[int] = None
    qk_head_dim: Optional[int] = None  # per-head query/key width when it differs from the value's (MLA)

    params_total: int
    params_active: int
    params_embedding: int  # input embedding matrix
    params_lm_head: int  # the output projection's matrix (the embedding itself when tied)
    # a quantized checkpoint (its config's quantization_config): the weights' format, and the linear layers it
    # leaves at 16 bits besides the embedding and the LM head (models/quant.py), read per token and held
    quantization: Optional[str] = None
    params_16bit_active: int = 0
    params_16bit_total: int = 0
    params_16bit_what: str = ""
    config: dict[str, Any] = {}

    @property
    def context_limit(self) -> Optional[int]:
        """The longest sequence the model's positions allow: max_position_embeddings, stretched by a
        rope_scaling that extends it (yarn: original_max_position_embeddings x factor; linear and dynamic:
        x factor; llama3 and longrope already count it), as vLLM derives max_model_len
        (vllm/config/model.py _get_and_verify_max_len)."""
        limit = self.max_position_embeddings
        rs = self.config.get("rope_scaling") or {}
        kind = rs.get("rope_type", rs.get("type"))
        if limit is None or not rs or kind in ("su", "longrope", "llama3", "default", None) or "factor" not in rs:
            return limit
        if kind == "yarn":
            limit = rs.get("original_max_position_embeddings", limit)
        return int(limit * float(rs["factor"]))

    def with_rope_scaling(self, text: Optional[str]) -> "ModelSpec":
        """The spec with ``rope_scaling`` as an engine override gives it (vLLM's ``--hf-overrides``):
        ``TYPE:FACTOR[:ORIGINAL]`` (``parse_rope_scaling``)."""
        if not text:
            return self
        rs = parse_rope_scaling(text, self.max_position_embeddings)
        return self.model_copy(update={"config": {**self.config, "rope_scaling": rs}})

    @property
    def context_limit_name(self) -> str:
        """How the limit is stated in messages."""
        if self.context_limit == self.max_position_embeddings:
            return "max_position_embeddings"
        kind = (self.config.get("rope_scaling") or {}).get("rope_type") or self.config["rope_scaling"].get("type")
        return f"context limit with {kind} rope scaling"

    # ---- derived quantities (docs/model.md notation), in parameters / FLOPs ----
    @property
    def params_active_non_embedding(self) -> int:
        return self.params_active - self.params_embedding - (0 if self.tie_word_embeddings else self.params_lm_head)

    def weight_bytes_per_step(self, bytes_per_param: int, tokens: int = 1) -> float:
        """W: bytes of weights read by one decode step that processes ``tokens`` tokens.

        Dense: active non-embedding weights plus the LM head (the input embedding is a
        gather of a few rows). MoE: shared weights plus the experts the whole batch touches,
        ``E * (1 - (1 - k/E)^tokens)`` per layer under uniform routing.
        """
        dense = self.params_active_non_embedding + self.params_lm_head
        if self.moe is None:
            return float(dense * bytes_per_param)
        m = self.moe
        active_experts = m.moe_layers * m.top_k * m.expert_params
        shared = dense - active_experts
        return float((shared + m.moe_layers * experts_touched(m.num_experts, m.top_k, tokens) * m.expert_params)
                     * bytes_per_param)

    def kv_bytes_per_token(self, bytes_per_param: int) -> float:
        """k: KV-cache bytes per context token (keys and values, every layer); MLA caches one latent per
        layer (vLLM's MLA cache: kv_lora_rank + qk_rope_head_dim values, no separate K and V)."""
        if self.kv_values_per_layer:
            return float(self.num_layers * self.kv_values_per_layer * bytes_per_param)
        return float(2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_param)

    @property
    def flops_per_token(self) -> float:
        """F: forward FLOPs per token outside attention: 2 per active non-embedding weight, plus the LM head."""
        return 2.0 * (self.params_active_non_embedding + self.params_lm_head)

    @property
    def attn_flops_per_ctx_token(self) -> float:
        """a: attention FLOPs per token of context (QK^T and AV, 2 FLOPs per multiply-add each); MLA
        as its prefill and training run it (keys of qk_head_dim, values of head_dim per head)."""
        return 2.0 * self.num_layers * self.num_heads * ((self.qk_head_dim or self.head_dim) + self.head_dim)

    def summary(self, bytes_per_param: int) -> dict[str, float]:
        return {
            "params_total": self.params_total,
            "params_active": self.params_active,
            "weight_bytes_per_step": self.weight_bytes_per_step(bytes_per_param),
            "kv_bytes_per_token": self.kv_bytes_per_token(bytes_per_param),
            "flops_per_token": self.flops_per_token,
            "attn_flops_per_ctx_token": self.attn_flops_per_ctx_token,
        }


def experts_touched(num_experts: int, top_k: int, tokens):
    """Expected distinct experts per layer hit by ``tokens`` tokens with uniform top-k routing,
    E * (1 - (1 - k/E)^tokens); 0 for no tokens. ``tokens`` a number or a numpy array."""
    t = np.maximum(np.asarray(tokens, dtype=float), 0.0)
    out = num_experts * (1.0 - (1.0 - top_k / num_experts) ** t)
    return float(out) if out.ndim == 0 else out


def _get(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def _mla(cfg: dict[str, Any], h: int, heads: int) -> Optional[tuple[int, int, int, int]]:
    """Multi-head latent attention (DeepSeek-V2/V3; ``kv_lora_rank`` in the config): its parameters per
    layer (query through a low-rank q_lora_rank when given, the joint KV down-projection with the rope key,
    the up-projection to every head's key and value, the output), the values it caches per layer
    (kv_lora_rank + qk_rope_head_dim), the query/key width and the value width per head. None: not MLA."""
    if not cfg.get("kv_lora_rank"):
        return None
    rank, rope = int(cfg["kv_lora_rank"]), int(cfg.get("qk_rope_head_dim", 0) or 0)
    nope, v = int(cfg.get("qk_nope_head_dim", 0) or 0), int(cfg.get("v_head_dim", 0) or 0)
    if min(rank, nope, v) <= 0 or rope < 0:
        raise UserError("model config with kv_lora_rank (multi-head latent attention) lacks qk_nope_head_dim or "
                        "v_head_dim: give the config.json the model was released with")
    qk = nope + rope
    q_rank = int(cfg.get("q_lora_rank") or 0)
    q = h * q_rank + q_rank + q_rank * heads * qk if q_rank else h * heads * qk
    kv = h * (rank + rope) + rank + rank * heads * (nope + v)
    return q + kv + heads * v * h, rank + rope, qk, v


def spec_from_config(cfg: dict[str, Any], name: str, source: str) -> ModelSpec:
    """Count parameters of a decoder-only transformer described by a Hugging Face config dict."""
    if "text_config" in cfg and "hidden_size" not in cfg:  # multimodal wrappers: the language model
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", cfg.get("model_type"))}
    missing = [k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size") if k not in cfg]
    if missing:
        raise UserError(f"model config for {name!r} lacks {', '.join(missing)}: is it a decoder-only language model config.json?")
    h = int(cfg["hidden_size"])
    layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=h // heads))
    inter = int(_get(cfg, "intermediate_size", "ffn_dim", default=4 * h))
    vocab = int(cfg["vocab_size"])
    tied = bool(cfg.get("tie_word_embeddings", False))
    model_type = str(cfg.get("model_type", "unknown"))
    if min(h, layers, heads, kv_heads, head_dim, inter, vocab) <= 0:
        raise UserError(f"model config for {name!r} has a non-positive dimension")

    mla = _mla(cfg, h, heads)
    if mla is not None:
        attn, kv_values, qk_dim, head_dim = mla
        kv_heads = 1  # one latent serves every head: a single "KV head" (vLLM replicates it under TP)
    else:
        # Attention: q, k, v, o projections (+ biases for qwen2-style configs, + q/k norms for qwen3).
        kv_values = qk_dim = None
        attn = h * heads * head_dim + 2 * h * kv_heads * head_dim + heads * head_dim * h
        if cfg.get("attention_bias", model_type in ("qwen2", "qwen2_moe")):
            attn += heads * head_dim + 2 * kv_heads * head_dim
        if model_type.startswith("qwen3"):
            attn += 2 * head_dim
    norms = 2 * h
    gated = str(cfg.get("hidden_act", "silu")) in ("silu", "swiglu", "gelu_pytorch_tanh") or model_type in (
        "llama", "qwen2", "qwen3", "mistral", "qwen2_moe", "qwen3_moe", "mixtral", "gemma", "gemma2")
    mlp_mats = 3 if gated else 2
    dense_mlp = mlp_mats * h * inter

    num_experts = _get(cfg, "num_experts", "num_local_experts", "n_routed_experts")
    moe: Optional[MoESpec] = None
    if num_experts:
        num_experts = int(num_experts)
        top_k = int(_get(cfg, "num_experts_per_tok", "moe_top_k", default=2))
        moe_inter = int(_get(cfg, "moe_intermediate_size", default=inter))
        step = int(cfg.get("decoder_sparse_step", 1) or 1)
        mlp_only = set(cfg.get("mlp_only_layers", []) or [])
        first_moe = int(cfg.get("first_k_dense_replace", 0) or 0)  # DeepSeek: the first k layers are dense
        freq = int(cfg.get("moe_layer_freq", 1) or 1)
        moe_layer_ids = [i for i in range(layers) if i not in mlp_only and (i + 1) % step == 0
                         and i >= first_moe and i % freq == 0]
        shared_inter = int(_get(cfg, "shared_expert_intermediate_size", default=0) or 0)
        shared = mlp_mats * h * shared_inter + (h if shared_inter else 0)  # shared expert and its gate
        if not shared_inter and cfg.get("n_shared_experts"):  # DeepSeek: shared experts of the routed width, no gate
            shared = int(cfg["n_shared_experts"]) * mlp_mats * h * moe_inter
        moe = MoESpec(num_experts=num_experts, top_k=top_k, moe_layers=len(moe_layer_ids),
                      expert_params=mlp_mats * h * moe_inter, shared_expert_params=shared,
                      router_params=h * num_experts)
        n_moe, n_dense = len(moe_layer_ids), layers - len(moe_layer_ids)
        per_moe_total = attn + norms + moe.router_params + shared + num_experts * moe.expert_params
        per_moe_active = attn + norms + moe.router_params + shared + top_k * moe.expert_params
        layers_total = n_moe * per_moe_total + n_dense * (attn + norms + dense_mlp)
        layers_active = n_moe * per_moe_active + n_dense * (attn + norms + dense_mlp)
    else:
        layers_total = layers_active = layers * (attn + norms + dense_mlp)

    embed = vocab * h
    lm_head = vocab * h
    head_extra = h + (0 if tied else lm_head)  # final norm, separate output matrix
    method = quant.quant_method(cfg)
    kept = quant.unquantized(_modules(layers, h, heads, kv_heads, head_dim, inter, mlp_mats, mla, moe,
                                      moe_layer_ids if moe else []) if method else [], cfg)
    return ModelSpec(
        name=name, source=source, model_type=model_type, hidden_size=h, num_layers=layers, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=inter, vocab_size=vocab,
        tie_word_embeddings=tied, max_position_embeddings=cfg.get("max_position_embeddings"), moe=moe,
        kv_values_per_layer=kv_values, qk_head_dim=qk_dim,
        params_total=embed + layers_total + head_extra, params_active=embed + layers_active + head_extra,
        params_embedding=embed, params_lm_head=lm_head, quantization=method,
        params_16bit_active=kept.active, params_16bit_total=kept.total, params_16bit_what=kept.what,
        config={k: v for k, v in cfg.items() if not k.startswith("_")},
    )


def _modules(layers, h, heads, kv_heads, head_dim, inter, mlp_mats, mla, moe, moe_layer_ids) -> list[quant.Module]:
    """Every linear layer of the decoder as a checkpoint names it (Llama/Qwen names), with its parameters:
    what a quantization_config's skip list is matched against."""
    M = quant.Module
    mlp_names = ("gate_proj", "up_proj", "down_proj") if mlp_mats == 3 else ("up_proj", "down_proj")
    out = []
    for i in range(layers):
        a = f"model.layers.{i}.self_attn"
        if mla is not None:
            out.append(M(a, mla[0], mla[0]))
        else:
            q, kv = h * heads * head_dim, h * kv_heads * head_dim
            out += [M(f"{a}.q_proj", q, q), M(f"{a}.k_proj", kv, kv), M(f"{a}.v_proj", kv, kv), M(f"{a}.o_proj", q, q)]
        m = f"model.layers.{i}.mlp"
        if moe is not None and i in moe_layer_ids:
            out += [M(f"{m}.gate", moe.router_params, moe.router_params),
                    M(f"{m}.experts", moe.top_k * moe.expert_params, moe.num_experts * moe.expert_params)]
            if moe.shared_expert_params:
                out.append(M(f"{m}.shared_expert", moe.shared_expert_params, moe.shared_expert_params))
        else:
            out += [M(f"{m}.{n}", h * inter, h * inter) for n in mlp_names]
    return out
