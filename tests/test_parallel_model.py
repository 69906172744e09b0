"""The multi-device terms of the model: tensor-parallel shards and all-reduces, FSDP traffic and
memory per rank, and `predict --gpus/--tp/--nodes` as a user runs it."""

from __future__ import annotations

import pytest

from conftest import assert_user_error, run_cli
from throughputlab import roofline as rf
from throughputlab.fit import load_model
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, predict_analytic
from throughputlab.records.peaks import lookup
from throughputlab.roofline import Costs


def test_bus_bandwidth_formulas_by_hand():
    # nccl-tests: all-reduce busbw = algbw * 2(n-1)/n, all-gather and reduce-scatter algbw * (n-1)/n
    assert rf.allreduce_s(8e6, 8, 100e9, 5e-6) == pytest.approx(5e-6 + 8e6 * 2 * 7 / 8 / 100e9)
    assert rf.allgather_s(8e6, 4, 100e9) == pytest.approx(8e6 * 3 / 4 / 100e9)
    assert rf.allreduce_s(8e6, 1, 100e9, 5e-6) == 0.0 and rf.reduce_scatter_s(1e9, 1, 1e9) == 0.0


def test_tensor_parallel_shards_weights_and_kv_and_adds_two_all_reduces_per_layer():
    spec = resolve_model("qwen2.5-72b").spec  # 8 KV heads
    costs = Costs.from_spec(spec, 2)
    two = rf.tp_shard(costs, 2)
    assert two.weight_bytes == pytest.approx(costs.weight_bytes / 2)
    assert two.kv_bytes_per_token == pytest.approx(costs.kv_bytes_per_token / 2)
    assert rf.tp_shard(costs, 16).kv_bytes_per_token == pytest.approx(costs.kv_bytes_per_token / 8)  # replicated heads
    comm = rf.tp_comm_s(costs, 4, 2, 360e9, 10e-6)
    assert comm == pytest.approx(2 * 80 * (10e-6 + 4 * 8192 * 2 * 2 * 1 / 2 / 360e9))


def test_small_kernels_move_the_hidden_width_on_every_rank_of_a_tensor_parallel_group():
    costs = Costs.from_spec(resolve_model("llama3.1-70b").spec, 1)  # FP8 weights, 16-bit activations
    h, inter = 8192, 28672
    assert rf.decode_elementwise_bytes(costs, 1) == pytest.approx(2 * (8 * h + 2 * h + 3 * inter))
    eight = rf.decode_elementwise_bytes(costs, 8)
    assert eight == pytest.approx(2 * (8 * h + (2 * h + 3 * inter) / 8))
    assert eight > 0.45 * rf.decode_elementwise_bytes(costs, 1)  # the norms' share is not divided by TP
    # layers x tokens x bytes / BW, linear in the tokens
    assert rf.decode_elementwise_s(costs, 1516, 8, 2.68e12) == pytest.approx(80 * 1516 * eight / 2.68e12)
    moe = Costs.from_spec(resolve_model("qwen3-30b-a3b").spec, 2)  # 48 MoE layers of 48, top 8, hidden 2048
    assert rf.decode_elementwise_bytes(moe, 1) == pytest.approx(
        2 * (8 * 2048 + 2 * 2048 + 3 * moe.mlp_width + (8 + 1) * 2048))


def test_predicted_decode_steps_hold_the_small_kernels_and_fitted_ones_do_not():
    spec = resolve_model("llama3.1-70b").spec
    model = load_model(predict_analytic(spec, "h100", dtype="fp8", concurrency=(1,), layout=Layout(gpus=8, tp=8)))
    c, s = 1024, 1152.0
    small = 80 * c * rf.decode_elementwise_bytes(model.costs, 8) / model.decode.bw_bytes_per_s
    fitted = model.model_copy(update={"source": "fit"})
    assert model.decode_step_s(c, s) - fitted.decode_step_s(c, s) == pytest.approx(small)
    assert model.mixed_step_s(c, c * s, 0.0, 0.0) - fitted.mixed_step_s(c, c * s, 0.0, 0.0) == pytest.approx(small)
    assert 0.05 < small / model.decode_step_s(c, s) < 0.2
    # calibrated rates hold one device's small kernels: a TP group adds only what its ranks repeat
    calibrated = model.model_copy(update={"source": "calibrated"})
    repeated = small - 80 * c * rf.decode_elementwise_bytes(model.costs, 1) / 8 / model.decode.bw_bytes_per_s
    assert calibrated.decode_step_s(c, s) - fitted.decode_step_s(c, s) == pytest.approx(repeated)
    assert 0 < repeated < small
    one = model.model_copy(update={"source": "calibrated", "tp": 1})
    assert one.decode_step_s(c, s) == pytest.approx(one.model_copy(update={"source": "fit"}).decode_step_s(c, s))


