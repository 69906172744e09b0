"""Launch scripts as veRL's examples and recipes write them: shell defaults that hold other expansions, positional
parameters, recipe trainers (``recipe.X.main_X``), Hydra configs that name veRL's own trainer config, and the
scripts that run no RL step, each refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_main
from throughputlab.errors import UserError
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, predict_analytic
from throughputlab.rlconfig import read_run_config
from throughputlab.rlconfig.shell import expand


@pytest.mark.parametrize("text, env, want", [
    ("${1:-vllm}", {}, "vllm"),  # a positional parameter: the script read as run without arguments
    ("${MODEL:-${HOME_DIR}/models/Q}", {"HOME_DIR": "/d"}, "/d/models/Q"),  # a default holding an expansion
    ("${MODEL:-${HOME_DIR}/models/Q}", {"MODEL": "m"}, "m"),
    ("${MODEL:-${HOME_DIR}/models/Q}", {}, "${HOME_DIR}/models/Q"),  # unset, kept as written for the reader
    ("${A:+on}", {"A": "1"}, "on"),
    ("${A:+on}", {}, ""),
    ("$((2 * ${N:-4}))", {}, "8"),
    ("${N}x$N", {"N": "3"}, "3x3"),
])
def test_shell_parameter_expansion(text, env, want):
    assert expand(text, dict(env)) == want


def test_an_assigned_default_is_kept_for_later_lines():
    env: dict = {}
    assert expand("${TP:=4}", env) == "4" and env["TP"] == "4" and expand("$TP", env) == "4"


DAPO_SCRIPT = """#!/usr/bin/env bash
# In the form of veRL's recipe/dapo/*.sh: defaults that name other variables, a positional engine.
set -euxo pipefail
ENGINE=${1:-vllm}
RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}
MODEL_PATH=${MODEL_PATH:-"${RAY_DATA_HOME}/models/Qwen2.5-Math-7B"}
NNODES=${NNODES:-2}
max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 8))
python3 -m recipe.dapo.main_dapo \\
    data.train_batch_size=512 \\
    data.max_prompt_length=${max_prompt_length} \\
    data.max_response_length=${max_response_length} \\
    actor_rollout_ref.model.path="${MODEL_PATH}" \\
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \\
    actor_rollout_ref.rollout.name=${ENGINE} \\
    actor_rollout_ref.rollout.n=16 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \\
    trainer.n_gpus_per_node=8 \\
    trainer.nnodes="${NNODES}"
