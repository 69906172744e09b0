"""OpenRLHF: the ``train_ppo_ray`` (or ``train_ppo``) command line of a launch script, read into a
``RunConfig``.

Each role (actor, reference, critic, reward model, vLLM engines) gets its own GPUs unless the
``--colocate_*`` flags share them; ``--colocate_all_models`` puts every model and the engines on the
actor's GPUs. ``--rollout_batch_size`` counts prompts, ``--train_batch_size`` and the micro-batches
count samples (responses). A flag the command does not give is left ``None`` (OpenRLHF's default).
"""

from __future__ import annotations

import math
import re
from typing import Optional

from throughputlab.errors import UserError
from throughputlab.rlconfig.common import Ctx
from throughputlab.rlconfig.shell import find_command, flags

MARKERS = ("train_ppo_ray", "openrlhf.cli.train_ppo", "train_ppo.py")
_VERSION = re.compile(r"openrlhf\s*==\s*([0-9][\w.]*)")


def looks_like(text: str) -> bool:
    return any(m in text for m in MARKERS)


def parse(text: str, src: str) -> tuple[dict, list[tuple[str, str, str]], Optional[str], bool]:
    """The command's flags as {``--flag``: value}, the words that are not flags (launcher first), the
    version a ``pip install openrlhf==X`` line pins, and whether it is the Ray trainer."""
    launcher, args = find_command(text, MARKERS, src, "OpenRLHF train_ppo")
    tree, stray = flags(args, src)
    extra = [("launcher", " ".join(launcher), "the command that starts the trainer (ray job submit, "
                                               "deepspeed, python): not a setting")]
    if stray:
        extra.append(("arguments", " ".join(stray), "words that are not --flags: not read"))
    m = _VERSION.search(text)
    return tree, extra, m.group(1) if m else None, "train_ppo_ray" in launcher[-1]


def read(ctx: Ctx, ray: bool = True) -> None:
    if not ctx.stated("--rollout_batch_size") and not ctx.stated("--train_batch_size"):
        raise UserError(f"{ctx.src}: no batch size in the command: give --rollout_batch_size (prompts per step) "
                        "and --train_batch_size (samples per optimizer step)")
    ctx.int("--rollout_batch_size", "prompts_per_step")
    ctx.int("--n_samples_per_prompt", "responses_per_prompt")
    ctx.int("--train_batch_size", "train_mini_batch_sequences")
    ctx.int("--micro_train_batch_size", "micro_batch_sequences_per_gpu")
    mrb = ctx.int("--micro_rollout_batch_size", "logprob_micro_batch_sequences_per_gpu",
                  note="forward passes of the experience step (actor, reference, critic, reward)")
    ctx.set("ref_micro_batch_sequences_per_gpu", mrb, "--micro_rollout_batch_size")
    ctx.int("--max_epochs", "epochs")
    ctx.int("--prompt_max_len", "prompt_tokens_max")
    ctx.int("--generate_max_len", "response_tokens_max")
    ctx.int("--max_len", "sequence_tokens_max")
    ctx.str("--pretrain", "model")
    episode_fn = ctx.str("--agent_func_path", note="a custom episode function: multi-turn episodes")
    if episode_fn:
        ctx.set("multi_turn", True, "--agent_func_path")
    _training(ctx)
    roles = _roles(ctx)
    _generation_and_cluster(ctx, roles, ray)


def _training(ctx: Ctx) -> None:
    zero = ctx.int("--zero_stage", "zero_stage", minimum=0)
    if zero is not None:
        ctx.set("train_strategy", "deepspeed", "--zero_stage")
    gc = ctx.bool("--gradient_checkpointing", note="activation checkpointing of every layer")
    ctx.set("activation_checkpointing", None if gc is None else ("full" if gc else "none"), "--gradient_checkpointing")
    adam = ctx.bool("--adam_offload", note="DeepSpeed keeps Adam's state on the CPU and steps there")
    ctx.set("optimizer_offload", adam, "--adam_offload")
    ctx.set("optimizer_on_cpu", adam, "--adam_offload")
    if ctx.bool("--bf16", note="bf16 training"):
        ctx.set("train_dtype", "bf16", "--bf16")
    ctx.bool("--packing_samples", "remove_padding")
    ctx.bool("--use_dynamic_batch", "dynamic_batch")
    ctx.int("--train_max_tokens_per_gpu", "token_budget_per_gpu")
    budget = ctx.int("--rollout_max_tokens_per_gpu", "logprob_token_budget_per_gpu")
    ctx.set("ref_token_budget_per_gpu", budget, "--rollout_max_tokens_per_gpu")
    ctx.int("--ring_attn_size", "sequence_parallel")
    ctx.int("--ds_tensor_parallel_size", "train_tp")
    ctx.int("--lora_rank", "lora_rank", minimum=0)


