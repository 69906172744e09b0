"""The KV cache's dtype end to end: an fp8 cache is read at one byte a value in the decode step of a
predicted profile (not only sized at one byte by the engine's rule), vLLM's fp8 names count as fp8, a
measured profile's recorded cache dtype is kept when its model is read back, and the published
TensorRT-LLM FP8 cases run with the FP8 KV cache those engines use."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from throughputlab import roofline as rf
from throughputlab.fit import load_model
from throughputlab.fit.schema import costs_of
from throughputlab.models import resolve_model
from throughputlab.predict import predict_analytic
from throughputlab.predict_engine import EngineOptions

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "published"


def _model(kv_dtype: str, engine: str = "vllm"):
    spec = resolve_model("llama3.1-8b").spec
    return load_model(predict_analytic(spec, "h100", concurrency=(1,), engine=EngineOptions(
        engine=engine, kv_cache_dtype=kv_dtype)))


@pytest.mark.parametrize("engine", ["vllm", "trtllm"])
def test_an_fp8_kv_cache_is_read_at_one_byte_in_the_decode_step(engine):
    auto, fp8 = _model("auto", engine), _model("fp8", engine)
    assert fp8.device_costs.kv_bytes_per_token == auto.device_costs.kv_bytes_per_token / 2
    c, s = 64, 4096  # attention memory-bound: 32 KiB of fp8 KV per token against 0.5 MFLOP
    saved = c * s * (auto.device_costs.kv_bytes_per_token - fp8.device_costs.kv_bytes_per_token)
    bw = fp8.decode.bw_attn_bytes_per_s
    assert auto.decode_step_s(c, s) - fp8.decode_step_s(c, s) == pytest.approx(saved / bw, rel=1e-9)


def test_vllm_fp8_cache_names_are_one_byte():
    assert [rf.kv_value_bytes(2, d) for d in ("fp8", "fp8_e4m3", "fp8_e5m2", "auto")] == [1, 1, 1, 2]
    assert rf.kv_value_bytes(1, "auto") == 2  # FP8 weights keep a 16-bit cache unless told


def test_a_recorded_fp8_cache_dtype_is_kept_when_the_model_is_read_back():
    spec = resolve_model("llama3.1-8b").spec
    prof = predict_analytic(spec, "h100", concurrency=(1,))
    k16 = costs_of(prof).kv_bytes_per_token
    measured = prof.model_copy(update={"engine": prof.engine.model_copy(
        update={"engine_args": {"kv_cache_dtype": "fp8_e4m3"}})})  # as a vLLM profile records cache_dtype
    assert costs_of(measured).kv_bytes_per_token == k16 / 2
    bare = prof.model_copy(update={"engine": None})
    assert costs_of(bare).kv_bytes_per_token == k16


def test_published_trtllm_fp8_cases_use_an_fp8_kv_cache():
    # trtllm-bench build forces an FP8 KV cache with FP8 quantization; the PyTorch backend takes the ModelOpt
    # checkpoint's FP8 cache (TensorRT-LLM issue #6294's log: 65,536 bytes a token for Llama 3.1 8B)
    seen = 0
    for path in sorted(DATA.glob("trtllm_*.yaml")):
        doc = yaml.safe_load(path.read_text())
        for case in doc["cases"]:
            merged = {**doc.get("defaults", {}), **case}
            if merged.get("dtype") == "fp8":
                seen += 1
                assert merged.get("kv_dtype") == "fp8", f"{path.name}: {case['id']}"
    assert seen > 20
