"""OpenRLHF: the ``train_ppo_ray`` (or ``train_ppo``) command line of a launch script, read into a
``RunConfig``.

Each role (actor, reference, critic, reward model, vLLM engines) gets its own GPUs unless the
``--colocate_*`` flags share them; ``--colocate_all_models`` puts every model and the engines on the
actor's GPUs. ``--rollout_batch_size`` counts prompts, ``--train_batch_size`` and the micro-batches
count samples (responses). A flag the command does not give is left ``None`` (OpenRLHF's default).
From v0.10 the flags are sectioned (``--rollout.batch_size``, ``--train.colocate_all``): a command in that
form is read by those names (``RENAMED``), nested like dotted keys.
"""

from __future__ import annotations

import math
import re
from typing import Callable, Optional

from throughputlab.errors import UserError
from throughputlab.rlconfig.common import Ctx, set_path
from throughputlab.rlconfig.shell import find_command, flags

MARKERS = ("train_ppo_ray", "openrlhf.cli.train_ppo", "train_ppo.py")
_VERSION = re.compile(r"openrlhf\s*==\s*([0-9][\w.]*)")


# OpenRLHF v0.10 put its flags in sections (openrlhf/cli/train_ppo_ray.py at v0.10.4 and v0.11.0): the new name of
# each flag the reader takes. A command in the new form is read by these names; the old ones stay for v0.9 and before.
RENAMED = {
    "--rollout_batch_size": "--rollout.batch_size", "--n_samples_per_prompt": "--rollout.n_samples_per_prompt",
    "--train_batch_size": "--train.batch_size", "--micro_train_batch_size": "--train.micro_batch_size",
    "--micro_rollout_batch_size": "--rollout.micro_batch_size", "--max_epochs": "--train.max_epochs",
    "--generate_max_len": "--rollout.max_new_tokens", "--max_len": "--data.max_len",
    "--pretrain": "--actor.model_name_or_path", "--agent_func_path": "--train.agent_func_path",
    "--zero_stage": "--ds.zero_stage", "--gradient_checkpointing": "--actor.gradient_checkpointing_enable",
    "--adam_offload": "--ds.adam_offload", "--packing_samples": "--ds.packing_samples",
    "--use_dynamic_batch": "--train.dynamic_batch_enable", "--train_max_tokens_per_gpu": "--train.max_tokens_per_gpu",
    "--rollout_max_tokens_per_gpu": "--rollout.max_tokens_per_gpu", "--ring_attn_size": "--ds.ring_attn_size",
    "--ds_tensor_parallel_size": "--ds.tensor_parallel_size", "--lora_rank": "--ds.lora.rank",
    "--advantage_estimator": "--algo.advantage.estimator", "--critic_pretrain": "--critic.model_name_or_path",
    "--reward_pretrain": "--reward.model_name_or_path", "--remote_rm_url": "--reward.remote_url",
    "--init_kl_coef": "--algo.kl.init_coef", "--use_kl_loss": "--algo.kl.use_loss",
    "--vllm_num_engines": "--vllm.num_engines", "--vllm_tensor_parallel_size": "--vllm.tensor_parallel_size",
    "--vllm_gpu_memory_utilization": "--vllm.gpu_memory_utilization", "--enforce_eager": "--vllm.enforce_eager",
    "--vllm_enable_sleep": "--vllm.enable_sleep", "--deepspeed_enable_sleep": "--ds.enable_sleep",
    "--colocate_all_models": "--train.colocate_all", "--colocate_actor_ref": "--train.colocate_actor_ref",
    "--colocate_critic_reward": "--train.colocate_critic_reward", "--async_train": "--train.async_enable",
    "--critic_learning_rate": "--critic.adam.lr", "--value_clip": "--critic.value_clip",
    "--save_value_network": "--critic.save_value_network",
    **{f"--{r}_num_{x}": f"--{r}.num_{x}" for r in ("actor", "ref", "critic", "reward") for x in ("nodes", "gpus_per_node")},
}


SECTIONS = ("rollout", "train", "actor", "critic", "ref", "reward", "vllm", "ds", "data", "algo", "ckpt", "eval", "logger")


def _namer(ctx: Ctx) -> Callable[[str], str]:
    """The flag names this command uses: v0.10's sectioned ones where it gives any, else the old ones."""
    new = any(isinstance(ctx.tree.get(f"--{sec}"), dict) for sec in SECTIONS)
    return (lambda f: RENAMED.get(f, f)) if new else (lambda f: f)


def looks_like(text: str) -> bool:
    return any(m in text for m in MARKERS)


