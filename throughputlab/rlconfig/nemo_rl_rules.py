"""The NeMo-RL keys that do not change a step's time, each group with the reason (first match wins).

Patterns are globs over dotted key paths; a pattern that names a section covers every key in it.
Keys the reader takes (``nemo_rl.py``) are never matched here.
"""

from __future__ import annotations

G = "policy.generation"
V = "policy.generation.vllm_cfg"

RULES: list[tuple[tuple[str, ...], str]] = [
    (("logger", f"{V}.enable_vllm_metrics_logger", f"{V}.vllm_metrics_logger_interval"), "logging"),
    (("checkpointing",), "checkpointing to disk: not part of a step"),
    (("grpo.val_period", "grpo.val_at_start", "grpo.val_at_end", "grpo.max_val_samples", "grpo.val_batch_size"),
     "validation: runs between steps, not in them"),
    (("grpo.max_num_epochs", "grpo.max_num_steps"), "run length: how many steps, not how long one takes"),
    (("data", "policy.tokenizer"), "data paths, prompts and tokenizer"),
    (("env", "grpo.reward_shaping", "grpo.reward_scaling"), "the reward environment: scored on the CPU, not modelled"),
    (("grpo.use_dynamic_sampling", "grpo.dynamic_sampling_max_gen_batches", "grpo.batch_multiplier"),
     "dynamic sampling: extra generation rounds are not modelled; prompts_per_step counts the trained batch"),
    (("grpo.async_grpo.in_flight_weight_updates", "grpo.async_grpo.recompute_kv_cache_after_weight_updates"),
     "in-flight weight updates: generation keeps going during the weight sync; not modelled"),
    (("loss_fn", "grpo.normalize_rewards", "grpo.use_leave_one_out_baseline", "grpo.adv_estimator",
      "grpo.overlong_filtering", "grpo.seed", "grpo.seq_logprob_error_threshold", "grpo.stop_properly_penalty_coef"),
     "loss and advantage settings: the same forward and backward work per step"),
    (("policy.optimizer", "policy.scheduler", "policy.max_grad_norm", "policy.megatron_cfg.optimizer",
      "policy.megatron_cfg.scheduler"), "optimizer hyperparameters: the same work per step"),
    ((f"{G}.temperature", f"{G}.top_p", f"{G}.top_k", f"{G}.stop_token_ids", f"{G}.stop_strings"),
     "sampling settings: they change response lengths, which the step model takes as measured or given"),
    ((f"{G}.mcore_generation_config",), "settings of the Megatron generation backend: unused with vLLM"),
    ((f"{V}.max_model_len",), "the engine's context: the sequence cap (policy.max_total_sequence_length)"),
    ((f"{V}.kv_cache_dtype", f"{V}.use_deep_gemm", f"{V}.num_last_layers_in_bf16", f"{V}.num_first_layers_in_bf16",
      f"{V}.pipeline_parallel_size", f"{V}.expert_parallel_size", f"{G}.vllm_kwargs", f"{G}.colocated.resources"),
     "engine details the step model does not take (KV-cache dtype, FP8 kernels, engine PP/EP, extra kwargs)"),
    (("policy.hf_config_overrides", "policy.generation_batch_size", "policy.logprob_chunk_size",
      "policy.make_sequence_length_divisible_by", "policy.sequence_packing.algorithm",
      "policy.sequence_packing.sequence_length_round", "policy.dynamic_batching.sequence_length_round",
      "policy.offload_optimizer_for_logprob", "policy.draft"),
     "padding granularity, packing algorithm, log-prob chunking, HF-backend batch, draft model: not modelled"),
    (("policy.dtensor_cfg",), "DTensor details (sequence parallel within TP, parallel plan, LoRA options): "
                              "not modelled"),
    (("policy.megatron_cfg",), "Megatron engine details (fusions, MoE router and dispatcher, layer split, "
                               "DDP overlap, memory level, environment): not modelled"),
]
