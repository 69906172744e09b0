"""The engine's version as an input: vLLM before 0.8 (its V0 engine) adds V0_STEP_HOST_S of host time to every
decode step; V1 (0.8 and later), SGLang and TensorRT-LLM do not; the header says so; a bad version is refused."""

from __future__ import annotations

import pytest

from conftest import cli_stdout, refused
from throughputlab import roofline as rf
from throughputlab.fit.load import load_model
from throughputlab.models import resolve_model
from throughputlab.predict import predict_analytic
from throughputlab.predict_engine import EngineOptions


@pytest.mark.parametrize("engine, version, extra", [
    ("vllm", "0.4.2", rf.V0_STEP_HOST_S), ("vllm", "0.6.3.post1", rf.V0_STEP_HOST_S), ("vllm", "v0.7.3", rf.V0_STEP_HOST_S),
    ("vllm", "0.8.0", 0.0), ("vllm", "0.10.2", 0.0), ("vllm", "1.0", 0.0), ("vllm", None, 0.0),
    ("sglang", "0.4.6", 0.0), ("trtllm", "0.13.0", 0.0)])
def test_v0_engines_pay_host_time_a_step(engine, version, extra):
    assert rf.engine_version_step_s(engine, version) == extra


def test_version_strings():
    assert rf.version_tuple("0.6.3.post1") == (0, 6, 3) and rf.version_tuple("v0.10.2rc1") == (0, 10, 2)
    with pytest.raises(ValueError):
        rf.version_tuple("latest")


def test_a_v0_prediction_is_slower_by_the_host_time_at_batch_one():
    spec = resolve_model("qwen2.5-1.5b").spec

    def step(version):
        m = load_model(predict_analytic(spec, "a100", concurrency=(1,), engine=EngineOptions(engine_version=version)))
        return m.decode.t0_s
    assert step("0.6.3") - step("0.10.2") == pytest.approx(rf.V0_STEP_HOST_S)
    assert step(None) == step("0.10.2")


def test_the_header_names_the_version_and_a_bad_one_is_refused():
    out = cli_stdout("predict", "-m", "qwen2.5-1.5b", "--gpu", "a100", "-c", "1", "--engine-version", "0.6.3")
    assert "version 0.6.3, its V0 engine: +2.4 ms" in out
    refused("predict", "-m", "qwen2.5-1.5b", "--gpu", "a100", "--engine-version", "latest",
            fragments=("--engine-version latest", "MAJOR.MINOR"))
