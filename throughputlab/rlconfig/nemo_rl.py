"""NeMo-RL: a GRPO recipe (``examples/configs/...yaml``) with its ``defaults:`` parents, read into a
``RunConfig``.

A recipe names its parent file(s) relative to itself; the child's keys override the parent's,
mapping by mapping. When the relative path does not exist, a file of the same name next to the
recipe is used (a recipe copied out of the repository with its parents beside it). Sizes are
in sequences (``train_global_batch_size``, ``train_micro_batch_size``, ``logprob_batch_size``), the
lengths in tokens; ``max_total_sequence_length`` caps prompt plus response.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from throughputlab.errors import UserError
from throughputlab.files import read_settings
from throughputlab.rlconfig.common import Ctx, deep_merge

WHAT = "a NeMo-RL recipe (YAML)"
P = "policy"
G = "policy.generation"
V = "policy.generation.vllm_cfg"
DT = "policy.dtensor_cfg"
MG = "policy.megatron_cfg"
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "fp8": "fp8", "bf16": "bf16", "fp16": "fp16"}


def looks_like(tree: dict) -> bool:
    pol = tree.get("policy")
    return "grpo" in tree or "ppo" in tree or (isinstance(pol, dict) and bool({"generation", "dtensor_cfg", "megatron_cfg",
                                                              "train_global_batch_size"} & set(pol)))


def load(path: Path, data: dict, src: str, chain: tuple = ()) -> dict:
    """``data`` (the file at ``path``) merged over its ``defaults:`` parents, recursively."""
    here = src if not chain else str(path)
    chain = (*chain, path.resolve())
    parents = data.pop("defaults", None)
    if parents is None:
        return data
    names = [parents] if isinstance(parents, str) else parents
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UserError(f"{here}: defaults: expected a parent file name or a list of them, got {parents!r}"[:200])
    merged: dict = {}
    for name in names:
        cand = [Path(os.path.normpath(path.parent / name)), path.parent / Path(name).name]
        found = next((c for c in cand if c.is_file()), None)
        if found is None:
            looked = " or ".join(dict.fromkeys(str(c) for c in cand))
            raise UserError(f"{here}: defaults names {name!r}, but {looked} does not exist; put the parent "
                            "recipe there")
        if found.resolve() in chain:
            order = " -> ".join(str(c) for c in (*chain, found.resolve()))
            raise UserError(f"{here}: defaults cycle: {found} is its own ancestor ({order})")
        parent = read_settings(found, WHAT, str(found), yaml=True)
        merged = deep_merge(merged, load(found, parent, src, chain))
    return deep_merge(merged, data)


def algorithm(ctx: Ctx) -> str:
    """The section that holds the algorithm's keys: ``ppo`` in a PPO recipe (v0.7 on), else ``grpo``."""
    return "ppo" if ctx.has("ppo") and not ctx.has("grpo") else "grpo"


# NeMo-RL recipes of other trainers: no generation phase that a GRPO or PPO step has.
OTHER_TRAINERS = {"sft": "SFT", "dpo": "DPO", "rm": "reward-model", "distillation": "distillation"}


