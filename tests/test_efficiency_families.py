"""Per-device-family efficiency defaults: one table in calibration.py, resolved from the datasheet key."""

import pytest

from throughputlab.calibration import DEFAULT_EFFICIENCIES, efficiencies_for, family_of
from throughputlab.models import resolve_model
from throughputlab.predict import predict_analytic
from throughputlab.records.peaks import lookup


@pytest.mark.parametrize("name, family", [("NVIDIA H100 80GB HBM3", "NVIDIA Hopper"), ("H20", "NVIDIA Hopper"),
                                          ("A100-SXM4-80GB", "NVIDIA Ampere"), ("L40S", "NVIDIA Ada"),
                                          ("AMD Instinct MI300X", "AMD CDNA3"), ("B200", "NVIDIA Blackwell")])
def test_family_resolves_from_datasheet_key(name, family):
    key = lookup(name).device
    assert family_of(key) == family
    assert family in efficiencies_for(key).source


def test_rows_with_figures_cite_them():
    a100 = efficiencies_for(lookup("a100").device)
    assert a100.decode_bw == pytest.approx(0.77) and "A100" in a100.source
    assert efficiencies_for("MI300X").decode_bw == pytest.approx(0.57)
    assert efficiencies_for("H100 SXM").decode_bw == pytest.approx(0.80)
    assert a100.prefill_phi == DEFAULT_EFFICIENCIES.prefill_phi  # fields without a measurement keep the default


def test_ada_parts_take_their_own_bandwidth_and_unknown_device_says_so():
    """Each Ada part its own bandwidth share (FluidX3D's table: L40S 67%, L4 76%, RTX 4090 85%, where the same
    table reads H100 80% and A100 77%, the Hopper and Ampere rows); the L40S's FLOP/s shares x 0.93."""
    l40s, l4, rtx = efficiencies_for("L40S"), efficiencies_for("L4"), efficiencies_for("RTX 4090")
    assert (l40s.decode_bw, l4.decode_bw, rtx.decode_bw) == pytest.approx((0.67, 0.76, 0.85))
    assert l40s.attention_bw == pytest.approx(0.67) and "FluidX3D" in l40s.source
    assert l40s.decode_phi == pytest.approx(0.93 * DEFAULT_EFFICIENCIES.decode_phi)
    assert l4.decode_phi == DEFAULT_EFFICIENCIES.decode_phi  # no matmul measurement behind it
    v100 = efficiencies_for(lookup("V100").device)
    assert family_of("V100") is None
    assert v100.model_dump(exclude={"source"}) == DEFAULT_EFFICIENCIES.model_dump(exclude={"source"})
    assert "V100: no device-family row" in v100.source


def test_predicted_header_names_the_row():
    pred = predict_analytic(resolve_model("qwen2.5-7b").spec, "a100", concurrency=(1,))
    header = next(n for n in pred.notes if n.startswith("efficiencies from"))
    assert "NVIDIA Ampere row" in header and "decode_bw 77%" in header
    assert pred.fit["model"]["source"] == "analytic"


def test_cdna3_compute_shares_follow_each_parts_max_achievable_flops():
    """MI300X and MI325X share the family's bandwidth figure but not its compute: AMD's max-achievable FLOPs
    (54% and 64.5% of the same 1,307 TFLOP/s peak) scale the stated shares, so the MI325X computes faster."""
    mi300x, mi325x = efficiencies_for("MI300X"), efficiencies_for("MI325X")
    assert mi300x.decode_bw == mi325x.decode_bw == pytest.approx(0.57)
    assert mi300x.prefill_phi < mi325x.prefill_phi < DEFAULT_EFFICIENCIES.prefill_phi
    assert mi300x.decode_phi / DEFAULT_EFFICIENCIES.decode_phi == pytest.approx(0.54 / 0.73, rel=0.01)
    assert mi325x.decode_phi / DEFAULT_EFFICIENCIES.decode_phi == pytest.approx(0.645 / 0.73, rel=0.01)
    assert "Max-Achievable FLOPs" in mi300x.source and "708 of 1,307" in mi300x.source
    assert family_of("MI325X") == family_of("MI300X") == "AMD CDNA3"


def test_cdna3_all_reduces_follow_rccl_on_xgmi():
    """MI300X and MI325X take their collectives from RCCL's all_reduce_perf on 8 MI300X, not NVLink's: a 4 MB
    TP-8 all-reduce (a 70B decode step of 256 sequences) costs 50-70 us as rccl-tests measured (51.7 us), more
    than the NVLink figures would give on the same 448 GB/s link, and the header says where they come from."""
    from throughputlab import roofline as rf

    for key in ("MI300X", "MI325X"):
        e = efficiencies_for(key)
        assert (e.tp_alpha_s, e.comm_bw) == (rf.XGMI_ALPHA_S, rf.XGMI_COMM_BW) and "RCCL" in e.source
    link = 448e9

    def ar(e):
        return rf.tp_allreduce_s(4 * 2**20, 8, e.comm_bw * link, e.tp_alpha_s, e.tp_small_alpha_s,
                                 e.tp_small_bw_share * link)
    amd, nvlink_figures = ar(efficiencies_for("MI300X")), ar(DEFAULT_EFFICIENCIES)
    assert 50e-6 < amd < 70e-6 and amd > 1.3 * nvlink_figures
    small = rf.tp_allreduce_s(256 * 1024, 8, 0.7 * link, rf.XGMI_ALPHA_S, rf.XGMI_SMALL_ALPHA_S,
                              rf.XGMI_SMALL_BW_SHARE * link)
    assert small == pytest.approx(10.26e-6, rel=0.1)  # rccl-tests under graphs: 256 KB in 10.26 us
    header = next(n for n in predict_analytic(resolve_model("qwen2.5-7b").spec, "mi300x", concurrency=(1,)).notes
                  if n.startswith("efficiencies from"))
    assert "tp_alpha_s 56 us" in header and "RCCL" in header


