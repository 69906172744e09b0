"""FP8 checkpoints that leave some linear layers at 16 bits: the skip lists of transformers/vLLM
(``modules_to_not_convert``), llm-compressor (``ignore``, ``re:`` entries) and ModelOpt (``exclude_modules``,
wildcards) are counted into the weight bytes, and a quantized checkpoint is priced at FP8 whatever dtype is asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from throughputlab.models import resolve_model
from throughputlab.models.spec import spec_from_config
from throughputlab.roofline.core import Costs

pytestmark = pytest.mark.quick

MODELS = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published" / "models"
GIB = 2**30


def _cfg(quant: dict | None) -> dict:
    cfg = {k: v for k, v in resolve_model("llama3.1-8b").config.items() if not k.startswith("_")}
    return {**cfg, "quantization_config": quant} if quant else cfg


def _attention_params(spec) -> int:
    h, hd = spec.hidden_size, spec.head_dim
    return spec.num_layers * (2 * h * spec.num_heads * hd + 2 * h * spec.num_kv_heads * hd)


def test_metas_405b_fp8_checkpoint_weighs_what_vllm_loaded():
    # attention and the first and last layers' feed-forward in BF16: vLLM logged 56.7677 GB (GiB) a GPU at TP 8
    cfg = json.loads((MODELS / "llama3.1-405b-fp8.json").read_text())
    spec = spec_from_config(cfg, "llama3.1-405b-fp8", "folder")
    assert spec.quantization == "fp8" and spec.params_16bit_what == "attention in 126 layer(s), feed-forward in 2 layer(s)"
    per_gpu = Costs.from_spec(spec, 1).total_weight_bytes / 8 / GIB
    assert per_gpu == pytest.approx(56.77, abs=0.1)
    plain = Costs.from_spec(spec_from_config({k: v for k, v in cfg.items() if k != "quantization_config"}, "x", "folder"), 1)
    assert plain.total_weight_bytes / 8 / GIB == pytest.approx(47.7, abs=0.1)  # every linear layer in FP8
    # a decode step reads the BF16 attention too
    assert Costs.from_spec(spec, 1).weight_bytes - plain.weight_bytes == pytest.approx(spec.params_16bit_active)


@pytest.mark.parametrize("quant", [
    {"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["self_attn", "lm_head"]},
    {"quant_method": "compressed-tensors", "ignore": ["lm_head", "re:.*self_attn\\..*"],
     "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}, "targets": ["Linear"]}}},
    {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["*self_attn*", "lm_head"]},
])
def test_each_skip_list_form_keeps_the_attention(quant):
    spec = spec_from_config(_cfg(quant), "m", "folder")
    assert spec.quantization == "fp8"
    assert spec.params_16bit_total == _attention_params(spec) and spec.params_16bit_what == "attention in 32 layer(s)"


@pytest.mark.parametrize("quant", [
    {"quant_method": "compressed-tensors", "ignore": ["re:.*self_attn\\..*"],  # 4-bit integer weights: not FP8
     "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}},
    {"quant_method": "awq", "modules_to_not_convert": ["self_attn"]},
    {"quant_method": "fp8"},  # FP8 with nothing skipped: the embedding and LM head only, as for --dtype fp8
])
def test_other_checkpoints_keep_nothing_more(quant):
    spec = spec_from_config(_cfg(quant), "m", "folder")
    assert spec.params_16bit_total == 0 and spec.params_16bit_what == ""
    assert spec.quantization == ("fp8" if quant["quant_method"] == "fp8" else None)


def test_one_layers_name_keeps_that_layer_only():
    spec = spec_from_config(_cfg({"quant_method": "fp8", "modules_to_not_convert": ["model.layers.1.mlp"]}), "m", "f")
    assert spec.params_16bit_total == 3 * spec.hidden_size * spec.intermediate_size
    assert spec.params_16bit_what == "feed-forward in 1 layer(s)"  # not layers 10-19 as well


def test_predict_prices_a_quantized_folder_at_fp8_and_says_so(tmp_path, capsys):
    folder = tmp_path / "llama-fp8"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(_cfg({"quant_method": "fbgemm_fp8",
                                                         "modules_to_not_convert": ["self_attn", "lm_head"]})))
    from throughputlab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["predict", "-m", str(folder), "--gpu", "h100", "-c", "1"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "(fp8)" in out.splitlines()[0]
    assert "an FP8 checkpoint (quantization_config: fbgemm_fp8), priced at fp8 whatever the dtype asked" in out
    assert "keeps attention in 32 layer(s) at 16 bits" in out