def parse(text: str, src: str) -> tuple[dict, list[tuple[str, str, str]], Optional[str], bool]:
    """The command's flags as {``--flag``: value}, the words that are not flags (launcher first), the
    version a ``pip install openrlhf==X`` line pins, and whether it is the Ray trainer."""
    launcher, args = find_command(text, MARKERS, src, "OpenRLHF train_ppo")
    flat, stray = flags(args, src)
    tree: dict = {}
    for name, value in flat.items():  # v0.10's sectioned flags (--rollout.batch_size) nest like dotted keys
        set_path(tree, name, value)
    extra = [("launcher", " ".join(launcher), "the command that starts the trainer (ray job submit, "
                                               "deepspeed, python): not a setting")]
    if stray:
        extra.append(("arguments", " ".join(stray), "words that are not --flags: not read"))
    m = _VERSION.search(text)
    return tree, extra, m.group(1) if m else None, "train_ppo_ray" in launcher[-1]


def read(ctx: Ctx, ray: bool = True) -> None:
    n = _namer(ctx)
    if not ctx.stated(n("--rollout_batch_size")) and not ctx.stated(n("--train_batch_size")):
        raise UserError(f"{ctx.src}: no batch size in the command: give {n('--rollout_batch_size')} (prompts per step) "
                        f"and {n('--train_batch_size')} (samples per optimizer step)")
    ctx.int(n("--rollout_batch_size"), "prompts_per_step")
    ctx.int(n("--n_samples_per_prompt"), "responses_per_prompt")
    ctx.int(n("--train_batch_size"), "train_mini_batch_sequences")
    ctx.int(n("--micro_train_batch_size"), "micro_batch_sequences_per_gpu")
    mrb = ctx.int(n("--micro_rollout_batch_size"), "logprob_micro_batch_sequences_per_gpu",
                  note="forward passes of the experience step (actor, reference, critic, reward)")
    ctx.set("ref_micro_batch_sequences_per_gpu", mrb, n("--micro_rollout_batch_size"))
    ctx.int(n("--max_epochs"), "epochs")
    ctx.int(n("--prompt_max_len"), "prompt_tokens_max")
    ctx.int(n("--generate_max_len"), "response_tokens_max")
    ctx.int(n("--max_len"), "sequence_tokens_max")
    ctx.str(n("--pretrain"), "model")
    episode_fn = ctx.str(n("--agent_func_path"), note="a custom episode function: multi-turn episodes")
    if episode_fn:
        ctx.set("multi_turn", True, n("--agent_func_path"))
    _training(ctx, n)
    roles = _roles(ctx, n)
    _generation_and_cluster(ctx, roles, ray, n)


def _training(ctx: Ctx, n: Callable[[str], str]) -> None:
    zero = ctx.int(n("--zero_stage"), "zero_stage", minimum=0)
    if zero is not None:
        ctx.set("train_strategy", "deepspeed", n("--zero_stage"))
    gc = ctx.bool(n("--gradient_checkpointing"), note="activation checkpointing of every layer")
    ctx.set("activation_checkpointing", None if gc is None else ("full" if gc else "none"), n("--gradient_checkpointing"))
    adam = ctx.bool(n("--adam_offload"), note="DeepSpeed keeps Adam's state on the CPU and steps there")
    ctx.set("optimizer_offload", adam, n("--adam_offload"))
    ctx.set("optimizer_on_cpu", adam, n("--adam_offload"))
    if ctx.bool("--bf16", note="bf16 training"):
        ctx.set("train_dtype", "bf16", "--bf16")
    dtype = ctx.str("--ds.param_dtype", note="training precision (v0.10 on)")
    ctx.set("train_dtype", dtype, "--ds.param_dtype")
    ctx.bool(n("--packing_samples"), "remove_padding")
    ctx.bool(n("--use_dynamic_batch"), "dynamic_batch")
    ctx.int(n("--train_max_tokens_per_gpu"), "token_budget_per_gpu")
    budget = ctx.int(n("--rollout_max_tokens_per_gpu"), "logprob_token_budget_per_gpu")
    ctx.set("ref_token_budget_per_gpu", budget, n("--rollout_max_tokens_per_gpu"))
    ctx.int(n("--ring_attn_size"), "sequence_parallel")
    ctx.int(n("--ds_tensor_parallel_size"), "train_tp")
    ctx.int(n("--lora_rank"), "lora_rank", minimum=0)