def _roles(ctx: Ctx) -> dict[str, Optional[bool]]:
    """Which models the step runs besides the actor."""
    adv = ctx.str("--advantage_estimator", "algorithm")
    cp = ctx.str("--critic_pretrain", "critic_model")
    critic = (adv == "gae") if adv is not None else (True if cp else None)
    ctx.set("critic", critic, "--advantage_estimator" if adv is not None else "--critic_pretrain")
    if critic is False:
        for f in ("--critic_pretrain", "--critic_num_nodes", "--critic_num_gpus_per_node", "--critic_learning_rate",
                  "--colocate_critic_reward", "--value_clip", "--save_value_network"):
            if ctx.has(f):
                ctx.ignore(f, f"unused: no critic with --advantage_estimator {adv}")
    rp = ctx.str("--reward_pretrain", note="a reward model scores each response")
    url = ctx.str("--remote_rm_url", note="rewards come from a remote function, not a model")
    reward = False if url else (True if rp else None)
    ctx.set("reward_model", reward, "--remote_rm_url" if url else "--reward_pretrain")
    kl = ctx.float("--init_kl_coef", "kl", note="OpenRLHF loads no reference model when it is 0")
    in_loss = ctx.bool("--use_kl_loss", note="KL in the loss instead of the reward")
    ref = None if kl is None else kl > 0
    ctx.set("reference", ref, "--init_kl_coef")
    if ref is False and in_loss:
        ctx.set("reference", True, "--use_kl_loss")
    return {"critic": critic, "reward": reward, "reference": ctx.fields.get("reference")}


def _count(ctx: Ctx, role: str) -> tuple[Optional[int], Optional[int]]:
    return (ctx.int(f"--{role}_num_nodes", note=f"nodes of the {role}"),
            ctx.int(f"--{role}_num_gpus_per_node", note=f"GPUs per node of the {role}"))


def _shared(roles: dict, together, actor_ref, critic_reward) -> dict[str, Optional[str]]:
    """Why a role has no GPUs of its own (None: it has)."""
    if together:
        return dict.fromkeys(("ref", "critic", "reward"), "every model shares the actor's GPUs (--colocate_all_models)")
    out: dict[str, Optional[str]] = {"ref": None, "critic": None, "reward": None}
    if roles["reference"] is False:
        out["ref"] = "no reference model (--init_kl_coef 0)"
    elif actor_ref:
        out["ref"] = "the reference model shares the actor's GPUs (--colocate_actor_ref)"
    if roles["critic"] is False:
        out["critic"] = "no critic"
    if roles["reward"] is False:
        out["reward"] = "no reward model (--remote_rm_url)"
    elif critic_reward and roles["critic"]:
        out["reward"] = "the reward model shares the critic's GPUs (--colocate_critic_reward)"
    return out


def _generation_and_cluster(ctx: Ctx, roles: dict, ray: bool) -> None:
    engines = ctx.int("--vllm_num_engines", minimum=0, note="vLLM engines")
    tp = ctx.int("--vllm_tensor_parallel_size", "rollout_tp")
    ctx.float("--vllm_gpu_memory_utilization", "gpu_memory_utilization", lo=0.01, hi=1.0)
    ctx.bool("--enforce_eager", "enforce_eager")
    ctx.bool("--vllm_enable_sleep", note="the engines free their memory while the models train (colocation)")
    ctx.bool("--deepspeed_enable_sleep", "states_sleep", note="the models free their memory while the engines generate")
    together = ctx.bool("--colocate_all_models", note="every model and the engines share the actor's GPUs")
    actor_ref = ctx.bool("--colocate_actor_ref", note="actor and reference share GPUs")
    critic_reward = ctx.bool("--colocate_critic_reward", note="critic and reward model share GPUs")
    asy = ctx.bool("--async_train", note="generation of the next batch overlaps training")
    gen = (engines or 0) > 0 if engines is not None else None
    ctx.set("rollout_engine", None if gen is None else ("vllm" if gen else "hf"), "--vllm_num_engines")
    if not ray or gen is False:
        ctx.set("placement", "colocated", "--vllm_num_engines")  # the actor generates with HF on its own GPUs
    elif together:
        ctx.set("placement", "colocated", "--colocate_all_models")
    elif gen:
        ctx.set("placement", "one-step-off" if asy else "split", "--vllm_num_engines")
        ctx.set("off_policy_steps", 1 if asy else 0, "--async_train" if asy is not None else None)
        if tp is not None:
            ctx.set("rollout_gpus", engines * tp, "--vllm_num_engines")
    an, ag = _count(ctx, "actor")
    ctx.set("gpus_per_node", ag, "--actor_num_gpus_per_node")
    groups: list[tuple[Optional[int], Optional[int]]] = [(an, ag)]
    for role, why in _shared(roles, together, actor_ref, critic_reward).items():
        if why is None:
            groups.append(_count(ctx, role))
            continue
        for f in (f"--{role}_num_nodes", f"--{role}_num_gpus_per_node"):
            if ctx.has(f):
                ctx.ignore(f, f"unused: {why}")
    if together or not ray:
        if an is not None and ag is not None:
            ctx.set("gpus", an * ag, "--actor_num_nodes")
            ctx.set("nodes", an, "--actor_num_nodes")
        return
    if gen:
        groups.append((engines, tp))
    if all(a is not None and b is not None for a, b in groups) and ag:
        total = sum(a * b for a, b in groups)
        ctx.set("gpus", total, "--actor_num_nodes")
        ctx.set("nodes", math.ceil(total / ag), "--actor_num_nodes")