def read(ctx: Ctx) -> None:
    other = [name for key, name in OTHER_TRAINERS.items() if ctx.has(key)]
    if other and not (ctx.has("grpo") or ctx.has("ppo")):
        raise UserError(f"{ctx.src}: a NeMo-RL {other[0]} recipe, not an RL one; decide reads GRPO and PPO recipes "
                        "(a grpo: or ppo: section)")
    a = algorithm(ctx)
    if not ctx.stated(f"{a}.num_prompts_per_step") and not ctx.stated(f"{P}.train_global_batch_size"):
        raise UserError(f"{ctx.src}: no batch size in it: set {a}.num_prompts_per_step (prompts per step) "
                        "and policy.train_global_batch_size, or name the parent recipe under defaults:")
    ctx.int(f"{a}.num_prompts_per_step", "prompts_per_step")
    ctx.int(f"{a}.num_generations_per_prompt", "responses_per_prompt")
    turns = ctx.int(f"{a}.max_rollout_turns", note="turns per rollout")
    ctx.set("multi_turn", None if turns is None else turns > 1, f"{a}.max_rollout_turns")
    ctx.str(f"{a}.adv_estimator.name", "algorithm")
    if "algorithm" not in ctx.fields and ctx.has(a):
        ctx.set("algorithm", a)
    if a == "ppo":
        ctx.int("ppo.ppo_epochs", "epochs", note="passes of the update over each step's batch")
    ctx.str(f"{P}.model_name", "model")
    ctx.int(f"{P}.max_total_sequence_length", "sequence_tokens_max")
    ctx.int("data.max_input_seq_length", "prompt_tokens_max")
    ctx.int(f"{G}.max_new_tokens", "response_tokens_max")
    ctx.int(f"{P}.train_global_batch_size", "train_mini_batch_sequences")
    ctx.int(f"{P}.train_micro_batch_size", "micro_batch_sequences_per_gpu")
    lp = ctx.int(f"{P}.logprob_batch_size", "logprob_micro_batch_sequences_per_gpu")
    ctx.set("ref_micro_batch_sequences_per_gpu", lp, f"{P}.logprob_batch_size")
    _packing(ctx)
    _generation(ctx)
    _trainer(ctx)
    kl = ctx.float("loss_fn.reference_policy_kl_penalty", "kl", note="reference logits each step when above 0")
    ctx.set("reference", None if kl is None else kl > 0, "loss_fn.reference_policy_kl_penalty")
    if ctx.bool(f"{a}.skip_reference_policy_logprobs_calculation", note="no reference pass"):
        ctx.set("reference", False, f"{a}.skip_reference_policy_logprobs_calculation")
    if a == "ppo":
        _value(ctx)
    else:
        ctx.set("critic", False if ctx.has("grpo") else None)
    _reward(ctx)
    _cluster(ctx, a)


def _reward(ctx: Ctx) -> None:
    """The math environment (``env.math``) scores every response with math-verify on ``num_workers`` processes
    after the engines finish, inside NeMo-RL's generation timer; dapo_math_verify is a string match (not priced)."""
    if not isinstance(ctx.raw("env.math"), dict):
        return
    impl = ctx.str("env.math.math_verify_impl", note="how the math environment scores responses") or "hf_math_verify"
    if impl == "hf_math_verify":
        ctx.int("env.math.num_workers", "reward_workers", note="processes scoring the responses")
        ctx.set("reward_scorer", "math_verify", "env.math.num_workers")


def _value(ctx: Ctx) -> None:
    """PPO's value model (``value:``): a critic, its micro-batches in sequences or a token budget."""
    ctx.set("critic", True)
    if not ctx.has("value"):
        return
    ctx.str("value.model_name", "critic_model")
    ctx.int("value.train_micro_batch_size", "critic_micro_batch_sequences_per_gpu")
    for sec in ("sequence_packing", "dynamic_batching"):
        if ctx.bool(f"value.{sec}.enabled", note="critic micro-batches filled up to a token budget"):
            ctx.int(f"value.{sec}.train_mb_tokens", "critic_token_budget_per_gpu")


