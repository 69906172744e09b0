"""Training fidelity of the analytic predictor: published MFU per device family, activation
checkpointing none|selective|full, FSDP's exposed share within and across nodes (hand-computed)."""

import pytest

from conftest import run_main
from throughputlab import roofline as rf
from throughputlab.calibration import DEFAULT_EFFICIENCIES
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, analytic_model

pytestmark = pytest.mark.quick

COSTS = rf.Costs(weight_bytes=2e9, kv_bytes_per_token=1.0, flops_per_token=2e9, attn_flops_per_ctx_token=1e5,
                 bytes_per_param=2)


def test_train_flops_by_mode():
    # b=2, S=1000: dense F=2e9, attention core S*a/2 = 5e7 per token
    tok = 2 * 1000
    assert rf.train_flops(COSTS, 2, 1000, "none") == pytest.approx(tok * 3 * (2e9 + 5e7))
    assert rf.train_flops(COSTS, 2, 1000, "full") == pytest.approx(tok * 4 * (2e9 + 5e7))
    assert rf.train_flops(COSTS, 2, 1000, True) == rf.train_flops(COSTS, 2, 1000, "full")
    # selective: the attention core's forward once more only
    assert rf.train_flops(COSTS, 2, 1000, "selective") == pytest.approx(tok * (3 * 2e9 + 4 * 5e7))


def test_train_step_by_mode():
    t = rf.train_step_s(1, 1000, COSTS, 0.01, 1e14, "selective")
    assert t == pytest.approx(0.01 + 1000 * (3 * 2e9 + 4 * 5e7) / 1e14)
    # attention at its own rate: dense 3 passes, attention 4
    t = rf.train_step_s(1, 1000, COSTS, 0.0, 1e14, "selective", phi_attn=5e13)
    assert t == pytest.approx(1000 * 3 * 2e9 / 1e14 + 1000 * 4 * 5e7 / 5e13)
    assert rf.train_step_s(1, 1000, COSTS, 0.0, 1e14, False) == pytest.approx(1000 * 3 * 2.05e9 / 1e14)
    with pytest.raises(ValueError):
        rf.recompute_passes("bogus")


def test_activation_memory_by_mode():
    spec = resolve_model("llama3.1-8b").spec  # 32 layers, h 4096, vocab 128256
    s, h, L, v = 1024, 4096, 32, 128256
    none = L * s * h * 34 + s * v * 8
    assert rf.activation_bytes_per_sequence(spec, s, 2, "none") == pytest.approx(none)
    assert rf.activation_bytes_per_sequence(spec, s, 2, "selective") == pytest.approx(none)
    assert rf.activation_bytes_per_sequence(spec, s, 2, "full") == pytest.approx(L * s * h * 2 + s * h * 34 + s * v * 8)


def test_mfu_per_family():
    # 16-bit: the median over torchtitan, llm-foundry and fms-fsdp runs (H100: not torchtitan's 500 W parts)
    mfu, source = rf.train_mfu("A100 80GB SXM", "bfloat16")
    assert mfu == 0.59 and all(s in source for s in ("torchtitan", "llm-foundry", "fms-fsdp"))
    mfu, source = rf.train_mfu("H100 SXM", "bfloat16")
    assert mfu == 0.43 and all(s in source for s in ("torchtitan", "llm-foundry", "fms-fsdp"))
    assert rf.train_mfu("H100 SXM", "fp8")[0] == 0.23
    assert rf.train_mfu("H200", "fp8")[0] == 0.29
    mfu, source = rf.train_mfu("L40S", "bfloat16")
    assert mfu == 0.40 and "fallback" in source


def test_model_uses_family_mfu_and_exposed_share():
    spec = resolve_model("llama3.1-8b").spec
    m, _, peaks = analytic_model(spec, "A100 80GB SXM", "bfloat16",
                                 DEFAULT_EFFICIENCIES, Layout(gpus=16, nodes=2))
    assert m.train.phi_flops_per_s == pytest.approx(0.59 * peaks.datasheet_flops_per_s)
    assert m.comm.fsdp_hidden_share == pytest.approx(0.60)
    one, _, _ = analytic_model(spec, "H100 SXM", "bfloat16", DEFAULT_EFFICIENCIES, Layout(gpus=8))
    assert one.comm.fsdp_hidden_share == pytest.approx(1.0)
    # step = compute + 40% of fsdp_comm_s across nodes, where the compute is the longer
    comm = rf.fsdp_comm_s(m.costs, 16, m.comm.fsdp_busbw_bytes_per_s, m.comm.fsdp_alpha_s)
    compute = rf.train_step_s(2, 4096, m.costs, m.train.t0_s, m.train.phi_flops_per_s, False)
    assert compute > comm and m.train_step_s(2, 4096) == pytest.approx(compute + 0.40 * comm)


