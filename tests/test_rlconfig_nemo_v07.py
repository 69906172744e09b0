"""NeMo-RL v0.7 recipes: the keys that release added (advantage clips, validation start, ports, refit transport,
data plane), PPO's ``ppo:`` and ``value:`` sections, the SGLang and TensorRT-LLM generation backends, and recipes
of other trainers refused in one line. The configs are written from v0.7's documented examples
(tests/data/rlconfig/nemo/v0.7/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import config_leaves, run_main
from throughputlab.errors import UserError
from throughputlab.files import read_settings
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, predict_analytic
from throughputlab.rlconfig import read_run_config
from throughputlab.rlconfig.nemo_rl import load

V07 = Path(__file__).parent / "data" / "rlconfig" / "nemo" / "v0.7"




def _unaccounted(path: Path) -> list[str]:
    rc = read_run_config(path)
    keys = {k.key for k in (*rc.read, *rc.ignored)}
    tree = load(path, read_settings(path, "recipe", str(path), yaml=True), str(path))
    out = []
    for leaf in config_leaves(tree):
        parts = leaf.split(".")
        if not any(".".join(parts[:i]) in keys for i in range(1, len(parts) + 1)):
            out.append(leaf)
    return out


@pytest.mark.parametrize("name", ["grpo_base.yaml", "grpo-sglang.yaml", "grpo-trtllm-async.yaml", "ppo-critic.yaml"])
def test_every_key_of_a_v07_recipe_is_read_or_ignored_with_a_reason(name):
    assert _unaccounted(V07 / name) == []


def test_the_keys_v07_added_are_ignored_for_their_reasons():
    rc = read_run_config(V07 / "grpo_base.yaml")
    why = {k.key: k.note for k in rc.ignored}
    assert why["grpo.advantage_clip_low"].startswith("loss and advantage settings")
    assert why["grpo.val_start_at"].startswith("validation")
    assert why["cluster.master_port_range_low"].startswith("ports, servers")
    assert why["policy.generation.refit_cfg"].startswith("the weight-sync transport")
    assert why["policy.generation.sglang_cfg"] == "unused: generation backend is vllm"
    assert why["on_policy_distillation"].startswith("on-policy distillation")
    assert (rc.prompts_per_step, rc.responses_per_prompt, rc.gpu_memory_utilization) == (32, 16, 0.6)
    assert (rc.placement, rc.critic, rc.token_budget_per_gpu) == ("colocated", False, 4096)


def test_a_ppo_recipe_reads_its_value_model_as_the_critic():
    rc = read_run_config(V07 / "ppo-critic.yaml")
    assert (rc.prompts_per_step, rc.responses_per_prompt, rc.epochs, rc.algorithm) == (64, 4, 2, "gae")
    assert (rc.critic, rc.critic_model) == (True, "Qwen/Qwen2.5-1.5B")
    assert (rc.critic_micro_batch_sequences_per_gpu, rc.critic_token_budget_per_gpu) == (2, 3072)
    assert rc.reference is False  # ppo.skip_reference_policy_logprobs_calculation
    assert rc.knob("ppo.async_ppo.max_trajectory_age_steps").note == "unused: async PPO is off"
    assert rc.knob("value.dtensor_cfg").note.startswith("the value model's own settings")


def test_sglang_and_trtllm_backends_read_their_own_sections():
    sg = read_run_config(V07 / "grpo-sglang.yaml")
    assert (sg.rollout_engine, sg.rollout_tp, sg.gpu_memory_utilization, sg.max_num_seqs) == ("sglang", 2, 0.7, 128)
    assert sg.knob("policy.generation.vllm_cfg").note == "unused: generation backend is sglang"
    tr = read_run_config(V07 / "grpo-trtllm-async.yaml")
    assert (tr.rollout_engine, tr.rollout_tp, tr.max_num_seqs, tr.max_num_batched_tokens) == ("trtllm", 4, 256, 8192)
    assert (tr.placement, tr.off_policy_steps, tr.rollout_gpus, tr.gpus) == ("one-step-off", 2, 8, 16)


def test_a_typo_of_a_v07_key_is_still_caught():
    with pytest.raises(UserError, match="did you mean 'grpo.advantage_clip_low'"):
        read_run_config(V07 / "grpo_base.yaml", ["grpo.advantage_clip_lw=0.1"])


@pytest.fixture(scope="module")
def q15_8xh100(tmp_path_factory):
    path = tmp_path_factory.mktemp("v07") / "q15.json"
    predict_analytic(resolve_model("qwen2.5-1.5b").spec, "h100", layout=Layout(gpus=8)).save(path)
    return str(path)


def test_decide_runs_a_ppo_recipe_alone_and_prices_its_critic(q15_8xh100, tmp_path):
    out = tmp_path / "d.json"
    r = run_main("decide", "--profile", q15_8xh100, "--config", str(V07 / "ppo-critic.yaml"), "--json", str(out))
    assert r.exit_code == 0, r.output
    assert "read: shape.algo = ppo" in r.output and "read: shape.critic.token_budget = 3072" in r.output
    assert "read: shape.train.epochs = 2" in r.output
    rows = json.loads(out.read_text())["rows"]
    assert [row["prompts"] for row in rows] == [64, 128, 256]
    assert all(row["step"]["critic_s"] > 0 for row in rows)


def test_a_distillation_recipe_is_one_line_naming_the_file(q15_8xh100):
    r = run_main("decide", "--profile", q15_8xh100, "--config", str(V07 / "distillation.yaml"))
    out = r.output.strip()
    assert r.exit_code == 2 and len(out.splitlines()) == 1, out
    assert "distillation.yaml" in out and "distillation recipe" in out and "Traceback" not in out