def _packing(ctx: Ctx) -> None:
    """Sequence packing (no padding, micro-batches up to ``train_mb_tokens``) or dynamic batching
    (padded, same budget); NeMo-RL allows one of the two."""
    pack = ctx.bool(f"{P}.sequence_packing.enabled", note="sequences packed without padding")
    dyn = ctx.bool(f"{P}.dynamic_batching.enabled", note="micro-batches filled up to a token budget")
    if pack and dyn:
        raise UserError(f"{ctx.src}: policy.sequence_packing.enabled and policy.dynamic_batching.enabled are "
                        "both true; NeMo-RL takes one of them, set the other to false")
    for sec, on in (("sequence_packing", pack), ("dynamic_batching", dyn)):
        key = f"{P}.{sec}"
        if on:
            ctx.int(f"{key}.train_mb_tokens", "token_budget_per_gpu")
            lp = ctx.int(f"{key}.logprob_mb_tokens", "logprob_token_budget_per_gpu")
            ctx.set("ref_token_budget_per_gpu", lp, f"{key}.logprob_mb_tokens")
        elif on is False and ctx.has(key):
            for k in ("train_mb_tokens", "logprob_mb_tokens", "sequence_length_round", "algorithm"):
                ctx.ignore(f"{key}.{k}", f"unused: {key}.enabled is false")
    if pack is not None or dyn is not None:
        key = f"{P}.sequence_packing.enabled" if pack is not None else f"{P}.dynamic_batching.enabled"
        ctx.set("remove_padding", bool(pack), key)
        ctx.set("dynamic_batch", bool(pack or dyn), key)


# The generation section's engine blocks, by backend (Dynamo serves one of the others).
ENGINE_SECTIONS = {"vllm": ("vllm_cfg",), "sglang": ("sglang_cfg",), "trtllm": ("trtllm_cfg", "trtllm_kwargs"),
                   "dynamo": ("dynamo_cfg",)}


def _generation(ctx: Ctx) -> None:
    backend = ctx.str(f"{G}.backend", "rollout_engine") or "vllm"
    engine = backend
    if backend == "dynamo":
        engine = ctx.str(f"{G}.dynamo_cfg.engine", note="the engine Dynamo serves") or "vllm"
        ctx.ignore(f"{G}.dynamo_cfg", "Dynamo's serving layer (timeouts, parsers, router, frontend): not modelled")
    used = {*ENGINE_SECTIONS.get(backend, ()), *ENGINE_SECTIONS.get(engine, ())}
    for sec in sorted({s for secs in ENGINE_SECTIONS.values() for s in secs} - used):
        if ctx.has(f"{G}.{sec}"):
            ctx.ignore(f"{G}.{sec}", f"unused: generation backend is {backend}")
    ctx.bool(f"{G}.use_async_rollouts", "rollout_async_engine")
    if engine == "sglang":
        S = f"{G}.sglang_cfg"
        ctx.int(f"{S}.tp_size", "rollout_tp")
        ctx.float(f"{S}.mem_fraction_static", "gpu_memory_utilization", lo=0.01, hi=1.0)
        ctx.int(f"{S}.max_running_requests", "max_num_seqs")
        if ctx.has(S):
            ctx.ignore(S, "SGLang details (parallel sizes besides TP, seeds, server options): not modelled")
        return
    if engine == "trtllm":
        T = f"{G}.trtllm_cfg"
        ctx.int(f"{T}.tensor_parallel_size", "rollout_tp")
        ctx.float(f"{T}.gpu_memory_utilization", "gpu_memory_utilization", lo=0.01, hi=1.0)
        ctx.int(f"{T}.max_batch_size", "max_num_seqs")
        ctx.int(f"{T}.max_num_tokens", "max_num_batched_tokens")
        ctx.bool(f"{T}.async_engine", "rollout_async_engine")
        prec = ctx.str(f"{T}.precision", note="engine weights and activations")
        ctx.set("rollout_dtype", DTYPES.get(prec or "", prec), f"{T}.precision")
        for sec in (T, f"{G}.trtllm_kwargs"):
            if ctx.has(sec):
                ctx.ignore(sec, "TensorRT-LLM details (MoE parallel sizes, context, batching waits, in-flight "
                                "updates): not modelled")
        return
    if engine != "vllm":
        return
    ctx.int(f"{V}.tensor_parallel_size", "rollout_tp")
    ctx.float(f"{V}.gpu_memory_utilization", "gpu_memory_utilization", lo=0.01, hi=1.0)
    ctx.bool(f"{V}.enforce_eager", "enforce_eager")
    ctx.bool(f"{V}.async_engine", "rollout_async_engine")
    _detokenize(ctx)
    prec = ctx.str(f"{V}.precision", note="engine weights and activations")
    ctx.set("rollout_dtype", DTYPES.get(prec or "", prec), f"{V}.precision")
    for k in ("max_num_seqs", "max_num_batched_tokens"):
        ctx.int(f"{G}.vllm_kwargs.{k}", k)
        if k not in ctx.fields:
            ctx.int(f"{V}.{k}", k)


