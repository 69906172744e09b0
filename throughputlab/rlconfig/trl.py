"""TRL: a ``GRPOConfig`` as YAML or JSON (the file ``trl grpo --config`` takes, script arguments and
accelerate's ``num_processes`` / ``num_machines`` alongside), read into a ``RunConfig``.

TRL counts completions: ``per_device_train_batch_size`` completions per GPU per micro-step; one
generation batch is ``per_device_train_batch_size x num_processes x steps_per_generation``
completions (``steps_per_generation`` defaults to ``gradient_accumulation_steps``), i.e. that
divided by ``num_generations`` prompts. ``beta`` 0 loads no reference model.
"""

from __future__ import annotations

from throughputlab.errors import UserError
from throughputlab.rlconfig.common import Ctx

GRPO_KEYS = {"num_generations", "max_completion_length", "use_vllm", "vllm_mode", "steps_per_generation",
             "generation_batch_size", "num_iterations", "vllm_gpu_memory_utilization", "vllm_tensor_parallel_size",
             "scale_rewards", "epsilon_high"}
DTYPES = {"bf16": "bf16", "fp16": "fp16", "no": "fp32"}


def looks_like(tree: dict) -> bool:
    return bool(GRPO_KEYS & set(tree))


def read(ctx: Ctx) -> None:
    if not ctx.stated("per_device_train_batch_size") and not ctx.stated("generation_batch_size"):
        raise UserError(f"{ctx.src}: no batch size in it: set per_device_train_batch_size (completions per GPU "
                        "per micro-step) or generation_batch_size")
    ctx.str("model_name_or_path", "model")
    pd = ctx.int("per_device_train_batch_size", "micro_batch_sequences_per_gpu")
    gas = ctx.int("gradient_accumulation_steps", note="micro-steps per optimizer step")
    procs = ctx.int("num_processes", "gpus", note="accelerate's processes: one training GPU each")
    if procs is None and pd is not None and not ctx.stated("generation_batch_size"):
        raise UserError(f"{ctx.src}: num_processes: not set, and TRL's batch is per_device_train_batch_size x "
                        "num_processes (accelerate's) x steps_per_generation: give it in the file or with "
                        "--config-set num_processes=N")
    machines = ctx.int("num_machines", "nodes")
    if procs is not None and machines:
        ctx.set("gpus_per_node", procs // machines, "num_machines")
    gen = ctx.int("num_generations", "responses_per_prompt")
    spg = ctx.int("steps_per_generation", note="micro-steps each generation batch feeds")
    gbs = ctx.int("generation_batch_size", note="completions generated per batch (all GPUs)")
    if spg is not None and gbs is not None:
        raise UserError(f"{ctx.src}: steps_per_generation and generation_batch_size are both set; TRL takes one "
                        "of them, remove the other")
    if pd is not None and procs is not None:
        ctx.set("train_mini_batch_sequences", pd * procs * (gas or 1), "gradient_accumulation_steps"
                if gas is not None else "per_device_train_batch_size")
        if gbs is None:
            gbs = pd * procs * (spg or gas or 1)
    if gbs is not None and gen is not None:
        if gbs % gen:
            raise UserError(f"{ctx.src}: num_generations: a generation batch of {gbs} completions is not a multiple "
                            f"of num_generations {gen}; TRL refuses it, change one of them")
        ctx.set("prompts_per_step", gbs // gen, "num_generations")
    ni = ctx.int("num_iterations", "epochs")
    if ni is not None and ni > 1:
        ctx.set("old_logprob", True, "num_iterations")
    elif ni == 1 and (spg is None or spg == (gas or 1)):
        ctx.set("old_logprob", False, "num_iterations")
    elif spg is not None and spg > (gas or 1):
        ctx.set("old_logprob", True, "steps_per_generation")
    ctx.int("max_prompt_length", "prompt_tokens_max")
    ctx.int("max_completion_length", "response_tokens_max")
    beta = ctx.float("beta", "kl", note="0 loads no reference model")
    if beta is None:  # GRPOConfig's default beta is 0.0: no reference model
        ctx.fields["kl"] = 0.0
        ctx.note("beta", 0.0, "reference = False; not set: TRL's default 0.0 (GRPOConfig), no reference model")
    ctx.set("reference", (beta or 0.0) != 0, "beta")
    gc = ctx.bool("gradient_checkpointing", note="activation checkpointing of every layer")
    if gc is None:  # GRPOConfig's default since v0.22
        gc = True
        ctx.note("gradient_checkpointing", True, "activation_checkpointing = 'full'; not set: TRL's default True "
                 "(GRPOConfig, v0.22 and later; False before: set it to say which)")
    ctx.set("activation_checkpointing", "full" if gc else "none", "gradient_checkpointing")
    for key, dtype in (("bf16", "bf16"), ("fp16", "fp16")):
        if ctx.bool(key, note=f"{dtype} training"):
            ctx.set("train_dtype", dtype, key)
    if not ctx.stated("bf16") and "train_dtype" not in ctx.fields:  # GRPOConfig: bf16 = not fp16 when unset
        ctx.note("bf16", True, "train_dtype = 'bf16'; not set: TRL's default, bf16 unless fp16 is set (GRPOConfig)")
        ctx.set("train_dtype", "bf16")
    if ctx.bool("use_peft", note="LoRA adapters"):
        ctx.int("lora_r", "lora_rank")
    ctx.set("critic", False)
    ctx.set("algorithm", "grpo")
    _generation(ctx)
    _distributed(ctx)


def _generation(ctx: Ctx) -> None:
    vllm = ctx.bool("use_vllm", note="generation with vLLM (else transformers on the training GPUs)")
    mode = ctx.str("vllm_mode", note="colocate: engines inside the training processes; server: its own GPUs",
                   choices=("colocate", "server")) if vllm is not False else None
    colocate_keys = ("vllm_gpu_memory_utilization", "vllm_tensor_parallel_size", "vllm_enable_sleep_mode")
    if vllm is False:
        ctx.set("rollout_engine", "hf", "use_vllm")
        ctx.set("placement", "colocated", "use_vllm")
        for k in ("vllm_mode", *colocate_keys, "vllm_server_host", "vllm_server_port", "vllm_server_base_url"):
            if ctx.has(k):
                ctx.ignore(k, "unused: use_vllm is false")
        return
    if vllm:
        ctx.set("rollout_engine", "vllm", "use_vllm")
    if vllm and mode is None:  # GRPOConfig's default vllm_mode: 'colocate' from v1.0, 'server' before
        mode = "colocate"
        ctx.note("vllm_mode", mode, "placement = 'colocated'; not set: TRL's default 'colocate' (GRPOConfig, v1.0 and "
                 "later; 'server' before, the engine on GPUs of its own: set it to say which)")
    if mode == "server":
        ctx.set("placement", "split", "vllm_mode")
        ctx.set("off_policy_steps", 0, "vllm_mode")
        for k in colocate_keys:
            if ctx.has(k):
                ctx.ignore(k, "unused in server mode: the server's own flags (trl vllm-serve) set it")
        return
    if mode == "colocate":
        ctx.set("placement", "colocated", "vllm_mode")
    ctx.int("vllm_tensor_parallel_size", "rollout_tp")
    ctx.float("vllm_gpu_memory_utilization", "gpu_memory_utilization", lo=0.01, hi=1.0)
    ctx.bool("vllm_enable_sleep_mode", note="the engine frees its memory while the model trains")


def _distributed(ctx: Ctx) -> None:
    """The trainer's sharding: TrainingArguments' ``deepspeed`` / ``fsdp`` or accelerate's keys."""
    dist = ctx.str("distributed_type", note="accelerate's backend")
    kinds = {"DEEPSPEED": "deepspeed", "FSDP": "fsdp", "MULTI_GPU": "ddp", "NO": "ddp"}
    ctx.set("train_strategy", kinds.get((dist or "").upper()), "distributed_type")
    if ctx.stated("deepspeed"):
        ctx.note("deepspeed", ctx.raw("deepspeed"), "train_strategy = 'deepspeed'")
        ctx.set("train_strategy", "deepspeed")
    if ctx.stated("fsdp") and ctx.raw("fsdp") not in ("", False, []):
        ctx.note("fsdp", ctx.raw("fsdp"), "train_strategy = 'fsdp'")
        ctx.set("train_strategy", "fsdp")
    mp = ctx.str("mixed_precision", note="accelerate's precision")
    if mp in DTYPES and "train_dtype" not in ctx.fields:
        ctx.set("train_dtype", DTYPES[mp], "mixed_precision")
    ds = "deepspeed_config"
    ctx.int(f"{ds}.zero_stage", "zero_stage", minimum=0)
    opt = ctx.str(f"{ds}.offload_optimizer_device", note="none, cpu or nvme")
    if opt is not None:
        ctx.set("optimizer_offload", opt != "none", f"{ds}.offload_optimizer_device")
        ctx.set("optimizer_on_cpu", opt != "none", f"{ds}.offload_optimizer_device")
    par = ctx.str(f"{ds}.offload_param_device", note="none, cpu or nvme")
    if par is not None:
        ctx.set("param_offload", par != "none", f"{ds}.offload_param_device")
    fc = "fsdp_config"
    ver = ctx.int(f"{fc}.fsdp_version", note="FSDP 1 or 2")
    if ver is not None and ctx.fields.get("train_strategy") in (None, "fsdp"):
        ctx.set("train_strategy", "fsdp2" if ver == 2 else "fsdp", f"{fc}.fsdp_version")
    ctx.bool(f"{fc}.fsdp_offload_params", "param_offload")
    if ctx.bool(f"{fc}.fsdp_activation_checkpointing", note="activation checkpointing of every layer"):
        ctx.set("activation_checkpointing", "full", f"{fc}.fsdp_activation_checkpointing")


# The keys that do not change a step's time, each group with the reason (first match wins).
RULES: list[tuple[tuple[str, ...], str]] = [
    (("report_to", "run_name", "logging_*", "log_*", "num_completions_to_print", "wandb_*", "disable_tqdm",
      "log_level", "log_level_replica", "log_on_each_node", "debug", "include_*", "*_metrics*", "project",
      "trackio_*"), "logging"),
    (("output_dir", "overwrite_output_dir", "save_*", "push_to_hub", "hub_*", "resume_from_checkpoint",
      "load_best_model_at_end", "metric_for_best_model", "greater_is_better", "restore_callback_states_from_checkpoint",
      "ignore_data_skip", "enable_jit_checkpoint"),
     "checkpointing to disk: not part of a step"),
    (("do_eval", "eval_*", "per_device_eval_batch_size", "do_predict", "prediction_loss_only", "bf16_full_eval",
      "fp16_full_eval"),
     "evaluation: runs between steps, not in them"),
    (("num_train_epochs", "max_steps", "do_train"), "run length: how many steps, not how long one takes"),
    (("dataset_*", "remove_unused_columns", "shuffle_dataset", "dataloader_*", "data_seed", "seed",
      "chat_template_path", "tokenizer_name_or_path", "model_revision", "trust_remote_code", "model_init_kwargs",
      "label_names", "length_column_name", "chat_template_kwargs", "pad_to_multiple_of", "train_sampling_strategy",
      "auto_find_batch_size", "average_tokens_across_devices", "accelerator_config", "full_determinism",
      "torch_empty_cache_steps"),
     "data, seeds, tokenizer, model loading and Trainer housekeeping"),
    (("learning_rate", "weight_decay", "adam_*", "max_grad_norm", "lr_scheduler_*", "warmup_*", "optim", "optim_args"),
     "optimizer hyperparameters: the same work per step"),
    (("epsilon", "epsilon_high", "delta", "loss_type", "scale_rewards", "reward_weights", "importance_sampling_level",
      "mask_truncated_completions", "top_entropy_quantile", "disable_dropout", "sync_ref_model", "ref_model_*",
      "vllm_importance_sampling_*", "cast_lm_head_to_fp32", "num_generations_eval", "multi_objective_aggregation",
      "entropy_coef*", "entropy_target", "use_adaptive_entropy", "off_policy_mask_threshold", "router_aux_loss_coef",
      "sapo_*", "vespo_*", "use_bias_correction_kl", "label_smoothing_factor", "neftune_noise_alpha"),
     "loss and advantage settings: the same forward and backward work per step"),
    (("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "generation_kwargs", "vllm_guided_decoding_regex",
      "vllm_structured_outputs_regex"),
     "sampling settings: they change response lengths, which the step model takes as measured or given"),
    (("vllm_server_host", "vllm_server_port", "vllm_server_base_url", "vllm_server_timeout", "vllm_model_impl",
      "vllm_group_port", "ds3_gather_for_generation", "use_transformers_paged", "cache_implementation",
      "vllm_max_model_length", "vllm_max_model_len", "vllm_device", "vllm_dtype", "vllm_enable_prefix_caching"),
     "engine address, implementation and weight-gathering details: not modelled"),
    (("use_transformers_continuous_batching", "transformers_continuous_batching_config", "use_cache"),
     "options of transformers' own generation loop (without vLLM): not modelled"),
    (("max_tool_calling_iterations",), "tool-calling turns: the number of turns is measured, not set here"),
    (("use_liger_loss", "use_liger_kernel", "torch_compile", "torch_compile_*", "tf32", "attn_implementation",
      "torch_dtype", "dtype", "gradient_checkpointing_kwargs", "lora_alpha", "lora_dropout", "lora_target_modules",
      "lora_*", "use_dora", "load_in_4bit", "load_in_8bit", "bnb_*", "use_bnb_nested_quant", "liger_kernel_config",
      "optim_target_modules"),
     "kernel, load dtype and LoRA details beyond the rank: not modelled"),
    (("local_rank", "ddp_*", "machine_rank", "main_process_ip", "main_process_port", "main_training_function",
      "compute_environment", "rdzv_backend", "same_network", "gpu_ids", "use_cpu", "downcast_bf16", "tpu_*",
      "enable_cpu_affinity", "dynamo_config", "deepspeed_config", "fsdp_config", "deepspeed", "fsdp",
      "parallelism_config"),
     "process launch and sharding details: not modelled"),
]
