"""rlconfig on the published runs' own configs (benchmarks/data/rl_runs/): every config file of every
run is read without error, every key of it is read or ignored for a reason, the cluster and
placement agree with the run's folder name, and a few knobs per framework match the files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from conftest import config_leaves
from throughputlab.rlconfig import read_run_config

RUNS = Path(__file__).parent.parent / "benchmarks" / "data" / "rl_runs"
NOT_CONFIG = {"README.md", "published.yaml"}
PREFIX = {"verl": "verl", "nemo-rl": "nemo-rl", "openrlhf": "openrlhf", "trl": "trl"}


def _runs() -> list[Path]:
    """The run folders: each holds a published.yaml (models/ holds the model configs the runs need)."""
    return sorted(p for p in RUNS.iterdir() if (p / "published.yaml").is_file()) if RUNS.is_dir() else []


def _config_files() -> list[Path]:
    return [f for run in _runs() for f in sorted(run.iterdir()) if f.is_file() and f.name not in NOT_CONFIG]


def _listed(run: Path) -> set[str]:
    pub = yaml.safe_load((run / "published.yaml").read_text())
    return {f for k, v in pub.items() if k.startswith("config_files") for f in v}




def test_there_are_published_runs_of_each_framework_with_a_config():
    runs = _runs()
    assert len(runs) >= 33
    assert {r.name.split("_")[0] for r in runs} >= {"verl", "nemo-rl", "openrlhf"}


@pytest.mark.parametrize("run", _runs(), ids=lambda p: p.name)
def test_every_file_published_yaml_names_is_there_and_is_the_whole_config(run):
    present = {f.name for f in run.iterdir() if f.is_file()} - NOT_CONFIG
    assert _listed(run) == present


@pytest.mark.parametrize("cfg", _config_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_published_config_reads_and_accounts_for_every_key(cfg):
    rc = read_run_config(cfg)
    assert rc.framework == PREFIX[cfg.parent.name.split("_")[0]]
    seen = {k.key for k in (*rc.read, *rc.ignored)}
    if cfg.suffix in (".yaml", ".yml"):
        own = yaml.safe_load(cfg.read_text()) or {}
        own.pop("defaults", None)
        missing = [k for k in config_leaves(own) if not any(".".join(k.split(".")[:i]) in seen
                                                      for i in range(1, k.count(".") + 2))]
        assert not missing, missing
    else:
        flags = set(re.findall(r"(?<!\S)(--[a-z_]+)", cfg.read_text()))
        assert flags <= seen, flags - seen
    assert rc.prompts_per_step or rc.train_mini_batch_sequences or rc.knob(
        "actor_rollout_ref.actor.ppo_mini_batch_size")


@pytest.mark.parametrize("run", _runs(), ids=lambda p: p.name)
def test_cluster_and_placement_agree_with_the_run_folder(run):
    cfg = next(f for f in (run / "config.yaml", run / "command.sh") if f.is_file())
    rc = read_run_config(cfg)
    gpus = int(re.search(r"_(\d+)gpu_", run.name).group(1))
    assert rc.gpus in (None, gpus)
    variant = run.name.rsplit("_", 1)[-1]
    if "colocated" in variant:
        assert rc.placement in (None, "colocated") and rc.rollout_gpus is None
    if "async" in variant or "onestepoff" in variant:
        assert rc.placement == "one-step-off" and rc.rollout_gpus and rc.rollout_gpus < rc.gpus
    if "fullyasync" in variant:
        left, right = re.search(r"(\d+)-(\d+)$", variant).groups()
        assert (rc.rollout_gpus, rc.gpus - rc.rollout_gpus) == (int(left), int(right)) and rc.streaming
    if "onestepoff" in variant:
        assert rc.off_policy_steps == 1 and rc.rollout_gpus == 4 and rc.gpus == 16
    if m := re.search(r"async(\d+)off", variant):
        assert rc.off_policy_steps == int(m.group(1))


# Values checked by eye against each file (the run's config and its parents).
EXPECTED = {
    "verl_qwen2.5-0.5b-instruct_grpo_8gpu_h100-colocated/config.yaml": dict(
        prompts_per_step=256, responses_per_prompt=2, prompt_tokens_max=512, response_tokens_max=192, rollout_tp=1,
        gpu_memory_utilization=0.6, enforce_eager=True, max_num_batched_tokens=8192, train_mini_batch_sequences=128,
        dynamic_batch=True, token_budget_per_gpu=8000, micro_batch_sequences_per_gpu=None, remove_padding=True,
        activation_checkpointing="full", reference=True, kl=0.001, critic=False, placement="colocated"),
    "verl_qwen2.5-0.5b-instruct_ppo_8gpu_h100-colocated/config.yaml": dict(
        prompts_per_step=2048, responses_per_prompt=1, train_mini_batch_sequences=512, micro_batch_sequences_per_gpu=4,
        dynamic_batch=False, logprob_micro_batch_sequences_per_gpu=8, ref_micro_batch_sequences_per_gpu=None,
        critic=True, critic_micro_batch_sequences_per_gpu=4, reference=False, remove_padding=False),
    "verl_deepseek-v3-671b_grpo_96gpu_h20-colocated-megatron/config.yaml": dict(
        prompts_per_step=96, responses_per_prompt=8, response_tokens_max=9632, train_strategy="megatron", train_tp=8,
        train_pp=12, train_ep=8, rollout_tp=32, gpu_memory_utilization=0.6, activation_checkpointing="full",
        param_offload=True, optimizer_offload=False, optimizer_on_cpu=True, token_budget_per_gpu=11680, gpus=96),
    "verl_qwen2.5-math-7b_dapo_16gpu_h20-onestepoff-fsdp2-4-12/config.yaml": dict(
        prompts_per_step=512, responses_per_prompt=12, train_strategy="fsdp2", sequence_parallel=4,
        token_budget_per_gpu=20480, param_offload=False, gpus_per_node=8, nodes=2, off_policy_steps=1),
    "verl_qwen2.5-math-7b_dapo_128gpu_h20-fullyasync64-64/config.yaml": dict(
        prompts_per_step=32 * 4, responses_per_prompt=16, response_tokens_max=28672, rollout_tp=4,
        rollout_async_engine=True, gpus_per_node=8, nodes=16),
    "verl_qwen2.5-math-7b_dapo_16gpu_h20-colocated-10k/config.yaml": dict(
        prompts_per_step=1024, responses_per_prompt=16, response_tokens_max=10240, train_mini_batch_sequences=512),
    "verl_qwen2.5-7b-instruct-retool-sft_dapo_32gpu_h20-colocated-multiturn/config.yaml": dict(
        prompts_per_step=64, responses_per_prompt=1, train_mini_batch_sequences=16, multi_turn=True),
    "nemo-rl_llama3.1-8b-instruct_grpo_16gpu_h100-colocated/config.yaml": dict(
        prompts_per_step=64, responses_per_prompt=32, train_mini_batch_sequences=512, micro_batch_sequences_per_gpu=1,
        logprob_micro_batch_sequences_per_gpu=2, sequence_tokens_max=4096, response_tokens_max=4096,
        train_strategy="megatron", train_pp=2, train_tp=1, rollout_tp=1, gpu_memory_utilization=0.6,
        activation_checkpointing="full", remove_padding=True, token_budget_per_gpu=4096, kl=0.01,
        placement="colocated", gpus=16),
    "nemo-rl_qwen3-30b-a3b_grpo_32gpu_h100-async1off/config.yaml": dict(
        train_ep=8, train_pp=2, rollout_tp=2, gpu_memory_utilization=0.8, rollout_gpus=16, rollout_async_engine=True,
        logprob_micro_batch_sequences_per_gpu=4, activation_checkpointing="none"),
    "nemo-rl_qwen3-30b-a3b_grpo_32gpu_h100-async1off/config_v0.4.0.yaml": dict(train_tp=2, rollout_tp=4, train_pp=1),
    "nemo-rl_qwen3-30b-a3b_grpo_192gpu_h100-async8off/config.yaml": dict(
        off_policy_steps=8, rollout_gpus=64, gpus=192, logprob_micro_batch_sequences_per_gpu=4),
    "nemo-rl_llama3.1-8b-instruct_grpo_16gpu_h100-fp8-async1off/config.yaml": dict(
        train_dtype="fp8", rollout_dtype="fp8", train_pp=1, rollout_gpus=8),
    "nemo-rl_deepseek-v3_grpo_256gpu_h100-colocated/config.yaml": dict(
        train_ep=16, train_pp=16, rollout_tp=32, sequence_tokens_max=1536, rollout_async_engine=True,
        prompts_per_step=32, responses_per_prompt=16),
    "nemo-rl_qwen3-235b-a22b_grpo_128gpu_h100-colocated/config.yaml": dict(
        train_tp=2, train_pp=8, sequence_parallel=2, train_ep=16, rollout_tp=16, sequence_tokens_max=8192),
    "openrlhf_llama2-7b_ppo_16gpu_a800/command.sh": dict(
        prompts_per_step=1024, epochs=1, responses_per_prompt=None, gpus=None, placement=None),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_published_config_knobs(name):
    rc = read_run_config(RUNS / name)
    got = {k: getattr(rc, k) for k in EXPECTED[name]}
    assert got == EXPECTED[name]
