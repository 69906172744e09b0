"""k steps off-policy: generation of k steps' samples drains as one queue and a step is charged 1/k of it;
the configs' asynchrony (NeMo-RL's max_trajectory_age_steps, veRL's staleness_threshold) reaches the shape."""

from __future__ import annotations

import pytest
import yaml

from throughputlab.decide import runconfig
from throughputlab.decide.steptime import RLShape, StepModel
from throughputlab.models import resolve_model
from throughputlab.rlconfig import read_run_config
from throughputlab.roofline import Costs
from throughputlab.throughput import DecodeParams, ThroughputModel, TrainParams


def model() -> ThroughputModel:
    return ThroughputModel(
        source="analytic", costs=Costs.from_spec(resolve_model("demo").spec, 4),
        decode=DecodeParams(t0_s=2e-3, bw_bytes_per_s=10e9, phi_flops_per_s=80e9),
        train=TrainParams(t0_s=0.01, phi_flops_per_s=50e9, optimizer_step_s=0.2, mem0_bytes=2e9,
                          mem_per_sample_bytes=0.5e9, device_memory_bytes=8e9))


def shape(k: int, overlap: str = "off-policy", cap: int = 16) -> RLShape:
    return RLShape.model_validate(dict(prompt_len=32, overlap=overlap, off_policy_steps=k,
                                       response={"dist": "lognormal:mean=100,sigma=0.8,max=600"},
                                       train={"micro_batch": 4}, sync={"bytes_per_s": 1e10},
                                       engine={"max_num_seqs": cap}))


def test_slack_shares_the_tail_over_k_steps():
    m = model()
    one = StepModel(m, shape(1)).step(16, 4)
    four = StepModel(m, shape(4)).step(16, 4)
    assert four.off_policy_steps == 4 and one.off_policy_steps == 1
    # the long responses of one step overlap the next ones: less than one step's makespan ...
    assert four.gen_s < 0.8 * one.gen_s
    # ... but the 4 steps' queue takes at least as long as one step's
    assert 4 * four.gen_s > one.gen_s
    # training is not touched
    assert four.train_s == pytest.approx(one.train_s) and four.logprob_s == pytest.approx(one.logprob_s)


def test_more_slack_is_never_slower_per_step_and_colocated_ignores_it():
    m = model()
    g = [StepModel(m, shape(k)).step(16, 4).gen_s for k in (1, 2, 8)]
    assert g[0] > g[1] > g[2]
    col = [StepModel(m, shape(k, "colocated")).step(16, 4) for k in (1, 8)]
    assert col[0].gen_s == pytest.approx(col[1].gen_s) and col[1].off_policy_steps == 1


def _write(tmp_path, name, data) -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return str(p)


def test_nemo_rl_trajectory_age_reaches_the_shape(tmp_path):
    cfg = {"grpo": {"num_prompts_per_step": 8, "num_generations_per_prompt": 4,
                    "async_grpo": {"enabled": True, "max_trajectory_age_steps": 8}},
           "policy": {"train_global_batch_size": 32, "generation": {"colocated": {"enabled": False}}}}
    data, used, missing = runconfig.decide_data(read_run_config(_write(tmp_path, "r.yaml", cfg)))
    assert data["shape"]["off_policy_steps"] == 8
    assert not any("steps off-policy" in m for m in missing)


def test_verl_staleness_with_partial_rollouts_is_over_provisioning(tmp_path):
    cfg = {"actor_rollout_ref": {"rollout": {"n": 4}, "actor": {"ppo_mini_batch_size": 8}},
           "async_training": {"staleness_threshold": 0.25, "trigger_parameter_sync_step": 2,
                              "partial_rollout": True}}
    rc = read_run_config(_write(tmp_path, "c.yaml", cfg), framework="verl")
    assert rc.staleness_share == 0.25
    data, _, _ = runconfig.decide_data(rc)
    assert data["shape"]["partial_rollout"] == 0.25
    cfg["async_training"]["staleness_threshold"] = 0
    data, _, missing = runconfig.decide_data(read_run_config(_write(tmp_path, "d.yaml", cfg), framework="verl"))
    assert "partial_rollout" not in data.get("shape", {})
    assert any("staleness_threshold 0" in m for m in missing)
