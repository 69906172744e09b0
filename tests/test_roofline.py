"""The roofline module: hand-computed costs, arrays equal to scalars, one formula per cost, and
the defects a single physics fixed (MoE short-context knee, untied embedding in the weight sync)."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from throughputlab import roofline as rf
from throughputlab.decide.steptime import RLShape, StepModel
from throughputlab.models import resolve_model
from throughputlab.roofline import Costs
from throughputlab.throughput import DecodeParams, PrefillParams, ThroughputModel, TrainParams

PKG = Path(__file__).resolve().parent.parent / "throughputlab"
DENSE = Costs(bytes_per_param=2, weight_bytes=1e9, kv_bytes_per_token=1e5, flops_per_token=1e9,
              attn_flops_per_ctx_token=1e4)


def test_decode_step_by_hand():
    c, s, t0, bw, phi = 8, 100, 1e-3, 1e12, 1e14
    mem = (1e9 + 8 * 100 * 1e5) / 1e12
    comp = 8 * (1e9 + 100 * 1e4) / 1e14
    assert rf.decode_step_s(c, s, DENSE, t0, bw, phi) == pytest.approx(t0 + max(mem, comp))
    assert rf.decode_step_s(c, s, DENSE, t0, bw, phi, p=1.0, t_seq=1e-5) == pytest.approx(t0 + 8e-5 + mem + comp)
    assert rf.prefill_s(2, 50, DENSE, t0, bw, phi) == pytest.approx(t0 + max(1e9 / 1e12, 100 * (1e9 + 25 * 1e4) / 1e14))
    assert rf.train_step_s(4, 64, DENSE, 0.01, 1e13) == pytest.approx(0.01 + 3 * 4 * 64 * (1e9 + 32 * 1e4) / 1e13)
    assert rf.forward_pass_s(4, 64, DENSE, 0.01, 1e13) == pytest.approx(0.01 + 4 * 64 * (1e9 + 32 * 1e4) / 1e13)


def test_every_function_takes_arrays_and_gives_the_scalar_answers():
    moe = Costs.from_spec(resolve_model("qwen3-30b-a3b").spec, 2)
    cs = np.array([1.0, 3.0, 17.0, 256.0, 4096.0])
    for costs in (DENSE, moe):
        for p in (None, 2.5):
            arr = rf.decode_step_s(cs, 300.0, costs, 1e-3, 3e12, 5e14, p, 1e-6)
            assert isinstance(arr, np.ndarray) and arr.shape == cs.shape
            one = [rf.decode_step_s(float(c), 300.0, costs, 1e-3, 3e12, 5e14, p, 1e-6) for c in cs]
            assert all(isinstance(x, float) for x in one)
            np.testing.assert_allclose(arr, one, rtol=1e-12)
        np.testing.assert_allclose(rf.weight_bytes(costs, cs), [rf.weight_bytes(costs, c) for c in cs], rtol=1e-12)
        np.testing.assert_allclose(rf.prefill_s(cs, 128, costs, 1e-3, 3e12, 5e14),
                                   [rf.prefill_s(c, 128, costs, 1e-3, 3e12, 5e14) for c in cs], rtol=1e-12)
        # a mixed step without prefill tokens is the decode step at the mean context
        dec = cs
        np.testing.assert_allclose(rf.mixed_step_s(costs, dec, dec * 300.0, 0 * cs, 0 * cs, 1e-3, 3e12, 5e14, 7e14),
                                   rf.decode_step_s(cs, 300.0, costs, 1e-3, 3e12, 5e14), rtol=1e-12)
    assert rf.combine(0.0, 0.0, 3.0) == 0.0 and rf.combine(0.0, 2.0, 3.0) == pytest.approx(2.0)


def test_largest_micro_batch_from_the_memory_line():
    assert rf.max_micro_batch(2e9, 0.5e9, 8e9) == 12
    assert rf.max_micro_batch(2e9, 0.5e9, 8e9, smallest_oom=9) == 8  # a measured OOM caps the line
    assert rf.max_micro_batch(2e9, 0.5e9, 8e9, smallest_oom=20) == 12
    assert rf.max_micro_batch(9e9, 0.5e9, 8e9) == 0
    assert rf.max_micro_batch(None, 0.5e9, 8e9) is None and rf.max_micro_batch(2e9, -1.0, 8e9) is None


@pytest.mark.slow
def test_moe_short_context_knee_counts_the_experts_the_batch_touches():
    """With one token's weights the knee of Qwen3-30B-A3B on an H200 came out near 129; the bytes
    grow with the experts touched, so the crossing is about ten times further out."""
    costs = Costs.from_spec(resolve_model("qwen3-30b-a3b").spec, 2)
    bw, phi = 0.8 * 4.8e12, 0.5 * 989e12
    k0 = rf.short_context_knee(costs, bw, phi)
    one_token = phi / bw * costs.weight_bytes / costs.flops_per_token
    assert one_token < 200 and k0 > 5 * one_token
    # at the knee the two terms are equal
    assert rf.decode_bytes(costs, k0, 0) / bw == pytest.approx(rf.decode_flops(costs, k0, 0) / phi, rel=1e-6)
    r = run_cli("predict", "--model", "qwen3-30b-a3b", "--gpu", "h200")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("knee as the context goes to 0"))
    assert 1000 < float(line.split(":")[1]) < 2000


def test_weight_sync_and_critic_count_the_untied_input_embedding():
    spec = resolve_model("qwen2.5-7b").spec  # untied: the input embedding is 7% of the weights
    assert not spec.tie_word_embeddings
    costs = Costs.from_spec(spec, 2)
    assert rf.all_weight_bytes(costs) == spec.params_total * 2
    assert rf.all_weight_bytes(costs) > costs.weight_bytes + 0.9 * spec.params_embedding * 2
    m = ThroughputModel(source="analytic", costs=costs,
                        decode=DecodeParams(t0_s=1e-3, bw_bytes_per_s=4e12, phi_flops_per_s=5e14),
                        prefill=PrefillParams(t0_s=1e-3, bw_bytes_per_s=4e12, phi_flops_per_s=6e14),
                        train=TrainParams(t0_s=0.01, phi_flops_per_s=4e14, optimizer_step_s=0.1, mem0_bytes=1e9,
                                          mem_per_sample_bytes=1e9, device_memory_bytes=80e9))
    sm = StepModel(m, RLShape.model_validate({"prompt_len": 64, "response": {"dist": "fixed:len=32"}}))
    assert sm.sync_s == pytest.approx(2 * spec.params_total * 2 / 4e12)
    # the critic's optimizer step scales with every weight of both models, embeddings included
    ppo = StepModel(m, RLShape.model_validate({"algo": "ppo", "prompt_len": 64, "response": {"dist": "fixed:len=32"},
                                                "critic": {"model": "qwen2.5-0.5b"}}),
                    critic_costs=Costs.from_spec(resolve_model("qwen2.5-0.5b").spec, 2))
    assert ppo.critic_model.costs.total_weight_bytes == resolve_model("qwen2.5-0.5b").spec.params_total * 2


def _names_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}


def test_cost_terms_live_in_the_roofline_module_only():
    """W, k, F and a are combined into times, bytes or FLOPs in the roofline package alone: any other
    module of the package that reads them is deriving physics itself."""
    terms = {"kv_bytes_per_token", "flops_per_token", "attn_flops_per_ctx_token", "moe_expert_bytes"}
    allowed = {PKG / "models" / "spec.py", PKG / "commands" / "info.py"}  # info: a listing
    offenders = {str(p.relative_to(PKG)): sorted(terms & _names_in(p)) for p in PKG.rglob("*.py")
                 if p not in allowed and p.parent != PKG / "roofline" and terms & _names_in(p)}
    assert not offenders, offenders


def test_no_module_is_much_over_400_lines():
    long = {str(p.relative_to(PKG)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 420}
    assert not long, long


@pytest.mark.slow
def test_fit_schema_imports_no_scipy():
    import subprocess
    import sys

    code = ("import sys; import throughputlab.fit.schema, throughputlab.predict, throughputlab.decide.calculator, "
            "throughputlab.report.profile_report; print('scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_knee_is_where_the_terms_cross_for_dense_models():
    k = rf.knee(DENSE, 100.0, 1e12, 1e14)
    assert rf.decode_bytes(DENSE, k, 100.0) / 1e12 == pytest.approx(rf.decode_flops(DENSE, k, 100.0) / 1e14)
    assert rf.knee(DENSE, 1e9, 1e12, 1e14) is None  # KV reads outgrow the arithmetic: memory-bound everywhere
    assert math.isclose(rf.knee(DENSE, 100.0, 1e12, 1e14), rf.knee_concurrency_numeric(DENSE, 100.0, 1e12, 1e14),
                        rel_tol=1e-6)


def test_kv_reads_never_run_faster_than_the_memorys_read_bandwidth():
    c, s, t0, bw, phi = 8, 100, 1e-3, 1e12, 1e14
    comp = 8 * (1e9 + 100 * 1e4) / 1e14
    capped = rf.decode_step_s(c, s, DENSE, t0, bw, phi, bw_mem=2.5e11)
    assert capped == pytest.approx(t0 + max(1e9 / 1e12 + 8 * 100 * 1e5 / 2.5e11, comp))
    assert rf.decode_step_s(c, s, DENSE, t0, bw, phi, bw_mem=2e12) == rf.decode_step_s(c, s, DENSE, t0, bw, phi)
    # per-kernel form: the attention at min(BW_attn, bw_mem); a slower BW_attn is kept
    split = rf.decode_step_s(c, s, DENSE, t0, bw, phi, bw_attn=5e11, bw_mem=2.5e11)
    assert split == pytest.approx(t0 + max(1e9 / 1e12, 8 * 1e9 / 1e14) + 800 * max(1e5 / 2.5e11, 1e4 / 1e14))
    assert rf.kv_read_rate(bw, 1e11, 2.5e11) == 1e11
    # the continuous-batching step without prefill is the decode step, capped alike in both forms
    for ba in (None, 5e11):
        assert rf.mixed_step_s(DENSE, c, c * s, 0, 0, t0, bw, phi, 5e14, bw_attn=ba, bw_mem=2.5e11) == \
            pytest.approx(rf.decode_step_s(c, s, DENSE, t0, bw, phi, bw_attn=ba, bw_mem=2.5e11))
    # the knee is where the capped memory time meets the compute time
    k = rf.knee(DENSE, 50.0, bw, phi, bw_mem=8e11)
    rate = rf.kv_read_rate(bw, None, 8e11)
    assert rf.decode_mem_s(DENSE, k, 50.0, bw, rate) == pytest.approx(rf.decode_flops(DENSE, k, 50.0) / phi)
    assert k > rf.knee(DENSE, 50.0, bw, phi)  # slower KV reads: memory-bound up to a larger concurrency


def test_overlap_hides_no_more_comm_than_there_is_compute():
    # fully hidden: the longer of the two; comm shorter than compute costs nothing
    assert rf.exposed_s(0.10, 0.04, 1.0) == pytest.approx(0.10)
    assert rf.exposed_s(0.10, 0.25, 1.0) == pytest.approx(0.25)  # a small micro-batch waits for its collectives
    # a share exposed: compute + (1 - h) * comm, never below comm itself
    assert rf.exposed_s(0.10, 0.04, 0.6) == pytest.approx(0.10 + 0.4 * 0.04)
    assert rf.exposed_s(0.10, 0.50, 0.6) == pytest.approx(0.50)
    np.testing.assert_allclose(rf.exposed_s(np.array([0.1, 0.1]), np.array([0.04, 0.25]), 1.0), [0.10, 0.25])


def test_network_rates_follow_the_traffic_pattern():
    nic, nvlink = 40e9, 360e9
    # one node: the node's link whatever the NICs
    assert rf.fsdp_link_bytes_per_s(nvlink, 1, nic, 8) == nvlink
    # a ring across nodes leaves each node through its GPUs' NICs together, capped by the node's link
    assert rf.fsdp_link_bytes_per_s(nvlink, 2, nic, 4) == pytest.approx(160e9)
    assert rf.fsdp_link_bytes_per_s(nvlink, 2, nic, 16) == pytest.approx(nvlink)
    # an all-to-all or a refit: each GPU's own NIC
    assert rf.own_nic_bytes_per_s(nvlink, 2, nic) == pytest.approx(nic)
    assert rf.own_nic_bytes_per_s(nvlink, 1, nic) == pytest.approx(nvlink)
