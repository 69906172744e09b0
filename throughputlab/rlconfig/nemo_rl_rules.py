"""The NeMo-RL keys that do not change a step's time, each group with the reason (first match wins).

Patterns are globs over dotted key paths; a pattern that names a section covers every key in it.
Keys the reader takes (``nemo_rl.py``) are never matched here.
"""

from __future__ import annotations

G = "policy.generation"
V = "policy.generation.vllm_cfg"


def alg(*names: str) -> tuple[str, ...]:
    """``names`` under both algorithm sections: ``grpo.x`` and ``ppo.x`` (NeMo-RL's PPO recipes, v0.7 on, hold
    the same keys under ``ppo``)."""
    return tuple(f"{a}.{n}" for n in names for a in ("grpo", "ppo"))


RULES: list[tuple[tuple[str, ...], str]] = [
    (("logger", f"{V}.enable_vllm_metrics_logger", f"{V}.vllm_metrics_logger_interval", f"{V}.use_tqdm")
     + alg("debug_payload_metrics"), "logging"),
    (("checkpointing",), "checkpointing to disk: not part of a step"),
    (("_*",), "a helper section (a leading underscore) that other keys interpolate: not a setting"),
    (alg("val_period", "val_at_start", "val_at_end", "val_start_at", "max_val_samples", "val_batch_size",
         "val_num_generations_per_prompt", "num_val_generations_per_prompt", "stop_at_validation_metric", "stop_at_validation_threshold")
     + (f"{G}.val_temperature", f"{G}.val_top_p", f"{G}.val_top_k"),
     "validation: runs between steps, not in them"),
    (alg("max_num_epochs", "max_num_steps"), "run length: how many steps, not how long one takes"),
    (alg("policy_training_start_step"), "critic-only warm-up steps at the start of the run: not a steady step"),
    (("data", "policy.tokenizer", "sif_dir"), "data paths, prompts, tokenizer and container images"),
    (alg("deduplicate_multimodal_data") + (f"{V}.limit_mm_per_prompt", "policy.is_vlm"),
     "images, audio and video per prompt (vision and audio recipes): not modelled, the step is priced for its "
     "text tokens"),
    (("env", "reward_penalties") + alg("reward_shaping", "reward_scaling"),
     "the reward environment's other settings (math-verify scoring is priced from env.math)"),
    (alg("use_dynamic_sampling", "dynamic_sampling_max_gen_batches", "dynamic_sampling_oversample_ratio", "batch_multiplier"),
     "dynamic sampling: extra generation rounds are not modelled; prompts_per_step counts the trained batch"),
    (alg("async_grpo.in_flight_weight_updates", "async_grpo.recompute_kv_cache_after_weight_updates",
         "async_ppo.in_flight_weight_updates", "async_ppo.recompute_kv_cache_after_weight_updates"),
     "in-flight weight updates: generation keeps going during the weight sync; not modelled"),
    (alg("async_grpo.max_generation_failures", "async_ppo.max_generation_failures",
         "async_ppo.warmup_generation_lead_steps", "async_ppo.drop_incomplete_targets_on_restore"),
     "failure handling and warm-up of the asynchronous trainer: not a steady step's work"),
    (("async_rl",), "the single-controller runner (rollout pump, lookahead, retries, health checks, router): "
                    "not modelled; the step is priced by the placement the generation section gives"),
    (("loss_fn", "value_loss_fn")
     + alg("normalize_rewards", "use_leave_one_out_baseline", "adv_estimator", "overlong_filtering", "seed",
           "seq_logprob_error_threshold", "stop_properly_penalty_coef", "advantage_clip_low", "advantage_clip_high",
           "invalid_tool_call_advantage", "malformed_thinking_advantage", "penalize_invalid_tool_call",
           "penalize_malformed_thinking", "invalid_tool_call_strategy", "calculate_advantages_on_gpu",
           "use_best_at_k", "best_at_k_k", "best_at_k_m", "use_combined_training", "combined_training_weight_mode",
           "combined_training_best_at_k_weight", "combined_training_pass_at_1_weight"),
     "loss and advantage settings: the same forward and backward work per step"),
    (("policy.optimizer", "policy.scheduler", "policy.max_grad_norm", "policy.megatron_cfg.optimizer",
      "policy.megatron_cfg.scheduler"), "optimizer hyperparameters: the same work per step"),
    ((f"{G}.temperature", f"{G}.top_p", f"{G}.top_k", f"{G}.stop_token_ids", f"{G}.stop_strings", f"{G}.bad_words"),
     "sampling settings: they change response lengths, which the step model takes as measured or given"),
    ((f"{V}.logprobs_mode", f"{V}.enforce_monotonicity", f"{V}.enable_thinking"),
     "which log-probs the engine returns, chat-template switches: the same work per token"),
    ((f"{G}.mcore_generation_config",), "settings of the Megatron generation backend: unused with vLLM"),
    ((f"{V}.max_model_len", f"{V}.cap_max_tokens_to_context"), "the engine's context: the sequence cap (policy.max_total_sequence_length)"),
    ((f"{V}.kv_cache_dtype", f"{V}.use_deep_gemm", f"{V}.num_last_layers_in_bf16", f"{V}.num_first_layers_in_bf16",
      f"{V}.pipeline_parallel_size", f"{V}.expert_parallel_size", f"{V}.enable_expert_parallel",
      f"{V}.quantization_ignored_layer_kws", f"{V}.is_mx", f"{V}.distributed_executor_backend", f"{G}.vllm_kwargs", f"{G}.colocated.resources"),
     "engine details the step model does not take (KV-cache dtype, FP8 kernels, engine PP/EP, extra kwargs)"),
    ((f"{V}.enable_prefix_caching",), "prefix caching: a group's responses share their prompt, whose prefill "
                                      "the step model prices once per response (a small share of the step)"),
    ((f"{G}.real_quant", f"{G}.real_quant_export_cpu_offload", f"{G}.quant_cfg", "policy.quant_cfg",
      "policy.quant_calib_data", "policy.quant_calib_size", "policy.quant_batch_size", "policy.quant_sequence_length",
      "policy.disable_modelopt_layer_spec", f"{G}.real_quant_ignore"),
     "quantization-aware RL (the engines' NVFP4/INT4 weights, calibration): not modelled; the engines are priced "
     "at the generation precision"),
    ((f"{G}.refit_transport", f"{G}.refit_cfg", "policy.refit_buffer_size_gb", f"{V}.reset_encoder_cache_after_weight_update"),
     "the weight-sync transport (NIXL, ZMQ, CUDA IPC buffers): the step model prices the sync at the link rate"),
    (("cluster.master_port_range_low", "cluster.master_port_range_high", "cluster.segment_size",
      f"{G}.port_range_low", f"{G}.port_range_high", f"{V}.http_refit_server_port", f"{V}.zmq_refit_server_port",
      f"{V}.http_refit_api_key_env_var", f"{V}.expose_http_server", f"{V}.http_server_serving_chat_kwargs",
      f"{V}.skip_tokenizer_init", f"{V}.reasoning_parser_plugin", f"{V}.env_vars", "data_plane"),
     "ports, servers, environment and data transport between processes: not part of a step's compute"),
    (("on_policy_distillation",), "on-policy distillation (a teacher's forward pass each step): not modelled"),
    (("policy.router_replay",), "MoE router replay (the engines' expert choices reused in training): the same "
                                "expert work, not modelled"),
    (("policy.hf_config_overrides", "policy.generation_batch_size", "policy.logprob_chunk_size",
      "policy.make_sequence_length_divisible_by", "policy.sequence_packing.algorithm",
      "policy.sequence_packing.sequence_length_round", "policy.sequence_packing.microbatch_order",
      "policy.sequence_packing.fuse_loss", "policy.dynamic_batching.sequence_length_round",
      "policy.offload_optimizer_for_logprob", "policy.draft"),
     "padding granularity, packing algorithm, log-prob chunking, HF-backend batch, draft model: not modelled"),
    (("policy.dtensor_cfg",), "DTensor details (sequence parallel within TP, parallel plan, LoRA options): "
                              "not modelled"),
    (("policy.megatron_cfg",), "Megatron engine details (fusions, MoE router and dispatcher, layer split, "
                               "DDP overlap, memory level, environment): not modelled"),
    (("value",), "the value model's own settings (tokenizer, layout, optimizer, fusions): the step model runs the "
                 "critic with the policy's layout and length"),
]