def _detokenize(ctx: Ctx) -> None:
    """Whether the vLLM engine has a tokenizer, so that it turns each sampled token (and its log-prob) into text:
    NeMo-RL's configure_generation_config (nemo_rl/models/generation/__init__.py, v0.3.1 and v0.5.0 on) sets
    skip_tokenizer_init true unless stop strings need the text or the config sets it; v0.4.0's worker forced it
    false (vLLM 0.10.0 broke it)."""
    skip = ctx.bool(f"{V}.skip_tokenizer_init", note="no tokenizer in the engine: outputs stay token ids")
    if skip is None:
        stops = ctx.raw(f"{G}.stop_strings") if ctx.stated(f"{G}.stop_strings") else None
        skip = not stops
        if ctx.has(f"{G}.stop_strings"):
            ctx.note(f"{G}.stop_strings", stops, "no stop strings: NeMo-RL starts the engine without a tokenizer "
                     "(skip_tokenizer_init)" if skip else "stop strings: the engine keeps its tokenizer")
    ctx.set("rollout_detokenize", not skip)


def _trainer(ctx: Ctx) -> None:
    meg = ctx.bool(f"{MG}.enabled", note="Megatron-core trains the policy")
    dt = ctx.bool(f"{DT}.enabled", note="DTensor (FSDP2) trains the policy")
    if meg and dt:
        raise UserError(f"{ctx.src}: policy.megatron_cfg.enabled and policy.dtensor_cfg.enabled are both true; "
                        "NeMo-RL trains with one of them, set the other to false")
    prec = ctx.str(f"{P}.precision", note="training precision")
    ctx.set("train_dtype", DTYPES.get(prec or "", prec), f"{P}.precision")
    old_keys = (f"{P}.fsdp_offload_enabled", f"{P}.activation_checkpointing_enabled")  # before dtensor_cfg (v0.3)
    if meg:
        if ctx.has(DT):
            ctx.ignore(DT, "unused: the policy trains with Megatron")
        for key in filter(ctx.has, old_keys):
            ctx.ignore(key, "a key of the FSDP path of NeMo-RL v0.3 and before: unused when Megatron trains")
        ctx.set("train_strategy", "megatron", f"{MG}.enabled")
        ctx.int(f"{MG}.tensor_model_parallel_size", "train_tp")
        ctx.int(f"{MG}.pipeline_model_parallel_size", "train_pp")
        ctx.int(f"{MG}.expert_model_parallel_size", "train_ep")
        ctx.int(f"{MG}.context_parallel_size", "sequence_parallel")
        ac = ctx.bool(f"{MG}.activation_checkpointing", note="NeMo-RL recomputes every layer (full)")
        ctx.set("activation_checkpointing", None if ac is None else ("full" if ac else "none"),
                f"{MG}.activation_checkpointing")
        cpu = ctx.bool(f"{MG}.optimizer.optimizer_cpu_offload", "optimizer_on_cpu")
        ctx.set("optimizer_offload", cpu, f"{MG}.optimizer.optimizer_cpu_offload")
        fp8 = ctx.bool(f"{MG}.fp8_cfg.enabled", note="FP8 training")
        if ctx.raw(f"{MG}.fp8_cfg") is None and ctx.has(f"{MG}.fp8_cfg"):
            ctx.note(f"{MG}.fp8_cfg", None, "null: no FP8 training")
        if fp8:
            ctx.set("train_dtype", "fp8", f"{MG}.fp8_cfg.enabled")
        lora = ctx.bool(f"{MG}.peft.enabled", note="LoRA adapters")
        if lora:
            ctx.int(f"{MG}.peft.dim", "lora_rank")
        elif lora is False:
            ctx.set("lora_rank", 0, f"{MG}.peft.enabled")
        return
    if meg is False and ctx.has(MG):
        ctx.ignore(MG, "unused: policy.megatron_cfg.enabled is false")
    ctx.set("train_strategy", "fsdp2" if dt else ("fsdp" if dt is False else None), f"{DT}.enabled")
    ctx.int(f"{DT}.tensor_parallel_size", "train_tp")
    ctx.int(f"{DT}.context_parallel_size", "sequence_parallel")
    ac = ctx.bool(f"{DT}.activation_checkpointing", note="activation checkpointing of every layer")
    ctx.set("activation_checkpointing", None if ac is None else ("full" if ac else "none"),
            f"{DT}.activation_checkpointing")
    off = ctx.bool(f"{DT}.cpu_offload", note="parameters and optimizer state on the CPU between phases")
    ctx.set("param_offload", off, f"{DT}.cpu_offload")
    ctx.set("optimizer_offload", off, f"{DT}.cpu_offload")
    off = ctx.bool(old_keys[0], note="v0.3: parameters and optimizer state on the CPU between phases")
    if off is not None:
        ctx.set("param_offload", off, old_keys[0])
        ctx.set("optimizer_offload", off, old_keys[0])
    ac = ctx.bool(old_keys[1], note="v0.3: activation checkpointing of every layer")
    if ac is not None:
        ctx.set("activation_checkpointing", "full" if ac else "none", old_keys[1])
    lora = ctx.bool(f"{DT}.lora_cfg.enabled", note="LoRA adapters")
    if lora:
        ctx.int(f"{DT}.lora_cfg.dim", "lora_rank")
    elif lora is False:
        ctx.set("lora_rank", 0, f"{DT}.lora_cfg.enabled")