"""


def test_a_recipe_script_with_nested_defaults_reads(tmp_path):
    p = tmp_path / "run_dapo.sh"
    p.write_text(DAPO_SCRIPT)
    rc = read_run_config(p)
    assert (rc.framework, rc.rollout_engine, rc.rollout_tp, rc.gpus, rc.nodes) == ("verl", "vllm", 4, 16, 2)
    assert (rc.prompts_per_step, rc.responses_per_prompt, rc.response_tokens_max) == (512, 16, 8192)
    # $HOME is the environment's: the path is kept as written, its model name is what a mismatch check reads
    assert rc.model == "${HOME}/verl/models/Qwen2.5-Math-7B"
    assert "is not set in the config or script" in rc.knob("actor_rollout_ref.model.path").note


def test_a_number_from_a_variable_the_script_does_not_set_is_one_line(tmp_path):
    p = tmp_path / "run.sh"
    p.write_text(DAPO_SCRIPT.replace('trainer.nnodes="${NNODES}"', "trainer.nnodes=${SLURM_JOB_NUM_NODES}"))
    with pytest.raises(UserError, match=r"trainer.nnodes: '\$\{SLURM_JOB_NUM_NODES\}' is a shell variable the "
                                        "script does not set") as e:
        read_run_config(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


@pytest.mark.parametrize("command, fragment", [
    ("python3 -m verl.trainer.main_generation data.path=x.parquet rollout.n=4", "veRL's offline generation"),
    ("torchrun -m verl.trainer.fsdp_sft_trainer data.train_files=x model.partial_pretrain=m", "veRL's SFT"),
    ("python3 scripts/prepare_data.py --out x.parquet", "no RL trainer command in this script"),
])
def test_scripts_that_run_no_rl_step_are_refused(tmp_path, command, fragment):
    p = tmp_path / "job.sh"
    p.write_text(f"#!/bin/bash\nset -x\n{command}\n")
    with pytest.raises(UserError, match=fragment) as e:
        read_run_config(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


def test_a_hydra_config_naming_verls_own_megatron_trainer(tmp_path):
    p = tmp_path / "my_grpo.yaml"
    p.write_text("hydra:\n  searchpath: [pkg://verl/trainer/config]\ndefaults:\n  - ppo_megatron_trainer\n  - _self_\n"
                 "data:\n  train_batch_size: 64\nactor_rollout_ref:\n  rollout:\n    n: 8\n"
                 "    tensor_model_parallel_size: 2\n")
    rc = read_run_config(p)
    assert (rc.train_strategy, rc.prompts_per_step, rc.responses_per_prompt) == ("megatron", 64, 8)
    assert "veRL's own trainer config" in rc.knob("defaults").note
    (tmp_path / "ppo_megatron_trainer.yaml").write_text("actor_rollout_ref:\n  actor:\n    strategy: fsdp\n")
    assert read_run_config(p).train_strategy == "fsdp"  # a file of that name beside it is the one composed


def test_a_decide_refusal_comes_before_the_config_listing(tmp_path):
    prof = tmp_path / "q7.json"
    predict_analytic(resolve_model("qwen2.5-7b").spec, "h100", layout=Layout(gpus=8)).save(prof)
    p = tmp_path / "run.sh"
    p.write_text(DAPO_SCRIPT.replace("tensor_model_parallel_size=4", "tensor_model_parallel_size=1")
                 .replace("trainer.n_gpus_per_node=8", "trainer.n_gpus_per_node=8 "
                          "actor_rollout_ref.rollout.gpu_memory_utilization=0.2"))
    r = run_main("decide", "--profile", str(prof), "--config", str(p), "--nodes", "1", "--gpus", "8")
    out = r.output.strip()
    assert r.exit_code == 2 and len(out.splitlines()) == 1, out
    assert "no room for a KV cache" in out and "--gpu-memory-utilization" in out


def test_a_defaults_entry_of_a_config_at_its_own_package(tmp_path):
    """veRL v0.7's ppo_trainer.yaml names ``- reward_manager@reward_manager``: reward_manager.yaml of the same
    folder, placed under reward_manager."""
    (tmp_path / "reward_manager.yaml").write_text("name: naive\nsource: register\n")
    (tmp_path / "rollout").mkdir()
    (tmp_path / "rollout" / "rollout.yaml").write_text("n: 4\ntensor_model_parallel_size: 2\n")
    p = tmp_path / "trainer.yaml"
    p.write_text("defaults:\n  - rollout@actor_rollout_ref.rollout: rollout\n  - reward_manager@reward_manager\n"
                 "  - _self_\nactor_rollout_ref:\n  hybrid_engine: true\ndata:\n  train_batch_size: 32\n")
    rc = read_run_config(p)
    assert (rc.prompts_per_step, rc.responses_per_prompt, rc.rollout_tp) == (32, 4, 2)
    assert rc.knob("reward_manager").note.startswith("the reward function")


def test_verl_v07_keys_megatron_lora_rank_and_copies():
    import yaml

    tree = {"data": {"train_batch_size": 64}, "actor_rollout_ref": {
        "actor": {"strategy": "megatron", "rollout_n": 8, "use_remove_padding": True, "tau_pos": 1.0},
        "model": {"path": "Qwen/Qwen3-8B", "use_remove_padding": True, "lora": {"rank": 16, "alpha": 32},
                  "mtp": {"enable": False}, "tiled_mlp": {"enabled": False}},
        "rollout": {"n": 8, "tensor_model_parallel_size": 2, "logprobs_mode": "processed_logprobs"}}}
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(tree, f)
    rc = read_run_config(f.name)
    assert (rc.lora_rank, rc.responses_per_prompt, rc.train_strategy) == (16, 8, "megatron")
    assert "copies of actor_rollout_ref.rollout.n" in rc.knob("actor_rollout_ref.actor.rollout_n").note
    assert rc.knob("actor_rollout_ref.model.mtp").note.startswith("multi-token prediction")


OPENRLHF_V010 = """#!/bin/bash
# In the form of OpenRLHF v0.10's examples/scripts: sectioned flags gathered in bash arrays.
MODEL_PATH=Qwen/Qwen3-4B
ROLLOUT_ARGS=(
   --actor.model_name_or_path ${MODEL_PATH}
   # --reward.model_name_or_path some/rm
   --data.max_len 4096
   --rollout.max_new_tokens 3072
   --rollout.batch_size 128
   --rollout.n_samples_per_prompt 8
   --train.batch_size 1024
   --train.dynamic_batch_enable
   --train.max_tokens_per_gpu 16384
   --ds.packing_samples
)
ENGINE_ARGS=(
   --actor.num_nodes 1 --actor.num_gpus_per_node 8
   --vllm.num_engines 4 --vllm.tensor_parallel_size 2 --vllm.gpu_memory_utilization 0.6
   --train.colocate_all --vllm.enable_sleep --ds.enable_sleep --ds.zero_stage 3 --ds.param_dtype bf16
   --algo.advantage.estimator reinforce_baseline --algo.kl.init_coef 0.0 --reward.remote_url reward.py
)
ray job submit --address="http://127.0.0.1:8265" -- python3 -m openrlhf.cli.train_ppo_ray \\
   ${ROLLOUT_ARGS[@]} "${ENGINE_ARGS[@]}" --logger.logging_steps 1
