"""Megatron's training FLOP/s share: a Megatron run on a predicted profile trains at TRAIN_MFU_MEGATRON's share
of the peak, an FSDP run at TRAIN_MFU's, a fitted profile at its measured rate; decide's output names the share
and its source."""

from __future__ import annotations

import pytest

from throughputlab import roofline as rf
from throughputlab.decide.calculator import DecideSpec, decide_from_spec
from throughputlab.decide.shape import RLShape
from throughputlab.decide.steptime import StepModel
from throughputlab.models import resolve_model
from throughputlab.predict import analytic_model
from throughputlab.records.peaks import lookup, peak_flops

SHAPE = {"prompt_len": 256, "response": {"dist": "lognormal:mean=512,sigma=0.6,max=1024"},
         "train": {"micro_batch": 2}}


def _steps(model, backend, device):
    shape = RLShape.model_validate({**SHAPE, "train": {**SHAPE["train"], "backend": backend}})
    return StepModel(model, shape, device=device)


def _train_phi(model, backend, device="H100 SXM"):
    return _steps(model, backend, device).train_model.train.phi_flops_per_s


@pytest.mark.parametrize("gpu, dtype, megatron", [("h100", "bfloat16", 0.52), ("h100", "fp8", 0.35)])
def test_megatron_trains_at_its_share_fsdp_at_its_own(gpu, dtype, megatron):
    model = analytic_model(resolve_model("qwen2.5-7b").spec, gpu, dtype)[0]
    peak = peak_flops(lookup(gpu), dtype)
    assert rf.train_mfu("H100 SXM", dtype, "megatron")[0] == megatron
    assert _train_phi(model, "fsdp") == pytest.approx(rf.train_mfu("H100 SXM", dtype)[0] * peak)
    assert _train_phi(model, "megatron") == pytest.approx(megatron * peak)


def test_fitted_profile_keeps_its_measured_rate():
    fitted = analytic_model(resolve_model("qwen2.5-7b").spec, "h100")[0].model_copy(update={"source": "fit"})
    measured = fitted.train.phi_flops_per_s
    assert _train_phi(fitted, "megatron") == measured == _train_phi(fitted, "fsdp")


def test_no_published_megatron_run_keeps_the_fsdp_share():
    model = analytic_model(resolve_model("qwen2.5-7b").spec, "a100")[0]
    assert _train_phi(model, "megatron", "A100 80GB SXM") == pytest.approx(model.train.phi_flops_per_s)
    assert "no published Megatron run" in rf.train_mfu("A100 80GB SXM", "bfloat16", "megatron")[1]


def test_decide_says_which_share_megatron_trained_at(q7_8xh100):
    spec = DecideSpec.model_validate({"profile": q7_8xh100, "prompts": [64], "group": 8, "cluster": {"gpus": 8},
                                      "shape": {**SHAPE, "train": {**SHAPE["train"], "backend": "megatron"}}})
    notes = " ".join(decide_from_spec(spec)[0].notes)
    assert "Megatron training at 52% of the" in notes and "dgxc-benchmarking" in notes


def test_the_profiles_device_decides_the_share_not_a_rate_that_happens_to_match():
    """The Megatron share is the named device's: a profile with no device or one without a datasheet row, or
    a rate that is not that row's FSDP share (calibrated), keeps its rate and says why."""
    model = analytic_model(resolve_model("qwen2.5-7b").spec, "h100")[0]
    phi = model.train.phi_flops_per_s
    for device, why in [(None, "no datasheet row"), ("Mystery GPU 9000", "no datasheet row"),
                        ("A100 80GB SXM", "not the A100 80GB SXM row's FSDP share")]:
        steps = _steps(model, "megatron", device)
        assert steps.train_model.train.phi_flops_per_s == phi
        assert why in steps.train_rate_note
    calibrated = model.model_copy(update={"train": model.train.model_copy(update={"phi_flops_per_s": 0.9 * phi})})
    assert _train_phi(calibrated, "megatron") == pytest.approx(0.9 * phi)
    assert _train_phi(model, "megatron") == pytest.approx(0.52 * peak_flops(lookup("h100"), "bfloat16"))


@pytest.mark.parametrize("backend, said", [("fsdp", True), ("megatron", False)])
def test_megatrons_layout_under_fsdp_is_said_not_dropped(q7_8xh100, backend, said):
    spec = DecideSpec.model_validate({"profile": q7_8xh100, "prompts": [64], "group": 8, "cluster": {"gpus": 8},
                                      "shape": {**SHAPE, "train": {**SHAPE["train"], "backend": backend,
                                                                   "tp": 2, "pp": 2}}})
    notes = [n for n in decide_from_spec(spec)[0].notes if "ignored" in n]
    assert bool(notes) == said
    if said:
        assert notes[0].startswith("train tp 2, pp 2 ignored") and "--train-backend megatron" in notes[0]


def test_megatron_on_a_mixture_of_experts_keeps_its_share_and_reads_older_profiles():
    """A predicted MoE profile trains under Megatron at Megatron's share times the MoE share; a profile predicted
    before the MoE share (its rate the dense FSDP share) gets the same; the note states the share it gives."""
    from throughputlab import roofline as rf
    from throughputlab.decide.backend import backend_train_model
    from throughputlab.models import resolve_model
    from throughputlab.predict import analytic_model
    from throughputlab.records.peaks import lookup, peak_flops

    model, _, _ = analytic_model(resolve_model("qwen3-30b-a3b").spec, "h100")
    peak = peak_flops(lookup("h100"), "bfloat16")
    moe = rf.moe_train_share(model.costs)[0]
    want = rf.train_mfu("H100 SXM", "bfloat16", "megatron")[0] * moe * peak
    older = model.model_copy(update={"train": model.train.model_copy(update={
        "phi_flops_per_s": rf.train_mfu("H100 SXM", "bfloat16")[0] * peak})})
    for m in (model, older):
        out, note = backend_train_model(m, "megatron", "H100 SXM")
        assert out.train.phi_flops_per_s == pytest.approx(want, rel=1e-9)
        assert f"Megatron training at {want / peak:.0%} of the H100 SXM" in note and "mixture of experts" in note


def test_cdna3_trains_at_h100s_fsdp_share_scaled_by_its_gemm_share():
    h100 = rf.train_mfu("H100 SXM", "bfloat16")[0]
    mi300x, src = rf.train_mfu("MI300X", "bfloat16")
    assert mi300x == pytest.approx(h100 * 0.54 / 0.73, abs=0.01) and "max-achievable" in src
    assert rf.train_mfu("MI325X", "bfloat16")[0] == pytest.approx(h100 * 0.645 / 0.73, abs=0.01)
    assert mi300x < rf.TRAIN_MFU_FALLBACK  # no longer the 40% fallback
    assert "fallback" in rf.train_mfu("MI300X", "fp8")[1]  # no FP8 figure: said so
