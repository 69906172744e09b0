"""Model specs: parameter counts against the published sizes, docs/model.md quantities by hand, resolution errors."""

import json

import pytest

from throughputlab.errors import UserError
from throughputlab.models import preset_names, resolve_model
from throughputlab.models.spec import experts_touched


@pytest.mark.parametrize("name,total_b,active_b", [
    ("qwen2.5-0.5b", 0.494, 0.494),   # model card: 0.49B
    ("qwen2.5-1.5b", 1.54, 1.54),     # 1.54B
    ("qwen2.5-7b", 7.61, 7.61),       # 7.61B
    ("qwen3-8b", 8.19, 8.19),         # 8.2B
    ("llama3.1-8b", 8.03, 8.03),      # 8.03B
    ("qwen3-30b-a3b", 30.5, 3.3),     # 30.5B total, 3.3B activated
    ("qwen2.5-32b", 32.5, 32.5),      # 32.5B
    ("qwen2.5-72b", 72.7, 72.7),      # 72.7B
    ("llama3.1-70b", 70.6, 70.6),     # 70.6B
    ("deepseek-v3", 671, 37),         # model card: 671B total, 37B activated (the 14B MTP module not counted)
])
def test_parameter_counts_match_published_sizes(name, total_b, active_b):
    s = resolve_model(name).spec
    assert s.params_total / 1e9 == pytest.approx(total_b, rel=0.01)
    assert s.params_active / 1e9 == pytest.approx(active_b, rel=0.03)


def test_design_quantities_by_hand_for_qwen25_7b():
    s = resolve_model("qwen2.5-7b").spec
    # k = 2 * layers * kv_heads * head_dim * bytes = 2 * 28 * 4 * 128 * 2
    assert s.kv_bytes_per_token(2) == 2 * 28 * 4 * 128 * 2
    # a = 4 * layers * heads * head_dim
    assert s.attn_flops_per_ctx_token == 4 * 28 * 28 * 128
    # untied: W = everything but the input embedding; F = 2 * the same parameters
    non_embed = s.params_total - 152064 * 3584
    assert s.weight_bytes_per_step(2) == 2 * non_embed
    assert s.flops_per_token == 2 * non_embed


def test_tied_embeddings_are_read_once_as_lm_head():
    s = resolve_model("tiny").spec
    assert s.tie_word_embeddings
    assert s.weight_bytes_per_step(4) == 4 * s.params_total  # all weights, the tied matrix once


def test_moe_weight_bytes_grow_from_active_to_total():
    s = resolve_model("qwen3-30b-a3b").spec
    w1 = s.weight_bytes_per_step(2, 1)
    assert w1 == pytest.approx(2 * (s.params_active - s.params_embedding), rel=1e-9)
    w_big = s.weight_bytes_per_step(2, 100_000)
    assert w_big == pytest.approx(2 * (s.params_total - s.params_embedding), rel=1e-6)
    assert experts_touched(128, 8, 1) == pytest.approx(8)
    assert experts_touched(128, 8, 2) == pytest.approx(128 * (1 - (120 / 128) ** 2))


def test_presets_include_the_required_models():
    names = set(preset_names())
    assert {"tiny", "demo", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b", "qwen3-8b", "llama3.1-8b",
            "qwen3-30b-a3b", "qwen3-14b", "qwen3-32b", "qwen3-235b-a22b", "llama3.3-70b", "llama3.1-405b"} <= names
    # parameter counts as the model cards state them (14.8B, 32.8B, 235B with 22B active, 405B)
    for name, total, active in (("qwen3-14b", 14.8e9, 14.8e9), ("qwen3-32b", 32.8e9, 32.8e9),
                                ("qwen3-235b-a22b", 235e9, 22e9), ("llama3.1-405b", 405e9, 405e9)):
        spec = resolve_model(name).spec
        assert spec.params_total == pytest.approx(total, rel=0.01) and spec.params_active == pytest.approx(active, rel=0.02)
    assert 80e6 < resolve_model("demo").spec.params_total < 130e6
    assert resolve_model("tiny").spec.params_total < 10e6


def test_unknown_preset_suggests_close_names():
    with pytest.raises(UserError, match="did you mean qwen2.5-7b"):
        resolve_model("qwen2.5-7")