def test_fsdp_traffic_and_memory_per_rank_by_hand():
    costs = Costs.from_spec(resolve_model("qwen2.5-7b").spec, 2)
    n, bw, alpha = 8, 300e9, 20e-6
    p = costs.total_weight_bytes / 2
    by_hand = 2 * (p * 2 * 7 / 8 / bw) + p * 4 * 7 / 8 / bw + 3 * (28 + 1) * alpha
    assert rf.fsdp_comm_s(costs, n, bw, alpha) == pytest.approx(by_hand)
    assert rf.fsdp_memory_per_rank_bytes(costs, 8, 2, 1e9) == pytest.approx(16 * p / 8 + 2e9)
    assert rf.train_flops(costs, 2, 512, recompute=True) == pytest.approx(4 / 3 * rf.train_flops(costs, 2, 512))


def test_predicted_tp2_engine_reads_half_the_weights_per_device():
    spec = resolve_model("qwen2.5-72b").spec
    one = load_model(predict_analytic(spec, "h200", concurrency=(1,)))
    two = load_model(predict_analytic(spec, "h200", concurrency=(1,), layout=Layout(gpus=2, tp=2)))
    s = 768.0
    d = two.decode
    shard = rf.tp_shard(two.costs, 2)
    c = two.comm  # the small-tensor regime of the all-reduce (custom all-reduce) applies at one sequence
    expected = d.t0_s + rf.decode_bytes(shard, 1, s) / d.bw_bytes_per_s + rf.tp_comm_s(
        two.costs, 1, 2, c.tp_busbw_bytes_per_s, c.tp_alpha_s, c.tp_small_alpha_s, c.tp_small_busbw_bytes_per_s) \
        + 80 * rf.decode_elementwise_bytes(two.costs, 2) / d.bw_bytes_per_s
    assert two.decode_step_s(1, s) == pytest.approx(expected)
    assert 1.6 < one.decode_step_s(1, s) / two.decode_step_s(1, s) < 2.0  # about 2x, less the all-reduces
    assert two.kv_cache_tokens > 2 * one.kv_cache_tokens  # the weights take half of each device


@pytest.mark.slow
def test_predict_on_eight_gpus_fits_the_reference_moe_and_names_the_layout():
    r = run_cli("predict", "--model", "qwen3-30b-a3b", "--gpu", "h200", "--gpus", "8")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("largest micro-batch that fits"))
    assert int(line.split(":")[1].split()[0]) >= 1
    assert "FSDP over 8 GPUs" in r.stdout and "8 engine(s) of TP 1" in r.stdout
    single = run_cli("predict", "--model", "qwen3-30b-a3b", "--gpu", "h200")
    assert "largest micro-batch that fits: 0" in single.stdout  # one device cannot hold its training state


@pytest.mark.slow
def test_predict_tp2_single_stream_bound_doubles():
    bw = lookup("h100").memory_bandwidth_bytes_per_s
    r = run_cli("predict", "--model", "qwen2.5-72b", "--gpu", "h100", "--tp", "2", "-c", "1")
    assert r.returncode == 0, r.stderr
    w = Costs.from_spec(resolve_model("qwen2.5-72b").spec, 2).weight_bytes
    assert f"{2 * bw / w:,.1f} tokens/s" in r.stdout
    assert "per engine of TP 2" in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("args,fragment", [
    (["--tp", "3", "--gpus", "8"], "--tp 3 does not divide"),
    (["--gpus", "8", "--nodes", "3"], "--nodes 3 does not divide --gpus 8"),
    (["--gpus", "16", "--nodes", "2", "--tp", "16"], "--tp 16 is larger than the 8 gpu(s) of a node"),
    # the settings model's check, worded as for every command's settings: the flag, its key, the rule, the value
    (["--gpus", "0"], "--gpus: layout.gpus: input should be greater than 0 (got 0)"),
    (["--tp", "0"], "--tp: layout.tp: input should be greater than 0 (got 0)"),  # not --gpus (defaults to tp x nodes)
    (["--nodes", "0"], "--nodes: layout.nodes: input should be greater than 0 (got 0)"),
])
def test_bad_layouts_get_one_line_errors(args, fragment):
    assert_user_error(run_cli("predict", "--model", "qwen2.5-7b", "--gpu", "h100", *args), fragment)


@pytest.mark.slow
def test_layout_flags_need_an_analytic_prediction(tmp_path):
    assert_user_error(run_cli("predict", "--profile", str(tmp_path / "p.json"), "--tp", "2"), "go with --model")
