"""vLLM's sleep and wake-up around each update of colocated engines (roofline.rl.sleep_wake_s): bytes over the
host link at level 1, a fixed part only at level 2; decide charges it on colocated placements, not on splits."""

from __future__ import annotations

import pytest

from throughputlab import roofline as rf
from throughputlab.decide.calculator import DecideSpec, decide_from_spec
from throughputlab.fit import load_model
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, predict_analytic
from throughputlab.records.peaks import PCIE_GEN5_BYTES_PER_S
from throughputlab.records.profile import Profile
from throughputlab.roofline import rl

G = 1e9


def test_level_one_grows_with_the_weights_a_gpu_holds_and_level_two_moves_none():
    small, large = rl.sleep_wake_s(1 * G, 1), rl.sleep_wake_s(60 * G, 1)
    assert large > small > rl.sleep_wake_s(1 * G, 2)
    # both directions over the host link: 2 x 59 GB at 21.6 GB/s, plus the fixed part
    assert large - small == pytest.approx(2 * 59 * G / (rl.HOST_LINK_BYTES_PER_S * rl.HOST_COPY_EFFICIENCY))
    assert rl.sleep_wake_s(1 * G, 2) == rl.sleep_wake_s(60 * G, 2) == pytest.approx(
        rl.SLEEP_FIXED_S + rl.WAKE_FIXED_S)
    # two GPUs behind one host uplink halve each one's rate
    assert rl.wake_s(60 * G, 1, 8) - rl.WAKE_FIXED_S == pytest.approx(2 * (rl.wake_s(60 * G, 1, 1) - rl.WAKE_FIXED_S))
    with pytest.raises(ValueError):
        rl.sleep_wake_s(1 * G, 3)


@pytest.mark.parametrize("gb, gpus, published_wake_s", [(61.0, 1, 2.87), (235 / 4, 4, 5.41)])
def test_level_one_wake_matches_the_published_large_models(gb, gpus, published_wake_s):
    # vLLM blog, 2025-10-26, A100, level 1: Qwen3-Coder-30B-A3B TP 1, Qwen3-235B-A22B FP8 TP 4
    assert rl.wake_s(gb * G, 1, gpus) == pytest.approx(published_wake_s, rel=0.1)


@pytest.fixture(scope="module")
def q7_8xh100(tmp_path_factory):
    path = tmp_path_factory.mktemp("sleep") / "q7.json"
    predict_analytic(resolve_model("qwen2.5-7b").spec, "h100", layout=Layout(gpus=8)).save(path)
    return str(path)


def _sync(profile, **cluster):
    spec = DecideSpec.model_validate({"profile": profile, "prompts": [128], "group": 8, "cluster": cluster,
                                      "shape": {"prompt_len": 1024, "response": {"dist": "lognormal:mean=256,sigma=0.5,max=512"}}})
    return decide_from_spec(spec)[0].rows[0].step.sync_s


def test_decide_charges_sleep_and_wake_on_colocated_engines_only(q7_8xh100):
    colo, none = _sync(q7_8xh100), _sync(q7_8xh100, sleep_wake_s=0.0)
    w = rf.all_weight_bytes(load_model(Profile.load(q7_8xh100)).costs)
    # 8 engines of TP 1 on one node: each GPU offloads and reloads the whole model, two GPUs to a host link,
    # the H100's PCIe Gen5 (records.peaks.host_link)
    gen5 = PCIE_GEN5_BYTES_PER_S
    assert colo - none == pytest.approx(rl.sleep_wake_s(w, 1, 8, gen5), rel=1e-9)
    assert colo - none > 2 * w / (gen5 * rl.HOST_COPY_EFFICIENCY)
    assert colo - none < rl.sleep_wake_s(w, 1, 8)  # at Gen4's rate it would take longer
    split = _sync(q7_8xh100, placement="split", gen_gpus=4)
    assert split == _sync(q7_8xh100, placement="split", gen_gpus=4, sleep_wake_s=0.0)


def test_sleep_level_two_moves_no_weights_over_the_host_link(q7_8xh100):
    """cluster.sleep_level (--sleep-level) reaches the sync: level 2 (veRL with vLLM >= 0.8.5) keeps only the
    fixed costs, level 1 (the default, NeMo-RL) adds each GPU's weights to host memory and back."""
    one, two, none = (_sync(q7_8xh100, sleep_level=1), _sync(q7_8xh100, sleep_level=2),
                      _sync(q7_8xh100, sleep_wake_s=0.0))
    w = rf.all_weight_bytes(load_model(Profile.load(q7_8xh100)).costs)
    assert two - none == pytest.approx(rl.sleep_wake_s(w, 2, 8), rel=1e-9)
    gen5 = PCIE_GEN5_BYTES_PER_S
    assert one == _sync(q7_8xh100) and one - two == pytest.approx(
        rl.sleep_wake_s(w, 1, 8, gen5) - rl.sleep_wake_s(w, 2, 8, gen5), rel=1e-9)
    with pytest.raises(ValueError, match="sleep_level"):
        _sync(q7_8xh100, sleep_level=3)