def _roles(ctx: Ctx, n: Callable[[str], str]) -> dict[str, Optional[bool]]:
    """Which models the step runs besides the actor."""
    adv = ctx.str(n("--advantage_estimator"), "algorithm")
    cp = ctx.str(n("--critic_pretrain"), "critic_model")
    critic = (adv == "gae") if adv is not None else (True if cp else None)
    ctx.set("critic", critic, n("--advantage_estimator") if adv is not None else n("--critic_pretrain"))
    if critic is False:
        for f in ("--critic_pretrain", "--critic_num_nodes", "--critic_num_gpus_per_node", "--critic_learning_rate",
                  "--colocate_critic_reward", "--value_clip", "--save_value_network"):
            f = n(f)
            if ctx.has(f):
                ctx.ignore(f, f"unused: no critic with --advantage_estimator {adv}")
    rp = ctx.str(n("--reward_pretrain"), note="a reward model scores each response")
    url = ctx.str(n("--remote_rm_url"), note="rewards come from a remote function, not a model")
    reward = False if url else (True if rp else None)
    ctx.set("reward_model", reward, n("--remote_rm_url") if url else n("--reward_pretrain"))
    kl = ctx.float(n("--init_kl_coef"), "kl", note="OpenRLHF loads no reference model when it is 0")
    in_loss = ctx.bool(n("--use_kl_loss"), note="KL in the loss instead of the reward")
    ref = None if kl is None else kl > 0
    ctx.set("reference", ref, n("--init_kl_coef"))
    if ref is False and in_loss:
        ctx.set("reference", True, n("--use_kl_loss"))
    return {"critic": critic, "reward": reward, "reference": ctx.fields.get("reference")}


def _count(ctx: Ctx, role: str, n: Callable[[str], str]) -> tuple[Optional[int], Optional[int]]:
    return (ctx.int(n(f"--{role}_num_nodes"), note=f"nodes of the {role}"),
            ctx.int(n(f"--{role}_num_gpus_per_node"), note=f"GPUs per node of the {role}"))


def _shared(roles: dict, together, actor_ref, critic_reward,
            n: Callable[[str], str] = str) -> dict[str, Optional[str]]:
    """Why a role has no GPUs of its own (None: it has)."""
    if together:
        return dict.fromkeys(("ref", "critic", "reward"), f"every model shares the actor's GPUs ({n('--colocate_all_models')})")
    out: dict[str, Optional[str]] = {"ref": None, "critic": None, "reward": None}
    if roles["reference"] is False:
        out["ref"] = f"no reference model ({n('--init_kl_coef')} 0)"
    elif actor_ref:
        out["ref"] = f"the reference model shares the actor's GPUs ({n('--colocate_actor_ref')})"
    if roles["critic"] is False:
        out["critic"] = "no critic"
    if roles["reward"] is False:
        out["reward"] = f"no reward model ({n('--remote_rm_url')})"
    elif critic_reward and roles["critic"]:
        out["reward"] = f"the reward model shares the critic's GPUs ({n('--colocate_critic_reward')})"
    return out


def _generation_and_cluster(ctx: Ctx, roles: dict, ray: bool, n: Callable[[str], str]) -> None:
    engines = ctx.int(n("--vllm_num_engines"), minimum=0, note="vLLM engines")
    tp = ctx.int(n("--vllm_tensor_parallel_size"), "rollout_tp")
    ctx.float(n("--vllm_gpu_memory_utilization"), "gpu_memory_utilization", lo=0.01, hi=1.0)
    ctx.bool(n("--enforce_eager"), "enforce_eager")
    ctx.bool(n("--vllm_enable_sleep"), note="the engines free their memory while the models train (colocation)")
    ctx.bool(n("--deepspeed_enable_sleep"), "states_sleep", note="the models free their memory while the engines generate")
    together = ctx.bool(n("--colocate_all_models"), note="every model and the engines share the actor's GPUs")
    actor_ref = ctx.bool(n("--colocate_actor_ref"), note="actor and reference share GPUs")
    critic_reward = ctx.bool(n("--colocate_critic_reward"), note="critic and reward model share GPUs")
    asy = ctx.bool(n("--async_train"), note="generation of the next batch overlaps training")
    gen = (engines or 0) > 0 if engines is not None else None
    ctx.set("rollout_engine", None if gen is None else ("vllm" if gen else "hf"), n("--vllm_num_engines"))
    if not ray or gen is False:
        ctx.set("placement", "colocated", n("--vllm_num_engines"))  # the actor generates with HF on its own GPUs
    elif together:
        ctx.set("placement", "colocated", n("--colocate_all_models"))
    elif gen:
        ctx.set("placement", "one-step-off" if asy else "split", n("--vllm_num_engines"))
        ctx.set("off_policy_steps", 1 if asy else 0, n("--async_train") if asy is not None else None)
        if tp is not None:
            ctx.set("rollout_gpus", engines * tp, n("--vllm_num_engines"))
    an, ag = _count(ctx, "actor", n)
    ctx.set("gpus_per_node", ag, n("--actor_num_gpus_per_node"))
    groups: list[tuple[Optional[int], Optional[int]]] = [(an, ag)]
    for role, why in _shared(roles, together, actor_ref, critic_reward, n).items():
        if why is None:
            groups.append(_count(ctx, role, n))
            continue
        for f in (n(f"--{role}_num_nodes"), n(f"--{role}_num_gpus_per_node")):
            if ctx.has(f):
                ctx.ignore(f, f"unused: {why}")
    if together or not ray:
        if an is not None and ag is not None:
            ctx.set("gpus", an * ag, n("--actor_num_nodes"))
            ctx.set("nodes", an, n("--actor_num_nodes"))
        return
    if gen:
        groups.append((engines, tp))
    if all(a is not None and b is not None for a, b in groups) and ag:
        total = sum(a * b for a, b in groups)
        ctx.set("gpus", total, n("--actor_num_nodes"))
        ctx.set("nodes", math.ceil(total / ag), n("--actor_num_nodes"))


