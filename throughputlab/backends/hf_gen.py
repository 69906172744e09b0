"""Generation backend `hf`: a transformers model decoded by a plain torch loop.

A static batch of ``c`` sequences: synthetic prompts, a preallocated (static) KV cache where
the model supports it, greedy decoding of exactly ``output_len`` tokens (no EOS check), and
every decode step timed between device synchronisations.

The overhead probe: right after each repeat, the same requests run through the same network
with its matrix widths shrunk to ``PROBE_WIDTH`` (hidden and MLP sizes; layers, attention
heads, head size, vocabulary and KV cache unchanged). Its weights are a few percent of the
model's, so its step time is what a step costs apart from streaming the weights and the
matmul FLOPs: dispatch, attention, sampling. The fit uses it to separate the per-step
overhead from the bandwidth term, which a sweep of the model alone cannot (both are constant
in the concurrency).

On CPU in float32 the linear layers run through oneDNN with their weights packed once at start, as
vLLM's CPU backend runs them: ``F.linear`` calls MKL, which repacks the weight at every call when a
matmul has a few rows (a 4096x4096 layer on a 2-core EPYC: 4.4 ms at 1 row, 10 at 2, 15 at 4),
so the decode step doubled from one sequence to two and the bandwidth plateau never showed;
packed, the same layer takes 3.7, 3.9, 4.4 and 6.3 ms at 1, 2, 4 and 8 rows, then grows with the
FLOPs. ``--engine-arg prepack=false`` keeps ``F.linear``.

On CPU the decode steps use transformers' ``eager`` attention: for one-token steps the CPU
``sdpa`` kernel is slower (1.5x at concurrency 64 on a 2-core EPYC) and erratic. Prefill
keeps ``sdpa``. ``--engine-arg attn_implementation=NAME`` uses NAME for both.
"""

from __future__ import annotations

import logging
import time
import warnings
from typing import Optional

import torch

from throughputlab.backends.torch_common import (
    InProcessTorchBackend,
    PeakMemory,
    build_model,
    release,
    sync,
    synthetic_ids,
)
from throughputlab.models import ResolvedModel
from throughputlab.records.profile import EngineInfo, GenSample

log = logging.getLogger(__name__)

PROBE_WIDTH = 64
_WIDTH_KEYS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
               "ffn_dim")
HF_ENGINE_ARGS = ("attn_implementation", "overhead_probe", "prepack")
# transformers 5.24 renamed the forward's `past_key_values` to `cache` and warns (FutureWarning)
# at every call that uses the old name, which is the only one earlier versions take and which
# works until 5.40: the bench output is the progress bar and the results, not this notice.
_CACHE_RENAME_WARNING = r"`past_key_values` is deprecated .* Use `cache` instead"


class PackedLinear(torch.nn.Module):
    """An inference-only ``nn.Linear`` whose weight oneDNN packed once (its blocked layout), so a
    matmul of a few rows does not repack it at every call."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None),
                             persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def can_prepack(device: str, dtype: str) -> bool:
    return device == "cpu" and dtype == "float32" and torch.backends.mkldnn.is_available()


def prepack_linears(model: torch.nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` by a :class:`PackedLinear` (in place); the count replaced."""
    found = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is torch.nn.Linear]
    for parent, name, child in found:
        setattr(parent, name, PackedLinear(child))
    return len(found)


def probe_overrides(config: dict) -> dict[str, int]:
    """Config changes that turn the model into its overhead probe (widths shrunk, head size kept)."""
    out = {k: min(int(config[k]), PROBE_WIDTH) for k in _WIDTH_KEYS if isinstance(config.get(k), int)}
    if "hidden_size" in out and not config.get("head_dim"):
        out["head_dim"] = int(config["hidden_size"]) // int(config["num_attention_heads"])
    return out


def _on(value) -> bool:
    return value not in (False, 0, "false", "False", "off", "no", "0")