"""


def test_openrlhf_v010_sectioned_flags_in_bash_arrays(tmp_path):
    p = tmp_path / "train.sh"
    p.write_text(OPENRLHF_V010)
    rc = read_run_config(p)
    assert (rc.framework, rc.model, rc.prompts_per_step, rc.responses_per_prompt) == ("openrlhf", "Qwen/Qwen3-4B", 128, 8)
    assert (rc.train_mini_batch_sequences, rc.sequence_tokens_max, rc.response_tokens_max) == (1024, 4096, 3072)
    assert (rc.dynamic_batch, rc.token_budget_per_gpu, rc.remove_padding, rc.train_dtype) == (True, 16384, True, "bf16")
    assert (rc.placement, rc.rollout_tp, rc.gpu_memory_utilization, rc.gpus) == ("colocated", 2, 0.6, 8)
    assert (rc.critic, rc.reference, rc.reward_model) == (False, False, False)
    assert rc.knob("--logger").note == "logging"
    assert "--reward.model_name_or_path" not in {k.key for k in rc.read}  # commented out inside the array


def test_a_launch_inside_bash_c_is_found(tmp_path):
    p = tmp_path / "slurm.sh"
    p.write_text('#!/bin/bash\nsrun --nodes=1 bash -c \\\n"pip install ray && ray job submit -- python3 -m '
                 'openrlhf.cli.train_ppo_ray --rollout.batch_size 64 --train.batch_size 64 \\\n'
                 '    --rollout.n_samples_per_prompt 4 --actor.num_nodes 1 --actor.num_gpus_per_node 8"\n')
    rc = read_run_config(p)
    assert (rc.prompts_per_step, rc.responses_per_prompt, rc.gpus_per_node) == (64, 4, 8)


def test_openrlhf_old_flags_still_read_with_a_dict_valued_flag(tmp_path):
    p = tmp_path / "old.sh"
    p.write_text("python3 -m openrlhf.cli.train_ppo_ray --rollout_batch_size 32 --train_batch_size 64 "
                 "--n_samples_per_prompt 4 --use_wandb {wandb_token}\n")
    rc = read_run_config(p)
    assert (rc.prompts_per_step, rc.train_mini_batch_sequences, rc.responses_per_prompt) == (32, 64, 4)


def test_a_trl_1x_config_reads_every_key():
    """TRL 1.x added TrainingArguments and GRPO keys (entropy control, SAPO, VESPO, trackio, parallelism_config):
    each is read or ignored with a reason, none is an unknown-key error."""
    import yaml

    path = Path(__file__).parent / "data" / "rlconfig" / "trl_grpo_v1.yaml"
    rc = read_run_config(path)
    keys = {k.key for k in (*rc.read, *rc.ignored)}
    tree = yaml.safe_load(path.read_text())
    assert {k for k in tree if k not in keys and not any(k.startswith(x + ".") for x in keys)} == set()
    assert (rc.prompts_per_step, rc.responses_per_prompt, rc.placement, rc.reference) == (8, 8, "colocated", False)
    assert rc.knob("sapo_temperature_pos").note.startswith("loss and advantage")


def test_a_comment_after_a_continuation_backslash_is_refused_naming_the_line(tmp_path):
    # veRL's ppo_trainer/run_deepseek7b_llm_pfppo.sh writes "reweight_method=pow \  # [...]": the backslash escapes
    # the blank, the comment ends the command, and the arguments below it would be lost without a word
    p = tmp_path / "run_pfppo.sh"
    p.write_text("set -x\npython3 -m verl.trainer.main_ppo \\\n    algorithm.adv_estimator=gae \\\n"
                 "    algorithm.pf_ppo.reweight_method=pow \\  # [\"pow\", \"max_min\"]\n"
                 "    data.train_batch_size=256 \\\n    trainer.n_gpus_per_node=4\n")
    with pytest.raises(UserError, match=r"line 4: a comment follows the line's closing backslash") as e:
        read_run_config(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)
    p.write_text(p.read_text().replace(' \\  # ["pow", "max_min"]', " \\"))  # the same script, the comment gone
    rc = read_run_config(p)
    assert (rc.prompts_per_step, rc.gpus) == (256, 4)


def test_a_verl_script_without_its_gpu_count_takes_verls_default(tmp_path):
    p = tmp_path / "run.sh"
    p.write_text("python3 -m verl.trainer.main_ppo data.train_batch_size=64 actor_rollout_ref.rollout.n=4\n")
    rc = read_run_config(p)
    assert (rc.gpus_per_node, rc.nodes, rc.gpus) == (8, 1, 8)
    assert "veRL's default 8" in rc.knob("trainer.n_gpus_per_node").note
    p.write_text("python3 -m verl.trainer.main_ppo data.train_batch_size=64 trainer.n_gpus_per_node=2\n")
    assert read_run_config(p).gpus == 2
    # enforce_eager's default moved (true before veRL v0.6.0, false since): left to the profile, and said so
    rc = read_run_config(p)
    assert rc.enforce_eager is None and "true before" in rc.knob("actor_rollout_ref.rollout.enforce_eager").note
    p.write_text("python3 -m verl.trainer.main_ppo actor_rollout_ref.rollout.enforce_eager=True\n")
    assert read_run_config(p).enforce_eager is True


def test_a_comment_line_between_continued_lines_is_refused_naming_the_line(tmp_path):
    # veRL's grpo_trainer/run_qwen3_vl-30b-megatron.sh: a "# ..." line inside the continued command ends it
    p = tmp_path / "run_vl.sh"
    p.write_text("python3 -m verl.trainer.main_ppo \\\n    data.train_batch_size=256 \\\n"
                 "    # balance the experts\n    trainer.n_gpus_per_node=4 \\\n    trainer.nnodes=1\n")
    with pytest.raises(UserError, match=r"line 3: a comment line inside the continued command") as e:
        read_run_config(p)
    assert "\n" not in str(e.value)
    # a comment line above the command, or after it ends, is just a comment
    p.write_text("# balance the experts\npython3 -m verl.trainer.main_ppo \\\n    data.train_batch_size=256 \\\n"
                 "    trainer.n_gpus_per_node=4\n# done\n")
    assert read_run_config(p).gpus == 4


def test_newer_verl_reward_section_reads(tmp_path):
    # newer veRL gathers the reward settings under reward: (verl/trainer/config/reward/reward.yaml)
    p = tmp_path / "run.sh"
    p.write_text("python3 -m verl.trainer.main_ppo data.train_batch_size=64 trainer.n_gpus_per_node=8 "
                 "reward.reward_manager.name=dapo reward.reward_kwargs.overlong_buffer_cfg.len=512 "
                 "reward.custom_reward_function.path=r.py reward.reward_model.enable=True "
                 "reward.reward_model.rollout.gpu_memory_utilization=0.5\n")
    rc = read_run_config(p)
    assert rc.reward_model is True
    assert "scored on the CPU" in rc.knob("reward.reward_manager").note
    p.write_text("python3 -m verl.trainer.main_ppo data.train_batch_size=64 reward.reward_manger.name=dapo\n")
    with pytest.raises(UserError, match="reward.reward_manger"):
        read_run_config(p)


def test_the_synchronous_partial_rollout_recipe_is_colocated(tmp_path):
    # verl-recipe's recipe/partial_rollout: a synchronous trainer with async_training.partial_rollout alone and no
    # rollout pool; the fully-async recipe names its rollout pool (rollout.n_gpus_per_node, rollout.nnodes)
    p = tmp_path / "run_pr.sh"
    p.write_text("python3 -m recipe.partial_rollout.main_ppo trainer.n_gpus_per_node=2 trainer.nnodes=1 "
                 "data.train_batch_size=8 +async_training.partial_rollout=True actor_rollout_ref.rollout.n=8\n")
    rc = read_run_config(p)
    # hybrid_engine unstated: veRL's default (true), colocated
    assert (rc.gpus, rc.placement, rc.off_policy_steps) == (2, None, None)
    assert "synchronous partial-rollout recipe" in rc.knob("async_training").note
    p.write_text("python3 -m recipe.fully_async_policy.fully_async_main trainer.n_gpus_per_node=4 trainer.nnodes=1 "
                 "rollout.n_gpus_per_node=4 rollout.nnodes=1 data.train_batch_size=0 "
                 "async_training.partial_rollout=True async_training.staleness_threshold=0.5\n")
    assert read_run_config(p).placement == "one-step-off"


@pytest.mark.parametrize("module", ["recipe.reward_queue.main", "recipe.async_flow.grpo_main", "recipe.dapo.main_dapo"])
def test_a_recipe_trainer_is_found_by_its_module_name(tmp_path, module):
    p = tmp_path / "train.sh"
    p.write_text(f"python3 -m {module} data.train_batch_size=32 actor_rollout_ref.rollout.n=4\n")
    rc = read_run_config(p)
    assert (rc.framework, rc.prompts_per_step, rc.responses_per_prompt) == ("verl", 32, 4)


def test_a_gkd_recipe_is_refused_as_distillation(tmp_path):
    p = tmp_path / "gkd.sh"
    p.write_text("python3 -m main_gkd data.train_batch_size=32\n")
    with pytest.raises(UserError, match="on-policy distillation"):
        read_run_config(p)


def test_a_recipe_hydra_config_over_verls_own_is_read_as_verl(tmp_path):
    # recipe/dapo/config/dapo_trainer.yaml: no actor_rollout_ref of its own, only veRL's trainer in its defaults
    p = tmp_path / "dapo_trainer.yaml"
    p.write_text("hydra:\n  searchpath: [file://verl/trainer/config]\ndefaults:\n  - ppo_trainer\n  - _self_\n"
                 "data:\n  gen_batch_size: ${data.train_batch_size}\nreward:\n  reward_manager:\n    name: dapo\n")
    rc = read_run_config(p)
    assert rc.framework == "verl" and rc.prompts_per_step == 1024  # veRL's default train_batch_size