def test_fp8_gemms_reach_a_smaller_share_than_bf16_ones_from_the_mamf_tables():
    """FP8 weights: the decode and prefill FLOP/s are the dtype's peak times the family's share times the FP8 factor
    (Hopper 0.90, Blackwell 0.98-0.99, CDNA3 0.90); BF16 and training keep theirs; GB200 and B200 take their MAMF."""
    from throughputlab.predict import analytic_model

    spec = resolve_model("llama3.1-8b").spec
    hopper = efficiencies_for("H100 SXM")
    bf16, _, _ = analytic_model(spec, "h100", "bfloat16", hopper)
    fp8, _, _ = analytic_model(spec, "h100", "fp8", hopper)
    assert fp8.decode.phi_flops_per_s / bf16.decode.phi_flops_per_s == pytest.approx(2 * 0.90, rel=0.01)
    assert fp8.prefill.phi_flops_per_s / bf16.prefill.phi_flops_per_s == pytest.approx(2 * 0.90, rel=0.01)
    assert efficiencies_for("A100 80GB SXM").fp8_gemm_share == 1.0  # no FP8 tensor cores, no figure
    gb200, b200 = efficiencies_for("GB200"), efficiencies_for("B200")
    assert gb200.decode_phi == pytest.approx(0.50 * 0.91) and b200.decode_phi == pytest.approx(0.50 * 0.97)
    assert "ml-engineering" in gb200.source and "x 0.90 with FP8 weights" in efficiencies_for("MI300X").source


def test_cdna3_decode_gemms_pay_their_published_floor():
    """A batch-1 weight GEMM on MI300X takes 7.2 us above its bytes (ROCm/aiter PR #1092), against 4 us on H100:
    every decode step pays the difference on each of its GEMMs."""
    from throughputlab import roofline as rf
    from throughputlab.predict import Layout
    mi = efficiencies_for("MI300X")
    assert mi.gemm_floor_s == pytest.approx(7.2e-6) and "aiter PR #1092" in mi.source
    assert efficiencies_for("H100 SXM").gemm_floor_s == rf.GEMM_FLOOR_S == DEFAULT_EFFICIENCIES.gemm_floor_s
    assert efficiencies_for("MI325X").gemm_floor_s == mi.gemm_floor_s
    from throughputlab.predict import analytic_model
    spec = resolve_model("llama3.1-8b").spec
    m, _, _ = analytic_model(spec, "MI300X", "bfloat16", mi, Layout(gpus=1))
    n, _, _ = analytic_model(spec, "MI300X", "bfloat16", mi.model_copy(update={"gemm_floor_s": rf.GEMM_FLOOR_S}),
                             Layout(gpus=1))
    extra = spec.num_layers * rf.GEMMS_PER_LAYER * (7.2e-6 - rf.GEMM_FLOOR_S)
    assert m.decode_step_s(1, 256) - n.decode_step_s(1, 256) == pytest.approx(extra)


def test_a_grace_host_scales_the_engines_host_work():
    """GB200's Grace CPU dispatches PyTorch ops 2.75x slower than an x86 H100 host (TransformerEngine #2053):
    its eager launches and its sync scheduling's per-sequence host time are that much longer."""
    from throughputlab import roofline as rf
    from throughputlab.predict import Layout, analytic_model
    from throughputlab.predict_engine import EngineOptions
    gb = efficiencies_for("GB200")
    assert gb.host_factor == pytest.approx(2.75) and "#2053" in gb.source
    assert efficiencies_for("B200").host_factor == efficiencies_for("H100 SXM").host_factor == 1.0
    spec = resolve_model("qwen2.5-0.5b").spec
    eager = EngineOptions(enforce_eager=True, engine_version="0.10.0")
    m, _, _ = analytic_model(spec, "GB200", "bfloat16", gb, Layout(gpus=1), eager)
    n, _, _ = analytic_model(spec, "GB200", "bfloat16", gb.model_copy(update={"host_factor": 1.0}), Layout(gpus=1),
                             eager)
    assert m.eager_host_s == pytest.approx(2.75 * n.eager_host_s)
    assert m.decode.t_seq_s == pytest.approx(2.75 * rf.SYNC_HOST_PER_SEQ_S)
    assert m.decode_step_s(64, 200) > n.decode_step_s(64, 200)
