"""rlconfig: each framework's launch config read into a RunConfig, checked field by field against
configs written from the frameworks' documented schemas (tests/data/rlconfig/)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import config_leaves
from throughputlab.rlconfig import RunConfig, read_run_config

DATA = Path(__file__).parent / "data" / "rlconfig"


def _accounted(rc: RunConfig, key: str) -> bool:
    """``key`` (a dotted leaf path) is read or ignored, itself or as part of an ignored section."""
    keys = {k.key for k in (*rc.read, *rc.ignored)}
    parts = key.split(".")
    return any(".".join(parts[:i]) in keys for i in range(1, len(parts) + 1))





# -- veRL ------------------------------------------------------------------------------------------------------
def test_verl_printed_ppo_config_maps_every_knob():
    rc = read_run_config(DATA / "verl_printed_ppo.yaml")
    assert rc.framework == "verl" and rc.algorithm == "gae"
    assert (rc.prompts_per_step, rc.responses_per_prompt, rc.epochs) == (1024, 1, 2)
    assert (rc.prompt_tokens_max, rc.response_tokens_max) == (1024, 2048)
    # ppo_mini_batch_size counts prompts: 256 x n 1; dynamic batching replaces the micro-batch by a budget
    assert rc.train_mini_batch_sequences == 256
    assert rc.dynamic_batch is True and rc.token_budget_per_gpu == 24576 and rc.micro_batch_sequences_per_gpu is None
    assert rc.knob("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu").note.startswith("unused")
    assert (rc.train_strategy, rc.sequence_parallel, rc.remove_padding) == ("fsdp2", 2, True)
    assert (rc.param_offload, rc.optimizer_offload, rc.activation_checkpointing) == (True, True, "full")
    assert (rc.rollout_engine, rc.rollout_tp, rc.gpu_memory_utilization) == ("vllm", 2, 0.5)
    assert (rc.enforce_eager, rc.max_num_seqs, rc.max_num_batched_tokens) == (False, 256, 16384)
    # the old log-prob pass is not dynamic: its micro-batch is read, its budget is not
    assert rc.logprob_micro_batch_sequences_per_gpu == 32 and rc.logprob_token_budget_per_gpu is None
    assert rc.ref_token_budget_per_gpu == 49152 and rc.ref_micro_batch_sequences_per_gpu is None
    # KL in the reward (not the loss): a reference pass with kl_ctrl's coefficient
    assert (rc.reference, rc.kl) == (True, 0.005)
    assert rc.knob("actor_rollout_ref.actor.kl_loss_coef").note == "unused: use_kl_loss is false"
    assert (rc.critic, rc.critic_model, rc.critic_micro_batch_sequences_per_gpu) == (
        True, "Qwen/Qwen2.5-1.5B-Instruct", 8)
    assert rc.critic_token_budget_per_gpu is None  # the critic is not dynamic
    assert (rc.gpus, rc.gpus_per_node, rc.nodes, rc.placement) == (16, 8, 2, "colocated")
    assert rc.lora_rank == 0 and rc.reward_model is False
    assert rc.knob("actor_rollout_ref.actor.optim").note.startswith("optimizer hyperparameters")
    assert rc.knob("trainer.logger").note.startswith("logging")
    import yaml

    tree = yaml.safe_load((DATA / "verl_printed_ppo.yaml").read_text())
    assert all(_accounted(rc, k) for k in config_leaves(tree))


def test_verl_log_with_the_printed_dict_is_read():
    rc = read_run_config(DATA / "verl_grpo_run.log")
    assert rc.framework == "verl" and rc.algorithm == "grpo"
    assert (rc.prompts_per_step, rc.responses_per_prompt, rc.rollout_engine) == (128, 8, "sglang")
    assert rc.train_mini_batch_sequences == 64 * 8
    assert (rc.critic, rc.reference, rc.kl) == (False, True, 0.001)
    assert (rc.gpus, rc.nodes) == (8, 1)
    assert rc.knob("critic").note.startswith("no critic")


def test_verl_trainer_yaml_plus_overrides_follows_interpolations():
    overrides = ["data.train_batch_size=512", "data.max_prompt_length=1024", "actor_rollout_ref.rollout.n=8",
                 "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=True",
                 "actor_rollout_ref.actor.use_dynamic_bsz=True",
                 "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=12000",
                 "++trainer.nnodes=2", "actor_rollout_ref.actor.ppo_mini_batch_size=64",
                 "~actor_rollout_ref.rollout.max_num_seqs"]
    rc = read_run_config(DATA / "verl_ppo_trainer.yaml", overrides)
    assert (rc.prompts_per_step, rc.responses_per_prompt, rc.prompt_tokens_max) == (512, 8, 1024)
    assert rc.train_mini_batch_sequences == 64 * 8
    # ${...} copies follow the overridden keys: the rollout's and reference's budgets and dynamic flags
    assert rc.dynamic_batch and rc.token_budget_per_gpu == 12000
    assert rc.logprob_token_budget_per_gpu == 12000 and rc.ref_token_budget_per_gpu == 12000
    assert rc.knob("actor_rollout_ref.rollout.prompt_length").note == "the same as data.max_prompt_length"
    assert (rc.critic, rc.reference, rc.kl) == (False, True, 0.001)
    assert rc.max_num_seqs is None  # deleted by ~key
    assert (rc.gpus, rc.nodes) == (16, 2)
    assert rc.knob("data.train_batch_size").note.endswith("(from an override)")
    assert rc.knob("trainer.nnodes").note.endswith("(from an override)")
    # without overrides: veRL's defaults as the file states them (PPO with a critic, no KL)
    base = read_run_config(DATA / "verl_ppo_trainer.yaml")
    assert (base.prompts_per_step, base.responses_per_prompt, base.critic, base.reference) == (1024, 1, True, False)
    assert base.train_mini_batch_sequences == 256 and base.critic_model == "~/models/deepseek-llm-7b-chat"


def test_verl_hydra_defaults_list_is_composed():
    rc = read_run_config(DATA / "verl_hydra" / "ppo_trainer.yaml", ["data.max_prompt_length=2048"])
    assert (rc.prompts_per_step, rc.responses_per_prompt) == (1024, 4)  # n: the primary file's own value
    assert (rc.prompt_tokens_max, rc.response_tokens_max) == (2048, 512)
    assert rc.train_strategy == "fsdp" and rc.micro_batch_sequences_per_gpu == 4
    assert rc.train_mini_batch_sequences == 256 * 4
    assert (rc.param_offload, rc.optimizer_offload) == (False, False)  # from engine/fsdp.yaml under fsdp_config
    assert (rc.rollout_tp, rc.gpu_memory_utilization, rc.enforce_eager) == (2, 0.5, True)
    assert rc.ref_micro_batch_sequences_per_gpu == 8 and rc.reference is True
    assert rc.knob("actor_rollout_ref.actor._target_").note.startswith("the class Hydra builds")
    assert rc.knob("actor_rollout_ref.rollout.prompt_length").note == "the same as data.max_prompt_length"


def test_verl_launch_script_overrides_with_shell_arithmetic():
    rc = read_run_config(DATA / "verl_run_qwen3_grpo.sh")
    assert rc.framework == "verl" and rc.model == "Qwen/Qwen3-8B"  # ${MODEL_PATH:-default}
    assert (rc.prompts_per_step, rc.responses_per_prompt) == (256, 16)
    assert (rc.prompt_tokens_max, rc.response_tokens_max) == (2048, 8192)  # $((1024 * 2)), $((1024 * 8))
    assert rc.train_mini_batch_sequences == 32 * 16
    assert rc.token_budget_per_gpu == (2048 + 8192) * 2 and rc.logprob_token_budget_per_gpu == (2048 + 8192) * 3
    assert rc.max_num_batched_tokens == 10240
    assert (rc.sequence_parallel, rc.rollout_tp, rc.param_offload) == (4, 2, True)
    assert (rc.gpus, rc.kl, rc.reference) == (32, 0.001, True)
    assert rc.knob("launcher").value.startswith("python3 -m verl.trainer.main_ppo")
    assert rc.knob("arguments").value == "$@"
    assert rc.placement is None  # not stated: the model's default


# -- NeMo-RL ---------------------------------------------------------------------------------------------------
def test_nemo_rl_recipe_inherits_its_defaults_parent():
    rc = read_run_config(DATA / "nemo" / "recipes" / "llm" / "grpo-qwen2.5-7b-2n8g-dtensor.yaml")
    assert rc.framework == "nemo-rl" and rc.model == "Qwen/Qwen2.5-7B-Instruct"
    assert (rc.prompts_per_step, rc.responses_per_prompt) == (64, 8)
    assert (rc.prompt_tokens_max, rc.response_tokens_max, rc.sequence_tokens_max) == (1024, 2048, 3072)
    assert (rc.train_mini_batch_sequences, rc.micro_batch_sequences_per_gpu) == (256, 2)
    # sequence packing (the parent's) with ${mul:...} budgets computed from the child's sizes
    assert rc.remove_padding and rc.dynamic_batch and rc.token_budget_per_gpu == 3072 * 2
    assert rc.logprob_token_budget_per_gpu == 3072 * 4 and rc.ref_token_budget_per_gpu == 3072 * 4
    assert (rc.train_strategy, rc.train_tp, rc.activation_checkpointing) == ("fsdp2", 2, "full")
    assert (rc.param_offload, rc.optimizer_offload) == (True, True)
    assert (rc.rollout_tp, rc.gpu_memory_utilization, rc.rollout_dtype) == (2, 0.5, "bf16")
    assert (rc.placement, rc.off_policy_steps, rc.rollout_gpus) == ("colocated", 0, None)
    assert (rc.gpus, rc.kl, rc.reference, rc.critic) == (16, 0.01, True, False)
    assert rc.knob("policy.megatron_cfg").note == "unused: policy.megatron_cfg.enabled is false"
    assert rc.knob("grpo.async_grpo.max_trajectory_age_steps").note == "unused: async GRPO is off"


def test_nemo_rl_two_level_chain_split_generation():
    rc = read_run_config(DATA / "nemo" / "recipes" / "llm" / "grpo-qwen2.5-7b-2n8g-split.yaml")
    assert (rc.prompts_per_step, rc.train_tp) == (64, 2)  # from the middle file
    assert (rc.placement, rc.rollout_gpus, rc.off_policy_steps) == ("split", 8, 0)
    assert rc.gpu_memory_utilization == 0.85
    assert rc.remove_padding is False and rc.dynamic_batch and rc.token_budget_per_gpu == 6144
    assert rc.knob("policy.sequence_packing.train_mb_tokens").note == \
        "unused: policy.sequence_packing.enabled is false"


def test_nemo_rl_overrides_apply_before_interpolation():
    rc = read_run_config(DATA / "nemo" / "recipes" / "llm" / "grpo-qwen2.5-7b-2n8g-dtensor.yaml",
                         ["policy.max_total_sequence_length=4096", "policy.train_micro_batch_size=1",
                          "grpo.async_grpo.enabled=true", "policy.generation.colocated.enabled=false",
                          "policy.generation.colocated.resources.num_nodes=1"])
    assert rc.token_budget_per_gpu == 4096 and rc.sequence_tokens_max == 4096
    assert (rc.placement, rc.off_policy_steps, rc.rollout_gpus) == ("one-step-off", 1, 8)


# -- OpenRLHF --------------------------------------------------------------------------------------------------
def test_openrlhf_colocated_script():
    rc = read_run_config(DATA / "openrlhf_ppo_colocated.sh")
    assert (rc.framework, rc.framework_version) == ("openrlhf", "0.8.5")
    assert (rc.prompts_per_step, rc.responses_per_prompt, rc.epochs) == (1024, 8, 1)
    assert (rc.train_mini_batch_sequences, rc.micro_batch_sequences_per_gpu) == (128, 8)  # ${MICRO_TRAIN}
    assert rc.logprob_micro_batch_sequences_per_gpu == 16
    assert (rc.prompt_tokens_max, rc.response_tokens_max) == (1024, 1024)
    assert (rc.rollout_tp, rc.gpu_memory_utilization, rc.enforce_eager) == (2, 0.5, True)
    assert (rc.placement, rc.rollout_gpus, rc.gpus, rc.nodes) == ("colocated", None, 8, 1)
    assert (rc.train_strategy, rc.zero_stage, rc.train_dtype) == ("deepspeed", 3, "bf16")
    assert (rc.optimizer_offload, rc.optimizer_on_cpu, rc.activation_checkpointing) == (True, True, "full")
    assert rc.remove_padding is True
    assert (rc.critic, rc.reward_model, rc.reference, rc.kl) == (True, True, True, 0.01)
    assert rc.knob("--critic_num_gpus_per_node").note.startswith("unused: every model shares")
    assert rc.knob("--ckpt_path").value == "/openrlhf/checkpoint/llama3-8b-rlhf/ckpt"


def test_openrlhf_separate_roles_count_every_gpu(tmp_path):
    script = tmp_path / "grpo.txt"
    script.write_text("python3 -m openrlhf.cli.train_ppo_ray --actor_num_nodes 2 --actor_num_gpus_per_node 8 "
                      "--ref_num_nodes 1 --ref_num_gpus_per_node 8 --vllm_num_engines 8 "
                      "--vllm_tensor_parallel_size 2 --advantage_estimator group_norm --init_kl_coef=1e-3 "
                      "--remote_rm_url http://rm:5000/get_reward --critic_num_nodes 1 --rollout_batch_size 128 "
                      "--n_samples_per_prompt 16 --train_batch_size 2048 --async_train\n")
    rc = read_run_config(script)
    assert (rc.critic, rc.reward_model, rc.reference, rc.kl) == (False, False, True, 0.001)
    assert rc.gpus == 16 + 8 + 16 and rc.nodes == 5 and rc.rollout_gpus == 16
    assert (rc.placement, rc.off_policy_steps) == ("one-step-off", 1)
    assert rc.knob("--critic_num_nodes").note.startswith("unused")
    rc = read_run_config(script, ["async_train=false", "colocate_actor_ref=true"])
    assert (rc.placement, rc.gpus) == ("split", 16 + 16)


# -- TRL -------------------------------------------------------------------------------------------------------
def test_trl_grpo_config_colocated():
    rc = read_run_config(DATA / "trl_grpo.yaml")
    assert rc.framework == "trl" and rc.model == "Qwen/Qwen2.5-1.5B-Instruct"
    # generation batch: 16 per GPU x 8 processes x steps_per_generation (= gradient_accumulation_steps 4)
    assert (rc.prompts_per_step, rc.responses_per_prompt) == (16 * 8 * 4 // 16, 16)
    assert (rc.train_mini_batch_sequences, rc.micro_batch_sequences_per_gpu) == (512, 16)
    assert (rc.prompt_tokens_max, rc.response_tokens_max) == (512, 1536)
    assert (rc.placement, rc.rollout_engine, rc.rollout_tp, rc.gpu_memory_utilization) == (
        "colocated", "vllm", 1, 0.3)
    assert (rc.reference, rc.kl, rc.old_logprob, rc.critic) == (True, 0.04, False, False)
    assert (rc.gpus, rc.gpus_per_node, rc.nodes, rc.activation_checkpointing) == (8, 8, 1, "full")


def test_trl_json_server_mode_and_no_reference(tmp_path):
    cfg = tmp_path / "grpo.json"
    cfg.write_text('{"per_device_train_batch_size": 4, "num_generations": 8, "steps_per_generation": 8, '
                   '"gradient_accumulation_steps": 2, "beta": 0.0, "use_vllm": true, "vllm_mode": "server", '
                   '"vllm_gpu_memory_utilization": 0.9, "max_completion_length": 4096}')
    rc = read_run_config(cfg, ["num_processes=4"])
    assert (rc.prompts_per_step, rc.train_mini_batch_sequences) == (4 * 4 * 8 // 8, 4 * 4 * 2)
    assert (rc.reference, rc.kl, rc.old_logprob) == (False, 0.0, True)  # 8 steps per generation > 2
    assert (rc.placement, rc.gpu_memory_utilization) == ("split", None)
    assert rc.knob("vllm_gpu_memory_utilization").note.startswith("unused in server mode")


# -- the package's boundaries ----------------------------------------------------------------------------------
def test_framework_can_be_forced_for_a_partial_file(tmp_path):
    cfg = tmp_path / "partial.yaml"
    cfg.write_text("data:\n  train_batch_size: 64\n")
    assert read_run_config(cfg, framework="verl").prompts_per_step == 64


def test_rlconfig_imports_no_heavy_stack():
    code = ("import sys, throughputlab.rlconfig as r; "
            "print(sorted(m for m in ('torch', 'vllm', 'scipy', 'pandas', 'numpy', 'throughputlab.fit') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_rlconfig_modules_are_short():
    pkg = Path(__file__).parent.parent / "throughputlab" / "rlconfig"
    assert {p.name: n for p in pkg.glob("*.py") if (n := len(p.read_text().splitlines())) > 420} == {}


def test_copied_recipe_finds_its_parent_beside_it(tmp_path):
    shutil.copy(DATA / "nemo" / "recipes" / "llm" / "grpo-qwen2.5-7b-2n8g-dtensor.yaml", tmp_path / "recipe.yaml")
    shutil.copy(DATA / "nemo" / "grpo_base.yaml", tmp_path / "grpo_base.yaml")
    assert read_run_config(tmp_path / "recipe.yaml").prompts_per_step == 64


def test_verl_global_micro_batch_is_divided_over_data_parallel_ranks(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("data: {train_batch_size: 64}\n"
                   "actor_rollout_ref:\n  actor: {ppo_mini_batch_size: 16, ppo_micro_batch_size: 32,"
                   " ulysses_sequence_parallel_size: 2, use_dynamic_bsz: false}\n"
                   "  rollout: {n: 4, log_prob_micro_batch_size: 64}\n"
                   "trainer: {n_gpus_per_node: 8, nnodes: 1}\n")
    rc = read_run_config(cfg)
    assert rc.micro_batch_sequences_per_gpu == 32 // (8 // 2)  # veRL: over GPUs / sequence-parallel size
    assert rc.logprob_micro_batch_sequences_per_gpu == 64 // 4
    assert rc.knob("actor_rollout_ref.actor.ppo_micro_batch_size").note.startswith("micro_batch_sequences_per_gpu")


def test_nemo_rl_defaults_may_be_a_list(tmp_path):
    (tmp_path / "a.yaml").write_text("grpo: {num_prompts_per_step: 8, num_generations_per_prompt: 4}\n")
    (tmp_path / "b.yaml").write_text("grpo: {num_generations_per_prompt: 16}\ncluster: {gpus_per_node: 4}\n")
    (tmp_path / "r.yaml").write_text("defaults: [a.yaml, b.yaml]\ncluster: {num_nodes: 2}\n")
    rc = read_run_config(tmp_path / "r.yaml")
    assert (rc.prompts_per_step, rc.responses_per_prompt, rc.gpus) == (8, 16, 8)  # later parents win
