"""rlconfig: a bad launch config is a one-line user error that names the file and the key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from throughputlab.errors import UserError
from throughputlab.rlconfig import read_run_config

DATA = Path(__file__).parent / "data" / "rlconfig"
VERL_MIN = ("data:\n  train_batch_size: 64\nactor_rollout_ref:\n  rollout:\n    n: 8\n"
            "    tensor_model_parallel_size: 2\n")


def _error(path, *fragments, overrides=(), framework=None) -> str:
    with pytest.raises(UserError) as e:
        read_run_config(path, overrides, framework=framework)
    msg = str(e.value)
    assert "\n" not in msg, msg
    assert str(path) in msg, msg
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


def _write(tmp_path, name: str, text) -> Path:
    p = tmp_path / name
    p.write_bytes(text) if isinstance(text, bytes) else p.write_text(text)
    return p


def test_typo_in_a_known_section_suggests_the_key(tmp_path):
    p = _write(tmp_path, "run.yaml", VERL_MIN.replace("tensor_model_parallel_size", "tensor_model_paralel_size"))
    _error(p, "actor_rollout_ref.rollout.tensor_model_paralel_size",
           "did you mean 'actor_rollout_ref.rollout.tensor_model_parallel_size'")


def test_typo_in_a_section_name(tmp_path):
    p = _write(tmp_path, "run.yaml", VERL_MIN.replace("rollout:", "rolout:"))
    _error(p, "actor_rollout_ref.rolout", "did you mean 'actor_rollout_ref.rollout'")


def test_typo_inside_a_section_the_rules_skip_is_still_caught(tmp_path):
    p = _write(tmp_path, "run.yaml", VERL_MIN + "  ref:\n    log_prob_micro_batch_size_per_gpux: 4\n")
    _error(p, "log_prob_micro_batch_size_per_gpux", "did you mean")


def test_typo_in_an_override_names_the_key(tmp_path):
    p = _write(tmp_path, "run.yaml", VERL_MIN)
    _error(p, "data.max_prompt_lenght", "did you mean 'data.max_prompt_length'",
           overrides=["data.max_prompt_lenght=512"])


def test_wrong_types(tmp_path):
    _error(_write(tmp_path, "a.yaml", VERL_MIN.replace("n: 8", "n: eight")),
           "actor_rollout_ref.rollout.n", "expected a whole number, got 'eight'")
    _error(_write(tmp_path, "b.yaml", VERL_MIN.replace("n: 8", "n: 0")), "actor_rollout_ref.rollout.n",
           "at least 1")
    _error(_write(tmp_path, "c.yaml", VERL_MIN + "    enforce_eager: maybe\n"), "enforce_eager", "true or false")
    _error(_write(tmp_path, "d.yaml", VERL_MIN + "    gpu_memory_utilization: 1.5\n"), "gpu_memory_utilization",
           "between")
    _error(_write(tmp_path, "e.yaml", VERL_MIN + "  actor:\n    strategy: fsdp3\n"), "actor_rollout_ref.actor.strategy",
           "did you mean 'fsdp'")
    _error(_write(tmp_path, "f.yaml", VERL_MIN + "    max_num_seqs: [1, 2]\n"), "max_num_seqs", "whole number")
    _error(_write(tmp_path, "g.yaml", VERL_MIN), "actor_rollout_ref.rollout.n", "eight",
           overrides=["actor_rollout_ref.rollout.n=eight"])


def test_no_batch_size_at_all(tmp_path):
    # veRL has defaults for every batch key (ppo_trainer.yaml): a file without them is a run at the defaults
    p = _write(tmp_path, "run.yaml", "actor_rollout_ref:\n  rollout:\n    tensor_model_parallel_size: 2\n")
    rc = read_run_config(p)
    assert (rc.prompts_per_step, rc.responses_per_prompt, rc.prompt_tokens_max, rc.response_tokens_max) == \
        (1024, 1, 512, 512)
    assert rc.reference is False and "veRL's default" in rc.knob("data.train_batch_size").note
    p = _write(tmp_path, "grpo.yaml", "trl_note: x\nnum_generations: 8\nuse_vllm: true\n")
    _error(p, "no batch size", "per_device_train_batch_size")
    p = _write(tmp_path, "cmd.sh", "python3 -m openrlhf.cli.train_ppo_ray --pretrain m --n_samples_per_prompt 8\n")
    _error(p, "no batch size", "--rollout_batch_size")
    p = _write(tmp_path, "recipe.yaml", "policy:\n  generation:\n    vllm_cfg:\n      tensor_parallel_size: 2\n")
    _error(p, "no batch size", "grpo.num_prompts_per_step")


def test_another_frameworks_file_when_one_is_forced():
    nemo = DATA / "nemo" / "recipes" / "llm" / "grpo-qwen2.5-7b-2n8g-dtensor.yaml"
    _error(nemo, "NeMo-RL config", "not a veRL one", framework="verl")
    _error(DATA / "trl_grpo.yaml", "TRL config", "not a NeMo-RL one", framework="nemo-rl")
    _error(DATA / "openrlhf_ppo_colocated.sh", "OpenRLHF config", "not a TRL one", framework="trl")
    _error(DATA / "verl_printed_ppo.yaml", "unknown framework 'deepspeed-chat'", framework="deepspeed-chat")


def test_not_a_launch_config(tmp_path):
    _error(_write(tmp_path, "model.yaml", "hidden_size: 4096\nnum_layers: 32\n"),
           "not a launch config", "hidden_size")


def test_defaults_parent_missing_names_both_files(tmp_path):
    p = _write(tmp_path, "recipe.yaml", "defaults: ../configs/grpo_base.yaml\ngrpo:\n  num_prompts_per_step: 8\n")
    msg = _error(p, "defaults names '../configs/grpo_base.yaml'", "grpo_base.yaml", "does not exist")
    assert str(tmp_path.parent / "configs" / "grpo_base.yaml") in msg


def test_defaults_cycle_names_both_files(tmp_path):
    a = _write(tmp_path, "a.yaml", "defaults: b.yaml\ngrpo:\n  num_prompts_per_step: 8\n")
    _write(tmp_path, "b.yaml", "defaults: ./a.yaml\npolicy:\n  train_global_batch_size: 64\n")
    msg = _error(a, "defaults cycle")
    assert str(tmp_path / "b.yaml") in msg and "a.yaml" in msg


def test_a_bad_parent_file_is_named(tmp_path):
    a = _write(tmp_path, "a.yaml", "defaults: b.yaml\ngrpo:\n  num_prompts_per_step: 8\n")
    _write(tmp_path, "b.yaml", "grpo: [unclosed\n")
    with pytest.raises(UserError) as e:
        read_run_config(a)
    assert str(tmp_path / "b.yaml") in str(e.value) and "YAML syntax error" in str(e.value)


def test_hydra_group_file_missing_names_both_files(tmp_path):
    shutil.copytree(DATA / "verl_hydra", tmp_path / "cfg")
    (tmp_path / "cfg" / "engine" / "fsdp.yaml").unlink()
    with pytest.raises(UserError) as e:
        read_run_config(tmp_path / "cfg" / "ppo_trainer.yaml")
    msg = str(e.value)
    assert "\n" not in msg and str(tmp_path / "cfg" / "actor" / "dp_actor.yaml") in msg
    assert str(tmp_path / "cfg" / "engine" / "fsdp.yaml") in msg and "does not exist" in msg


def test_empty_binary_and_cut_short_files(tmp_path):
    _error(_write(tmp_path, "empty.yaml", "  \n"), "empty file")
    _error(_write(tmp_path, "bin.yaml", b"\x89PNG\r\n\x1a\n\x00\x00"), "not a text file")
    _error(_write(tmp_path, "cut.yaml", "data:\n  train_batch_size: 64\nactor_rollout_ref: {rollout: {n: 8\n"),
           "YAML syntax error")
    _error(_write(tmp_path, "cut.json", '{"per_device_train_batch_size": 4, '), "not valid JSON", "cut short")
    _error(_write(tmp_path, "list.yaml", "- a\n- b\n"), "expected a mapping")
    # a known section that holds a list or a number
    _error(_write(tmp_path, "sec.yaml", "data:\n  train_batch_size: 64\nactor_rollout_ref:\n  rollout: 5\n"),
           "actor_rollout_ref.rollout: expected a section of keys, got int 5")
    # OpenRLHF flags without their command; a Python GRPOConfig call
    _error(_write(tmp_path, "flags.txt", "--actor_num_gpus_per_node 8 --micro_train_batch_size 4\n"),
           "flags without their command", "openrlhf.cli.train_ppo_ray")
    _error(_write(tmp_path, "grpo.py", "from trl import GRPOConfig\ncfg = GRPOConfig(beta=0.0, x: 1)\n"),
           "GRPOConfig(...)", "YAML or JSON")
    # veRL refuses a mini-batch larger than the step's batch
    _error(_write(tmp_path, "mini.yaml", "data:\n  train_batch_size: 64\nactor_rollout_ref:\n  actor:\n"
                  "    ppo_mini_batch_size: 128\n  rollout:\n    n: 8\n"),
           "actor_rollout_ref.actor.ppo_mini_batch_size", "more than the 64 prompts")
    _error(tmp_path / "missing.yaml", "no such file")


def test_cut_short_printed_log(tmp_path):
    text = (DATA / "verl_grpo_run.log").read_text().splitlines()
    _error(_write(tmp_path, "run.log", "\n".join(text[:30]) + "\n"), "line 3", "cut short")


def test_shell_variable_the_script_does_not_set(tmp_path):
    p = _write(tmp_path, "run.sh", "python3 -m openrlhf.cli.train_ppo_ray --rollout_batch_size $BATCH \\\n"
                                   "  --train_batch_size 128\n")
    _error(p, "--rollout_batch_size", "'$BATCH' is a shell variable")


def test_openrlhf_flag_typo_and_wrong_type(tmp_path):
    p = _write(tmp_path, "run.sh", "python3 -m openrlhf.cli.train_ppo_ray --rollout_batch_size 64 "
                                   "--n_samples_per_promt 8\n")
    _error(p, "--n_samples_per_promt", "did you mean '--n_samples_per_prompt'")
    p = _write(tmp_path, "run2.sh", "python3 -m openrlhf.cli.train_ppo_ray --rollout_batch_size sixty-four\n")
    _error(p, "--rollout_batch_size", "whole number")


def test_no_trainer_command_in_a_script(tmp_path):
    _error(_write(tmp_path, "run.sh", "echo openrlhf train_ppo_ray is great\n"), "no OpenRLHF train_ppo command")


def test_trl_generation_batch_not_a_multiple(tmp_path):
    p = _write(tmp_path, "grpo.yaml", "per_device_train_batch_size: 3\nnum_generations: 8\nnum_processes: 1\n")
    _error(p, "num_generations", "not a multiple of num_generations 8")
    p = _write(tmp_path, "both.yaml", "per_device_train_batch_size: 8\nsteps_per_generation: 2\n"
                                      "generation_batch_size: 64\nnum_generations: 8\n")
    _error(p, "steps_per_generation and generation_batch_size")


def test_nemo_rl_contradictions(tmp_path):
    base = "grpo:\n  num_prompts_per_step: 8\npolicy:\n"
    both = "  sequence_packing: {enabled: true}\n  dynamic_batching: {enabled: true}\n"
    _error(_write(tmp_path, "a.yaml", base + both), "sequence_packing.enabled and policy.dynamic_batching.enabled")
    _error(_write(tmp_path, "b.yaml", base + "  dtensor_cfg: {enabled: true}\n  megatron_cfg: {enabled: true}\n"),
           "megatron_cfg.enabled and policy.dtensor_cfg.enabled")


def test_unresolvable_interpolation_in_a_read_key(tmp_path):
    p = _write(tmp_path, "recipe.yaml", "grpo:\n  num_prompts_per_step: ${grpo.prompts}\n")
    _error(p, "grpo.num_prompts_per_step", "cannot resolve '${grpo.prompts}'")


def test_malformed_override(tmp_path):
    _error(_write(tmp_path, "run.yaml", VERL_MIN), "override 'data.train_batch_size'", "KEY=VALUE",
           overrides=["data.train_batch_size"])


def test_cli_style_one_line_through_the_user_error_path(tmp_path):
    p = _write(tmp_path, "run.yaml", VERL_MIN.replace("n: 8", "n: eight"))
    with pytest.raises(UserError) as e:
        read_run_config(p, source="--config run.yaml")
    assert str(e.value).startswith("--config run.yaml: actor_rollout_ref.rollout.n:")


def test_a_key_no_rule_knows_is_an_error_with_the_way_to_drop_it(tmp_path):
    import pytest as _pytest

    from throughputlab.errors import UserError
    from throughputlab.rlconfig import read_run_config

    recipe = Path(__file__).parent / "data" / "rlconfig" / "nemo" / "recipes" / "llm" / "grpo-qwen2.5-7b-2n8g-dtensor.yaml"
    with _pytest.raises(UserError) as e:
        read_run_config(recipe, ["grpo.entirely_new_knob=3"])
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and "'grpo.entirely_new_knob'" in msg and "--config-set '~grpo.entirely_new_knob'" in msg