class HFGenerationBackend(InProcessTorchBackend):
    name = "hf"

    def __init__(self, resolved: ResolvedModel, *, dtype: str, device: str, seed: int = 0,
                 max_concurrency: int = 1, max_len: int = 0, engine_args: Optional[dict] = None):
        self.resolved = resolved
        self.dtype = dtype
        self.device = device
        self.seed = seed
        self.max_len = max_len
        self.model = None
        self.probe = None  # the overhead probe model, when built
        self.probe_config: Optional[dict[str, int]] = None
        self.cache_kind: Optional[str] = None
        self.last_output_ids: Optional[torch.Tensor] = None  # tokens of the last run, for checking the loop
        self._peak = PeakMemory(device)
        self._gen = torch.Generator().manual_seed(seed)
        args = dict(engine_args or {})
        unknown = sorted(set(args) - set(HF_ENGINE_ARGS))
        if unknown:
            from throughputlab.errors import UserError

            raise UserError(f"--engine-arg {unknown[0]} does not apply to --backend hf: it takes "
                            f"{' and '.join(HF_ENGINE_ARGS)} (other engine arguments are for --backend vllm)")
        chosen = args.get("attn_implementation")
        self.prefill_attn = str(chosen or "sdpa")
        self.decode_attn = str(chosen or ("eager" if device == "cpu" else "sdpa"))
        self.use_probe = _on(args.get("overhead_probe", True))
        self.prepack = _on(args.get("prepack", True)) and can_prepack(device, dtype)
        self.packed_layers = 0

    def start(self) -> None:
        self.model = build_model(self.resolved, self.dtype, self.device, self.seed,
                                 attn_implementation=self.prefill_attn)
        self.model.eval()
        if self.prepack:
            self.packed_layers = prepack_linears(self.model)
        if self.use_probe:
            overrides = probe_overrides(self.resolved.config)
            try:
                self.probe = build_model(self.resolved, self.dtype, self.device, self.seed,
                                         attn_implementation=self.prefill_attn, config_overrides=overrides)
                self.probe.eval()
                if self.prepack:
                    prepack_linears(self.probe)
                self.probe_config = overrides
            except Exception as e:  # an architecture that cannot be narrowed: measure without the probe
                log.warning("overhead probe unavailable for this model (%s); the fit will not separate the "
                            "per-step overhead from the bandwidth term", str(e).splitlines()[0] if str(e) else e)
                self.probe = None

    def engine_info(self) -> Optional[EngineInfo]:
        import transformers

        return EngineInfo(name="transformers", version=transformers.__version__,
                          engine_args={"kv_cache": self.cache_kind or "static",
                                       "attn_prefill": self.prefill_attn, "attn_decode": self.decode_attn,
                                       "linear": f"oneDNN, packed ({self.packed_layers} layers)" if self.packed_layers
                                       else "torch F.linear"},
                          overhead_probe=self.probe_config if self.probe is not None else None)

    def _new_cache(self, model, batch: int, max_len: int):
        from transformers import DynamicCache, StaticCache

        cfg = model.config
        try:
            cache = StaticCache(config=cfg, max_cache_len=max_len)
            spec = self.resolved.spec
            cache.early_initialization(batch_size=batch, num_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                                       dtype=next(model.parameters()).dtype, device=torch.device(self.device))
            self.cache_kind = "static"
            return cache
        except Exception as e:  # architectures without static-cache support decode with a growing cache
            log.info("static KV cache unavailable (%s); using a dynamic cache", e)
            self.cache_kind = "dynamic"
            return DynamicCache()

    def run(self, concurrency: int, prompt_len: int, output_len: int) -> GenSample:
        vocab = self.resolved.spec.vocab_size
        ids = synthetic_ids(concurrency, prompt_len, vocab, self.device, self._gen)
        total, t_prefill, steps, produced = self._decode(self.model, ids, output_len)
        self.last_output_ids = produced
        sample = GenSample(total_s=total, output_tokens=concurrency * output_len, prefill_s=t_prefill,
                           decode_s=sum(steps), decode_step_s=steps)
        if self.probe is not None:
            _, p_prefill, p_steps, _ = self._decode(self.probe, ids, output_len)
            sample.probe_prefill_s, sample.probe_decode_step_s = p_prefill, p_steps
        return sample

    @torch.inference_mode()
    def _decode(self, model, ids: torch.Tensor, output_len: int):
        """Prefill ``ids`` and decode ``output_len`` tokens greedily: (total, prefill, step times, tokens)."""
        concurrency, prompt_len = ids.shape
        cache = self._new_cache(model, concurrency, prompt_len + output_len)
        steps: list[float] = []

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_CACHE_RENAME_WARNING, category=FutureWarning)
            model.config._attn_implementation = self.prefill_attn  # read at every forward, by every layer
            sync(self.device)
            t_start = time.perf_counter()
            out = model(input_ids=ids, past_key_values=cache, use_cache=True,
                        cache_position=torch.arange(prompt_len, device=self.device), logits_to_keep=1)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            sync(self.device)
            t_prefill = time.perf_counter() - t_start
            produced = [nxt]
            pos = torch.tensor([prompt_len], device=self.device)
            model.config._attn_implementation = self.decode_attn
            for _ in range(output_len - 1):  # the prefill already produced the first token
                t = time.perf_counter()
                out = model(input_ids=nxt, past_key_values=cache, use_cache=True, cache_position=pos, logits_to_keep=1)
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                pos += 1
                produced.append(nxt)
                sync(self.device)  # .argmax result is needed next step anyway; sync makes the step time exact
                steps.append(time.perf_counter() - t)
            total = time.perf_counter() - t_start
        del cache, out
        return total, t_prefill, steps, torch.cat(produced, dim=1)

    def close(self) -> None:
        self.model = self.probe = None
        release(self.device)