def test_cli_header_and_modes():
    r = run_main("predict", "-m", "llama3.1-8b", "--gpu", "h100", "-c", "1", "-b", "1",
                                  "--activation-checkpointing", "selective", "--gpus", "16", "--nodes", "2")
    assert r.exit_code == 0, r.output
    head = next(line for line in r.output.splitlines() if line.startswith("training, sequence length"))
    assert "activation checkpointing selective" in head and "MFU 43% (median of llm-foundry" in head
    assert "40% of its traffic exposed across nodes" in head
    bare = run_main("predict", "-m", "llama3.1-8b", "--gpu", "h100", "-c", "1", "-b", "1",
                                     "--activation-checkpointing")
    assert bare.exit_code == 0 and "activation checkpointing full" in bare.output
    unknown = run_main("predict", "-m", "llama3.1-8b", "--gpu", "l40s", "-c", "1", "-b", "1")
    assert "40% fallback" in unknown.output


def test_cli_bogus_checkpointing():
    r = run_main("predict", "-m", "llama3.1-8b", "--gpu", "h100",
                                  "--activation-checkpointing", "bogus")
    assert r.exit_code == 2
    lines = [x for x in r.output.strip().splitlines() if x]
    assert len(lines) == 1 and "--activation-checkpointing bogus" in lines[0]


def test_a_mixture_of_experts_trains_at_a_share_of_the_dense_rate_that_follows_its_experts_and_the_device():
    """Fine experts (Qwen3-30B-A3B: 0.38x the hidden size) train at 0.30 of a dense model's share of the peak on an
    H100 (published Megatron runs); the extra time is memory traffic, so on an H20 (0.13x the H100's FLOP/s per
    byte/s) the share is far higher; a dense model is untouched."""
    from throughputlab.records.peaks import balance_vs_reference, lookup, peak_flops

    moe = resolve_model("qwen3-30b-a3b").spec
    costs = rf.Costs.from_spec(moe, 2)
    assert rf.moe_train_share(costs)[0] == pytest.approx(0.30, abs=1e-9)
    h20 = balance_vs_reference(lookup("h20"), "bfloat16")
    assert h20 == pytest.approx((148e12 / 4.0e12) / (989e12 / 3.35e12), rel=0.05)
    assert rf.moe_train_share(costs, h20)[0] == pytest.approx(1 / (1 + (1 / 0.30 - 1) * h20))
    assert rf.moe_train_share(rf.Costs.from_spec(resolve_model("llama3.1-8b").spec, 2)) == (1.0, "")
    for gpu in ("h100", "h20"):
        ds = lookup(gpu)
        model, _, _ = analytic_model(moe, gpu)
        dense_share = rf.train_mfu(ds.device, "bfloat16")[0]
        share = rf.moe_train_share(costs, balance_vs_reference(ds, "bfloat16"))[0]
        phi = model.train.phi_flops_per_s
        assert phi == pytest.approx(dense_share * share * peak_flops(ds, "bfloat16"), rel=1e-9)


def test_training_tensor_parallel_runs_a_micro_batch_per_tp_group():
    """FSDP x TP (predict --train-tp): a micro-batch runs on a TP group, its compute split over the group plus the
    TP all-reduces of each pass; tokens/s are per GPU and the activations per device shrink by the TP size."""
    spec = resolve_model("llama3.1-8b").spec
    fsdp, _, _ = analytic_model(spec, "h100", layout=Layout(gpus=64, nodes=8))
    tp8, _, _ = analytic_model(spec, "h100", layout=Layout(gpus=64, nodes=8, train_tp=8))
    b, s = 8, 8192
    one_gpu = fsdp.train_step_s(b, s)
    assert tp8.train_step_s(b, s) > one_gpu / 8  # plus the TP collectives
    assert tp8.train_tokens_per_s(b, s) < fsdp.train_tokens_per_s(b, s)  # per GPU: the TP all-reduces cost
    assert tp8.train_tokens_per_s(b, s) > 0.5 * fsdp.train_tokens_per_s(b, s)


@pytest.mark.parametrize("args, fragment", [
    (["--train-tp", "3"], "--train-tp 3 does not divide the 8 GPU(s) of a node"),
    (["--train-tp", "16", "--gpus", "16", "--nodes", "2"], "--train-tp 16 does not divide the 8 GPU(s)"),
    (["--train-tp", "0"], "--train-tp"),
])
def test_train_tp_bad_values_are_one_line(args, fragment):
    r = run_main("predict", "-m", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", *args) if "--gpus" not in args \
        else run_main("predict", "-m", "llama3.1-8b", "--gpu", "h100", *args)
    out = r.output.strip()
    assert r.exit_code == 2 and len(out.splitlines()) == 1 and fragment in out, out