# The flags that do not change a step's time, each group with the reason (first match wins); v0.10's sectioned
# names beside the old ones.
RULES: list[tuple[tuple[str, ...], str]] = [
    (("--logger", "--use_ms"), "logging"),
    (("--ckpt", "--ds.use_universal_ckpt", "--critic.save_value_network"), "checkpointing to disk: not part of a step"),
    (("--eval",), "evaluation: runs between steps, not in them"),
    (("--train.num_episodes", "--data.max_samples"), "run length: how many steps, not how long one takes"),
    (("--data.prompt_dataset", "--data.prompt_probs", "--data.prompt_split", "--data.input_key", "--data.label_key",
      "--data.input_template", "--data.apply_chat_template", "--data.disable_fast_tokenizer", "--data.image_key",
      "--data.max_images_per_prompt", "--data.dataloader_num_workers", "--ds.value_head_prefix"),
     "data paths, fields and tokenizer"),
    (("--actor.adam", "--critic.adam", "--actor.muon", "--critic.muon", "--actor.optim", "--critic.optim",
      "--actor.lr_scheduler", "--critic.lr_scheduler", "--actor.lr_warmup_ratio", "--critic.lr_warmup_ratio",
      "--actor.min_lr_ratio", "--critic.min_lr_ratio", "--actor.max_norm", "--critic.max_norm", "--train.enable_ema",
      "--train.ema_beta", "--critic.freezing_steps"), "optimizer hyperparameters: the same work per step"),
    (("--actor.eps_clip", "--actor.eps_clip_low_high", "--actor.dual_clip", "--critic.value_clip",
      "--actor.aux_loss_coef", "--actor.entropy_coef", "--actor.policy_loss_type", "--algo.advantage.lambd",
      "--algo.advantage.gamma", "--algo.advantage.no_std_norm", "--algo.advantage.is_correction_*",
      "--algo.kl.target", "--algo.kl.horizon", "--algo.kl.estimator", "--reward.clip_range",
      "--reward.normalize_enable", "--reward.overlong_*", "--reward.stop_properly_penalty_coef", "--train.seed",
      "--train.full_determinism_enable"),
     "loss and advantage settings: the same forward and backward work per step"),
    (("--algo.dynamic_filtering_*",),
     "dynamic filtering: extra generation rounds are not modelled; prompts_per_step counts the trained batch"),
    (("--rollout.temperature", "--rollout.top_p"),
     "sampling settings: they change response lengths, which the step model takes as measured or given"),
    (("--vllm.enable_prefix_caching", "--vllm.sync_backend", "--vllm.sync_with_ray", "--rollout.vllm_generate_batch_size",
      "--ref.offload", "--reward.offload", "--train.async_queue_size", "--train.partial_rollout_enable"),
     "engine and weight-sync transport details, reference/reward offload, the async queue and partial rollouts: "
     "not modelled"),
    (("--ds.zpg", "--ds.grad_accum_dtype", "--ds.overlap_comm", "--actor.gradient_checkpointing_reentrant",
      "--ds.deepcompile", "--ds.attn_implementation", "--ds.experts_implementation", "--ds.use_liger_kernel",
      "--ds.load_in_4bit", "--ds.lora.alpha", "--ds.lora.target_modules", "--ds.lora.dropout",
      "--ds.ring_attn_head_stride", "--actor.freeze_visual_encoder"),
     "DeepSpeed, attention-kernel and LoRA details: not modelled (flash attention is assumed)"),
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
