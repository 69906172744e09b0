"""Quantized checkpoints: which linear layers a checkpoint's ``quantization_config`` leaves at 16 bits.

An FP8 checkpoint rarely quantizes every linear layer. Meta's Llama 3.1 FP8 checkpoints (FBGEMM
row-wise FP8) keep attention and the first and last layers' feed-forward in BF16 (the Llama 3 paper,
section 6.2); llm-compressor checkpoints list what they skip in ``ignore``; ModelOpt in
``exclude_modules``. The embedding and the LM head stay at 16 bits in all of them (``roofline.core.Costs``
prices that); this module counts the rest, so the weight bytes a decode step reads, and what is left for
the KV cache, follow the checkpoint.

Names are matched as the engines match them: vLLM's ``is_layer_skipped`` and transformers' quantizers
take a listed name as the module itself or a parent of it; llm-compressor's ``re:`` entries are regular
expressions; ModelOpt's ``*`` are wildcards.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, NamedTuple, Optional

FP8_METHODS = {"fp8", "fbgemm_fp8", "modelopt", "compressed-tensors"}  # compressed-tensors: when its weights are float 8-bit


class Module(NamedTuple):
    name: str  # as the checkpoint names it, e.g. model.layers.0.self_attn.q_proj
    active: int  # parameters one token reads
    total: int  # parameters held


class Unquantized(NamedTuple):
    active: int  # linear-layer parameters left at 16 bits that one token reads (embedding and LM head apart)
    total: int
    what: str  # for notes: which modules, in words


def quant_method(cfg: dict[str, Any]) -> Optional[str]:
    """``fp8`` for a checkpoint whose ``quantization_config`` stores 8-bit float weights; None otherwise (no
    quantization_config, or a method this model does not price)."""
    q = cfg.get("quantization_config") or {}
    method = str(q.get("quant_method", "")).lower()
    if method not in FP8_METHODS:
        return None
    if method == "compressed-tensors":
        groups = (q.get("config_groups") or {}).values()
        weights = [g.get("weights") or {} for g in groups if isinstance(g, dict)]
        if not weights or not all(w.get("type") == "float" and int(w.get("num_bits", 0)) == 8 for w in weights):
            return None
    if method == "modelopt" and "FP8" not in str(q.get("quant_algo", "")).upper():
        return None
    return "fp8"


def skip_list(cfg: dict[str, Any]) -> list[str]:
    q = cfg.get("quantization_config") or {}
    for key in ("modules_to_not_convert", "ignore", "exclude_modules", "ignored_layers"):
        if q.get(key):
            return [str(x) for x in q[key]]
    return []


def _matches(entry: str, name: str) -> bool:
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    if "*" in entry or "?" in entry:
        return fnmatch.fnmatchcase(name, entry)
    return f".{entry}." in f".{name}."  # the module itself, a parent of it, or a dotted part of its name


def unquantized(modules: list[Module], cfg: dict[str, Any]) -> Unquantized:
    """The modules of ``modules`` that the checkpoint's skip list names: their parameters, and a short
    description (how many of the model's layers each kind of module is kept in)."""
    entries = [e for e in skip_list(cfg) if e not in ("lm_head", "model.embed_tokens", "embed_tokens")]
    if not entries or not modules:
        return Unquantized(0, 0, "")
    kept = [m for m in modules if any(_matches(e, m.name) for e in entries)]
    kinds: dict[str, set[str]] = {}
    for m in kept:
        parts = m.name.split(".")
        layer = next((p for p in parts if p.isdigit()), "")
        kind = "attention" if "attn" in m.name else "feed-forward" if "mlp" in m.name else parts[-1]
        kinds.setdefault(kind, set()).add(layer)
    what = ", ".join(f"{k} in {len(v)} layer(s)" for k, v in sorted(kinds.items()))
    return Unquantized(sum(m.active for m in kept), sum(m.total for m in kept), what)


def checkpoint_lines(spec, dtype: str, dtype_bytes: int) -> list[str]:
    """What a quantized checkpoint's config changes (``spec`` a ModelSpec; ``dtype`` the dtype asked, of
    ``dtype_bytes`` bytes): the weights' dtype, whatever was asked, and the linear layers it keeps at 16 bits."""
    if spec.quantization != "fp8":
        return []
    method = (spec.config.get("quantization_config") or {}).get("quant_method")
    lines = [f"weights: an FP8 checkpoint (quantization_config: {method})"
             + ("" if dtype_bytes == 1 else f", priced at fp8 whatever the dtype asked ({dtype})")]
    if spec.params_16bit_what:
        lines.append(f"weights: the checkpoint keeps {spec.params_16bit_what} at 16 bits "
                     f"({spec.params_16bit_total / 1e9:.3g}B parameters), besides the embedding and the LM head")
    return lines
