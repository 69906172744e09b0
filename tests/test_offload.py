"""Training state moved to host memory and back between phases (decide/offload.py): the copies a step makes
over the host link at the rate vLLM's sleep measured, NeMo-RL's colocated choreography and veRL's offload
flags read from the run's config, and a step that grows by exactly those copies."""

from __future__ import annotations

import pytest
import yaml

from throughputlab.decide import runconfig
from throughputlab.decide.backend import layout_for
from throughputlab.decide.calculator import DecideSpec, decide_from_spec
from throughputlab.decide.offload import offload_s, param_shards
from throughputlab.decide.shape import TrainShape
from throughputlab.fit.load import load_model
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, predict_analytic
from throughputlab.records.profile import Profile
from throughputlab.rlconfig import read_run_config
from throughputlab.roofline import rl as rfl

SHAPE = {"prompt_len": 256, "response": {"dist": "lognormal:mean=512,sigma=0.6,max=1024"},
         "train": {"micro_batch": 2}}


def test_host_copies_at_the_sleep_rate():
    g = 1e9
    assert rfl.offload_bytes(2 * g, 0.5 * g, 2, 5, 2, 2) == pytest.approx(2 * g * (10 + 8) + 0.5 * g * 24)
    one = rfl.host_copy_s(10 * g, 1)
    assert one == pytest.approx(10 * g / (rfl.HOST_LINK_BYTES_PER_S * rfl.HOST_COPY_EFFICIENCY))
    assert rfl.host_copy_s(10 * g, 8) == pytest.approx(2 * one)  # two GPUs to a host link, copying at once
    assert rfl.host_copy_s(0.0, 8) == 0.0


def test_shards_follow_the_backend(q7_8xh100):
    m = load_model(Profile.load(q7_8xh100))
    fsdp = param_shards(m, 8)
    assert fsdp[0] == fsdp[1]
    meg = layout_for(TrainShape(backend="megatron", tp=2, pp=2), 8)
    shard, opt = param_shards(m, 8, meg)
    assert shard == pytest.approx(4 * fsdp[0] / 2) and opt == pytest.approx(shard / 2)  # TP x PP 4, DP 2
    assert offload_s(m, TrainShape(), 8) == 0.0
    t = offload_s(m, TrainShape(offload_param_copies=4), 8, per_node=8)
    assert t == pytest.approx(rfl.host_copy_s(4 * fsdp[0] * m.costs.bytes_per_param, 8))


def test_the_step_grows_by_the_copies(q7_8xh100):
    def step(train):
        shape = {**SHAPE, "train": {**SHAPE["train"], **train}}
        spec = DecideSpec.model_validate({"profile": q7_8xh100, "prompts": [64], "group": 8, "shape": shape,
                                          "cluster": {"gpus": 8}})
        return decide_from_spec(spec)[0].rows[0].step
    base, off = step({}), step({"offload_param_copies": 5, "offload_grad_copies": 2, "offload_optimizer_copies": 2})
    assert base.offload_s == 0.0 and off.offload_s > 1.0  # 7B on 8 GPUs: ~25 GB a GPU over a shared PCIe link
    assert off.step_s == pytest.approx(base.step_s + off.offload_s, rel=1e-6)


def _knobs(tmp_path, cfg):
    p = tmp_path / "run.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return runconfig.decide_data(read_run_config(str(p)))[0]["shape"]["train"]


def test_nemo_rl_colocated_offloads_every_step_and_says_why(tmp_path):
    base = {"grpo": {"num_prompts_per_step": 8, "num_generations_per_prompt": 4},
            "policy": {"train_global_batch_size": 32, "generation": {"colocated": {"enabled": True}}}}
    t = _knobs(tmp_path, base)
    assert (t["offload_param_copies"], t["offload_grad_copies"], t["offload_optimizer_copies"]) == (5, 2, 2)
    no_ref = {**base, "grpo": {**base["grpo"], "skip_reference_policy_logprobs_calculation": True}}
    assert _knobs(tmp_path, no_ref)["offload_param_copies"] == 2
    split = {**base, "policy": {**base["policy"], "generation": {"colocated": {"enabled": False}}}}
    assert "offload_param_copies" not in _knobs(tmp_path, split)


