"""Eager mode (no CUDA graphs): a step takes max(the host's launches, the device's time), never their sum;
the CUDA-graph path is the device's time alone; a training pass keeps its additive launch cost."""

import numpy as np
import pytest

from throughputlab import roofline as rf
from throughputlab.fit import load_model
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, predict_analytic
from throughputlab.predict_engine import EngineOptions


def test_eager_step_is_the_max_of_host_and_device():
    assert rf.eager_step_s(5e-3, 20e-3) == pytest.approx(20e-3)  # host-bound
    assert rf.eager_step_s(50e-3, 20e-3) == pytest.approx(50e-3)  # device-bound: launches hide under it
    assert rf.eager_step_s(5e-3, 0.0) == 5e-3  # CUDA graphs: the device's time, unchanged
    out = rf.eager_step_s(np.array([1e-3, 30e-3]), 20e-3)
    assert out.tolist() == pytest.approx([20e-3, 30e-3])


def test_the_host_time_is_per_layer_and_engine_and_zero_with_graphs():
    assert rf.eager_host_s(28, "vllm") == pytest.approx(28 * rf.EAGER_LAYER_S["vllm"])
    assert rf.eager_host_s(32, "sglang") < rf.eager_host_s(32, "vllm")
    assert rf.eager_host_s(28, "vllm", enforce_eager=False) == 0.0 and rf.eager_host_s(None) == 0.0
    # the source's own row under the max form: vllm-omni #7960, thinker 22.5 ms eager over 28 layers
    assert rf.EAGER_LAYER_S["vllm"] == pytest.approx(22.5e-3 / 28, rel=0.01)
    # SGLang PR #1401: Llama-3-8B, 32 layers, 9.28 ms eager (triton)
    assert rf.EAGER_LAYER_S["sglang"] == pytest.approx(9.28e-3 / 32, rel=0.01)


def _pair(model: str, gpu: str, **layout):
    spec = resolve_model(model).spec
    kw = {"layout": Layout(**layout)} if layout else {}
    graphs = load_model(predict_analytic(spec, gpu, concurrency=(1,), **kw))
    eager = load_model(predict_analytic(spec, gpu, concurrency=(1,), engine=EngineOptions(enforce_eager=True), **kw))
    return spec, graphs, eager


def test_a_model_step_is_max_at_both_ends():
    spec, graphs, eager = _pair("qwen2.5-32b", "a100")
    host = eager.eager_host_s
    assert host == pytest.approx(spec.num_layers * rf.EAGER_LAYER_S["vllm"])
    for c, s in ((1, 100), (1, 20000), (64, 1000), (256, 4000)):
        device = graphs.decode_step_s(c, s)  # the CUDA-graph path is the device's time
        assert eager.decode_step_s(c, s) == pytest.approx(max(host, device))
        assert eager.decode_step_s(c, s) < device + host  # never the sum
    assert eager.decode_step_s(1, 100) == pytest.approx(host)  # batch 1: host-bound
    assert eager.decode_step_s(256, 4000) == pytest.approx(graphs.decode_step_s(256, 4000))  # device-bound
    q = np.array([8.0, 8192.0])
    assert eager.prefill_tokens_s(q, q * 512) == pytest.approx(np.maximum(graphs.prefill_tokens_s(q, q * 512), host))
    assert eager.mixed_step_s(np.array([4.0]), np.array([4000.0]), np.array([0.0]), np.array([0.0]))[0] == \
        pytest.approx(host)


def test_the_cuda_graph_path_is_unchanged():
    spec, graphs, _ = _pair("qwen2.5-7b", "h100")
    assert graphs.eager_host_s == 0.0
    per_layer = rf.LAYER_KERNELS_S + rf.GEMMS_PER_LAYER * rf.GEMM_FLOOR_S
    assert graphs.decode.t0_s == pytest.approx(rf.GRAPH_STEP_S + spec.num_layers * per_layer)
    d = graphs.decode
    direct = rf.decode_step_s(8, 1000, graphs.device_costs, d.t0_s, d.bw_bytes_per_s, d.phi_flops_per_s, d.smooth_p,
                              d.t_seq_s, d.bw_attn_bytes_per_s, d.bw_mem_bytes_per_s) \
        + rf.decode_elementwise_s(graphs.costs, 8, 1, d.bw_bytes_per_s)  # the small kernels' bytes (analytic)
    assert graphs.decode_step_s(8, 1000) == pytest.approx(direct)


def test_a_fitted_engine_gets_no_host_floor():
    _, _, eager = _pair("qwen2.5-0.5b", "h100")
    fitted = eager.model_copy(update={"source": "fit"})
    assert fitted.eager_host_s == 0.0 and fitted.decode_step_s(1, 100) < eager.decode_step_s(1, 100)


def test_a_training_pass_keeps_its_additive_launches():
    assert rf.TRAIN_LAYER_LAUNCH_S == pytest.approx((22.5e-3 - 13e-3) / 28, rel=0.01)
    # a forward under FSDP: the measured multiple of a plain forward's host time
    assert rf.pass_launch_s(24) == pytest.approx(24 * rf.TRAIN_LAYER_LAUNCH_S * rf.FORWARD_HOST_RATIO)


def test_v0_and_sync_scheduling_host_work_precedes_the_launches():
    # the scheduling a step does on the host runs before its launches: launches + scheduling against the device
    assert rf.eager_host_step_s(20e-3, 2.4e-3, 13e-6, 100) == pytest.approx(20e-3 + 2.4e-3 + 1.3e-3)
    assert rf.eager_host_step_s(0.0, 2.4e-3, 13e-6, 100) == 0.0  # CUDA graphs: the device's step holds it
    np.testing.assert_allclose(rf.eager_host_step_s(10e-3, 0.0, 1e-5, np.array([1, 10])), [10.01e-3, 10.1e-3])
    spec = resolve_model("qwen2.5-0.5b").spec
    v1, v0 = (load_model(predict_analytic(spec, "h100", engine=EngineOptions(enforce_eager=True, engine_version=v)))
              for v in ("0.8.4", "0.8.4+v0"))
    host = 24 * rf.EAGER_LAYER_S["vllm"]
    # a host-bound eager step: V1 (no async scheduling) pays its launches and 13 us a sequence, V0 2.4 ms more
    assert v1.decode_step_s(64, 300) == pytest.approx(host + 64 * rf.SYNC_HOST_PER_SEQ_S)
    assert v0.decode_step_s(64, 300) - v1.decode_step_s(64, 300) == pytest.approx(rf.V0_STEP_HOST_S)


def test_a_later_vllm_that_ran_v0_is_written_plus_v0(capsys):
    assert rf.is_v0("vllm", "0.8.4+v0") and rf.is_v0("vllm", "0.6.3") and not rf.is_v0("vllm", "0.8.4")
    assert not rf.is_v0("sglang", "0.4.6+v0")
    from conftest import run_cli
    r = run_cli("predict", "-m", "qwen2.5-0.5b", "--gpu", "h100", "-c", "1", "--engine-version", "0.12.0+v0")
    assert r.returncode == 2 and "no V0 engine from 0.11 on" in r.stderr and "Traceback" not in r.stderr
    bare = run_cli("predict", "-m", "qwen2.5-0.5b", "--gpu", "h100", "-c", "1", "--engine-version", "v0")
    assert bare.returncode == 2 and "MAJOR.MINOR" in bare.stderr and "0.8.4+v0" in bare.stderr