def _cluster(ctx: Ctx, a: str = "grpo") -> None:
    gpn = ctx.int("cluster.gpus_per_node", "gpus_per_node")
    nn = ctx.int("cluster.num_nodes", "nodes")
    if gpn is not None and nn is not None:
        ctx.set("gpus", gpn * nn, "cluster.num_nodes")
    col = ctx.bool(f"{G}.colocated.enabled", note="true: generation shares the training GPUs")
    res = f"{G}.colocated.resources"
    if col is None:
        return
    if col:
        ctx.set("placement", "colocated", f"{G}.colocated.enabled")
        ctx.set("off_policy_steps", 0, f"{G}.colocated.enabled")
        if ctx.has(res):
            ctx.ignore(res, "unused: generation is colocated")
    else:
        rg: Optional[int] = ctx.int(f"{res}.gpus_per_node", note="GPUs per node that only generate")
        rn = ctx.int(f"{res}.num_nodes", note="nodes that only generate")
        if rn is not None:
            ctx.set("rollout_gpus", rn * (rg or gpn or 0) or None, f"{res}.num_nodes")
        elif rg is not None:  # a one-node cluster: GPUs of that node
            ctx.set("rollout_gpus", rg, f"{res}.gpus_per_node")
    sec = f"{a}.async_{a}"
    if ctx.has(sec) and ctx.raw(sec) is None:
        ctx.note(sec, None, "null: no asynchronous training")
    asy = ctx.bool(f"{sec}.enabled", note="generation runs ahead of training")
    age_key = f"{sec}.max_trajectory_age_steps"
    if asy:
        age = ctx.int(age_key, note="steps a trajectory may lag the policy")
        ctx.set("off_policy_steps", age, age_key)
        if not col:
            ctx.set("placement", "one-step-off", f"{sec}.enabled")
        return
    if ctx.has(age_key):
        ctx.ignore(age_key, f"unused: async {a.upper()} is off")
    if not col:
        ctx.set("placement", "split", f"{G}.colocated.enabled")
        ctx.set("off_policy_steps", 0, f"{G}.colocated.enabled")