def test_verl_offload_flags_become_copies(tmp_path):
    cfg = {"data": {"train_batch_size": 8}, "actor_rollout_ref": {
        "rollout": {"n": 4}, "actor": {"strategy": "fsdp", "fsdp_config": {"param_offload": True,
                                                                           "optimizer_offload": True}}}}
    t = _knobs(tmp_path, cfg)
    assert (t["offload_param_copies"], t["offload_optimizer_copies"]) == (4, 2)


def test_nemo_rl_v0_3_fsdp_keys_are_read_or_set_aside(tmp_path):
    """NeMo-RL v0.3 kept FSDP offload and checkpointing at policy.*: taken on the FSDP path, set aside (with the
    reason) when Megatron trains."""
    def rc(policy):
        p = tmp_path / "v03.yaml"
        p.write_text(yaml.safe_dump({"grpo": {"num_prompts_per_step": 8, "num_generations_per_prompt": 4},
                                     "policy": {"train_global_batch_size": 32, "fsdp_offload_enabled": True,
                                                "activation_checkpointing_enabled": True, **policy}}))
        return read_run_config(str(p))
    fsdp = rc({})
    assert fsdp.param_offload is True and fsdp.activation_checkpointing == "full"
    meg = rc({"megatron_cfg": {"enabled": True}})
    assert meg.param_offload is None
    assert sum("unused when Megatron trains" in str(i) for i in meg.ignored) == 2


def test_the_host_link_is_the_devices(tmp_path):
    """Hopper hosts copy over PCIe Gen5 (twice Gen4), A100s over Gen4, GB200 over NVLink-C2C: the same offload
    takes half as long on an H100 as on an A100, the bytes being equal."""
    from throughputlab.decide.cluster import Placement
    from throughputlab.records.peaks import PCIE_GEN4_BYTES_PER_S, PCIE_GEN5_BYTES_PER_S, host_link

    assert host_link("H100 SXM", rfl.C2C_BYTES_PER_S)[0] == PCIE_GEN5_BYTES_PER_S == 2 * PCIE_GEN4_BYTES_PER_S
    assert host_link("A100 80GB SXM", rfl.C2C_BYTES_PER_S)[0] == PCIE_GEN4_BYTES_PER_S
    assert host_link("GB200", rfl.C2C_BYTES_PER_S)[0] == rfl.C2C_BYTES_PER_S
    pl = dict(kind="colocated", gpus=8, gen_gpus=8, train_gpus=8, tp=1)
    assert Placement(**pl).host_rate == rfl.HOST_LINK_BYTES_PER_S
    assert Placement(**pl, domain=72).host_rate == rfl.C2C_BYTES_PER_S
    assert Placement(**pl, host_bytes_per_s=PCIE_GEN5_BYTES_PER_S).host_rate == PCIE_GEN5_BYTES_PER_S

    def offload(device):
        path = tmp_path / f"{device}.json"
        predict_analytic(resolve_model("qwen2.5-7b").spec, device, layout=Layout(gpus=8)).save(path)
        train = {**SHAPE["train"], "offload_param_copies": 4, "offload_optimizer_copies": 2}
        spec = DecideSpec.model_validate({"profile": str(path), "prompts": [64], "group": 8,
                                          "shape": {**SHAPE, "train": train}, "cluster": {"gpus": 8}})
        return decide_from_spec(spec)[0].rows[0].step.offload_s
    h100, a100 = offload("h100"), offload("a100-80gb")
    assert a100 > 0 and h100 == pytest.approx(a100 / 2, rel=1e-6)