def test_missing_folder_and_folder_errors(tmp_path):
    with pytest.raises(UserError, match="no such model folder"):
        resolve_model(str(tmp_path / "nope"))
    with pytest.raises(UserError, match="no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(resolve_model("tiny").config))
    with pytest.raises(UserError, match="--random-weights"):
        resolve_model(str(tmp_path))
    r = resolve_model(str(tmp_path), random_weights=True)
    assert r.source == "folder" and r.spec.params_total == resolve_model("tiny").spec.params_total
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        resolve_model(str(tmp_path), random_weights=True)


@pytest.mark.slow
def test_unreachable_hub_id_is_one_line(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # the client reads the variable once, at import: an earlier import in the session would go to the network
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(UserError) as e:
        resolve_model("some-org/some-model-that-is-not-cached")
    assert "hub" in str(e.value) and "\n" not in str(e.value)


def test_a_hub_id_without_a_reachable_hub_fails_at_once(monkeypatch):
    import throughputlab.models as models

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    monkeypatch.setattr(models, "_resolves", lambda host: host != "hub.invalid")
    with pytest.raises(UserError, match=r"not in the local Hugging Face cache, and the hub \(hub.invalid\) cannot"):
        resolve_model("no-such-org/no-such-model")


def test_mla_caches_one_latent_per_layer_and_is_replicated_under_tp():
    """DeepSeek-V3: vLLM's MLA cache holds kv_lora_rank + qk_rope_head_dim values per layer (one latent shared by
    the 128 heads), 1/14 of what 128 K and V heads of 192 and 128 would take; tensor parallelism cannot split it."""
    from throughputlab.roofline import Costs
    from throughputlab.roofline.devices import tp_shard
    s = resolve_model("deepseek-v3").spec
    assert s.kv_bytes_per_token(2) == 61 * (512 + 64) * 2
    assert s.attn_flops_per_ctx_token == 2 * 61 * 128 * (192 + 128)
    assert s.moe.moe_layers == 61 - 3  # first_k_dense_replace
    costs = Costs.from_spec(s, 2)
    assert tp_shard(costs, 8).kv_bytes_per_token == costs.kv_bytes_per_token
    assert tp_shard(costs, 8).weight_bytes == pytest.approx(costs.weight_bytes / 8)


@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_mla_and_moe_parameter_count_equals_the_transformers_model(q_lora_rank):
    """A small DeepSeek-V3 config (MLA with and without the query's low rank, dense first layers, a shared
    expert) built by transformers with random weights: spec_from_config counts its parameters exactly."""
    transformers = pytest.importorskip("transformers")
    from throughputlab.models.spec import spec_from_config
    cfg = {"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 96, "moe_intermediate_size": 32,
           "num_hidden_layers": 4, "first_k_dense_replace": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
           "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1,
           "kv_lora_rank": 16, "q_lora_rank": q_lora_rank, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
           "v_head_dim": 8, "vocab_size": 100, "tie_word_embeddings": False, "max_position_embeddings": 128}
    config = transformers.DeepseekV3Config(**{k: v for k, v in cfg.items() if k != "model_type"})
    model = transformers.AutoModelForCausalLM.from_config(config)
    router_bias = sum(p.numel() for n, p in model.named_parameters() if "e_score_correction_bias" in n)
    counted = sum(p.numel() for p in model.parameters()) - router_bias
    assert spec_from_config(cfg, "mla-tiny", "folder").params_total == counted


def test_an_unreachable_hub_id_names_the_preset_that_holds_its_config(monkeypatch):
    from throughputlab import models

    assert models.preset_for_hub_id("Qwen/Qwen3-32B") == "qwen3-32b"
    assert models.preset_for_hub_id("meta-llama/Llama-3.1-8B") == "llama3.1-8b"  # the Instruct preset's architecture
    assert models.preset_for_hub_id("meta-llama/Llama-2-7b-chat-hf") == "llama2-7b"
    assert models.preset_for_hub_id("someone/finetune-7b") is None
    monkeypatch.setattr(models, "_resolves", lambda host: False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(UserError, match="the preset qwen3-32b holds its config.json: --model qwen3-32b"):
        resolve_model("Qwen/Qwen3-32B")
    with pytest.raises(UserError, match=r"use a preset \(`throughputlab models`\)"):
        resolve_model("someone/finetune-7b")