# The flags that do not change a step's time, each group with the reason (first match wins).
RULES: list[tuple[tuple[str, ...], str]] = [
    (("--use_wandb", "--wandb_*", "--use_tensorboard", "--logging_steps", "--perf", "--use_ms", "--verbose"),
     "logging"),
    (("--save_path", "--save_steps", "--ckpt_path", "--max_ckpt_num", "--max_ckpt_mem", "--load_checkpoint",
      "--use_ds_universal_ckpt", "--save_hf_ckpt", "--disable_ds_ckpt", "--save_value_network"),
     "checkpointing to disk: not part of a step"),
    (("--eval_steps", "--eval_dataset", "--eval_split", "--eval_temperature", "--eval_n_samples_per_prompt",
      "--eval_max_samples"), "evaluation: runs between steps, not in them"),
    (("--num_episodes", "--max_samples"), "run length: how many steps, not how long one takes"),
    (("--prompt_data", "--prompt_data_probs", "--prompt_split", "--input_key", "--label_key", "--input_template",
      "--apply_chat_template", "--tokenizer_chat_template", "--disable_fast_tokenizer", "--value_head_prefix",
      "--dataloader_num_workers"), "data paths, fields and tokenizer"),
    (("--actor_learning_rate", "--critic_learning_rate", "--lr_warmup_ratio", "--lr_scheduler", "--adam_betas",
      "--l2", "--max_norm", "--enable_ema", "--ema_beta", "--freezing_actor_steps"),
     "optimizer hyperparameters: the same work per step"),
    (("--eps_clip", "--eps_clip_low_high", "--value_clip", "--lambd", "--gamma", "--ptx_coef", "--normalize_reward",
      "--kl_target", "--kl_horizon", "--kl_estimator", "--aux_loss_coef", "--entropy_loss_coef", "--reward_clip_range",
      "--no_advantage_std_norm", "--policy_loss_type", "--seed", "--full_determinism",
      "--enable_vllm_is_correction", "--vllm_is_truncated_threshold", "--use_tis", "--tis_cap"),
     "loss and advantage settings: the same forward and backward work per step"),
    (("--dynamic_filtering", "--dynamic_filtering_reward_range"),
     "dynamic filtering: extra generation rounds are not modelled; prompts_per_step counts the trained batch"),
    (("--top_p", "--top_k", "--temperature"),
     "sampling settings: they change response lengths, which the step model takes as measured or given"),
    (("--enable_prefix_caching", "--vllm_sync_backend", "--vllm_sync_with_ray", "--vllm_generate_batch_size",
      "--ref_reward_offload"),
     "engine and weight-sync transport details, reference/reward offload: not modelled"),
    (("--local_rank", "--zpg", "--grad_accum_dtype", "--overlap_comm", "--gradient_checkpointing_use_reentrant",
      "--deepcompile", "--flash_attn", "--attn_implementation", "--use_liger_kernel", "--actor_init_on_gpu",
      "--load_in_4bit", "--lora_alpha", "--target_modules", "--lora_dropout", "--ring_head_stride"),
     "DeepSpeed, attention-kernel and LoRA details: not modelled (flash attention is assumed)"),
]
