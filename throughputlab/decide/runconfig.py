"""`decide --config`: an RL run's own launch config (throughputlab.rlconfig) as decide's settings.

Every knob the step-time model takes becomes the setting it is (prompts per step, group, lengths,
mini- and micro-batches, epochs, critic, reference, checkpointing, the engines' TP, memory share,
caps and eager mode, GPUs, nodes, placement); what the model cannot express is named in
``not_modelled`` with what is predicted instead, never silently. The spec file and the flags are
laid over the result, so a flag still overrides the config.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from throughputlab import roofline as rf
from throughputlab.decide.lengths import CAPPED_SIGMA
from throughputlab.predict_engine import ENGINES
from throughputlab.rlconfig import RunConfig
from throughputlab.rlconfig.timers import timer_lines
from throughputlab.roofline import rl as rf_rl

CANDIDATE_FACTORS = (1, 2, 4)  # the run's batch and two larger ones, unless --prompts says otherwise
RESPONSE_SIGMA = CAPPED_SIGMA  # the lengths' spread below the cap (decide.lengths)


def decide_data(rc: RunConfig) -> tuple[dict[str, Any], list[str], list[str]]:
    """(decide spec data, lines saying what each knob became, lines naming what is not modelled)."""
    data: dict[str, Any] = {}
    used: list[str] = []

    def put(path: str, value: Any, what: str) -> None:
        if value is None:
            return
        d = data
        *parents, last = path.split(".")
        for p in parents:
            d = d.setdefault(p, {})
        d[last] = value
        used.append(f"{path} = {value}: {what}")

    p = rc.prompts_per_step
    if p:
        put("prompts", [p * k for k in CANDIDATE_FACTORS], "the run's prompts per step and 2x, 4x (give --prompts "
            "for others)")
        put("baseline", p, "the run's prompts per step")
    put("group", rc.responses_per_prompt, "responses per prompt")
    prompt, cap, why = lengths(rc)
    put("shape.prompt_len", prompt, why)
    if cap:
        put("shape.response.dist", f"lognormal:mean={max(cap // 2, 1)},sigma={RESPONSE_SIGMA},max={cap}",
            "the response cap" + (f" (the sequence cap {rc.sequence_tokens_max} less the prompt)"
                                  if rc.sequence_tokens_max and cap < (rc.response_tokens_max or cap + 1) else "")
            + "; the config holds no lengths, so a mean of half the cap is assumed (--response-dist "
            "with the run's mean and clip ratio, or --against its log)")
    put("shape.algo", "ppo" if rc.critic else "grpo" if rc.critic is not None else None, "a critic or not")
    put("shape.train.epochs", rc.epochs, "epochs over each batch")
    put("shape.train.mini_batch_samples", rc.train_mini_batch_sequences, "sequences per optimizer step")
    if not rc.dynamic_batch:
        put("shape.train.micro_batch", rc.micro_batch_sequences_per_gpu, "sequences per micro-batch per GPU")
        put("shape.train.logprob_micro_batch", rc.logprob_micro_batch_sequences_per_gpu,
            "sequences per log-prob micro-batch per GPU")
    else:
        put("shape.train.token_budget", rc.token_budget_per_gpu, "tokens per GPU per update micro-batch (micro-batches "
            "filled up to it)")
        put("shape.train.logprob_token_budget", rc.logprob_token_budget_per_gpu,
            "tokens per GPU per log-prob micro-batch")
    if rc.critic and rc.framework == "verl" and rc.critic_remove_padding is not None \
            and rc.critic_remove_padding != rc.remove_padding:
        cpad = padded_seq_len(rc.model_copy(update={"remove_padding": rc.critic_remove_padding}))
        put("shape.critic.padded_seq_len", cpad or 0, "critic remove_padding " + ("on: its passes packed" if not cpad
            else "off: every critic pass at prompt cap + response cap tokens"))
    if rc.critic and rc.critic_token_budget_per_gpu:
        put("shape.critic.token_budget", rc.critic_token_budget_per_gpu, "tokens per GPU per critic micro-batch")
    elif rc.critic:
        put("shape.critic.micro_batch", rc.critic_micro_batch_sequences_per_gpu, "sequences per critic micro-batch "
            "per GPU")
    if rc.train_strategy == "megatron":
        put("shape.train.backend", "megatron", "Megatron-core trains the policy: weights resident, no FSDP all-gather")
        put("shape.train.tp", rc.train_tp, "Megatron tensor parallelism")
        put("shape.train.pp", rc.train_pp, "Megatron pipeline parallelism")
        put("shape.train.ep", rc.train_ep, "Megatron expert parallelism (two all-to-alls per MoE layer)")
    if (rc.sequence_parallel or 1) > 1 and rc.train_strategy == "megatron":
        put("shape.train.sequence_parallel", rc.sequence_parallel, "Megatron context parallelism: each sequence's "
            "tokens split over that many GPUs of a replica, keys and values passed round the ring every layer")
    elif (rc.sequence_parallel or 1) > 1:
        put("shape.train.sequence_parallel", rc.sequence_parallel, "sequence parallelism: each sequence split over "
            "that many GPUs, all-to-alls around attention (Ulysses; " + ("veRL's" if rc.framework == "verl" else
            "ring attention and context parallelism priced as Ulysses's all-to-alls, an approximation") + ")")
    padded = padded_seq_len(rc)
    put("shape.train.padded_seq_len", padded, "remove_padding off: every sequence of a training or log-prob pass "
        "padded to prompt cap + response cap")
    put("shape.train.old_logprob", rc.old_logprob, "the old policy's log-prob pass")
    put("shape.train.ref_logprob", rc.reference, "the reference model's pass")
    if rc.activation_checkpointing is not None:
        put("shape.train.activation_checkpointing", rc.activation_checkpointing != "none",
            f"activation checkpointing {rc.activation_checkpointing}")
    offload_knobs(rc, put)
    if rc.reward_scorer == "math_verify":
        put("shape.reward.per_response_s", rf_rl.MATH_VERIFY_S, "math-verify scores each response on the host after "
            "the rollout (roofline.rl.MATH_VERIFY_S)")
        put("shape.reward.workers", rc.reward_workers, "processes scoring the responses")
    put("shape.engine.max_num_seqs", rc.max_num_seqs, "the engines' sequence cap")
    put("shape.engine.max_num_batched_tokens", rc.max_num_batched_tokens, "the engines' token budget per step")
    put("shape.engine.enforce_eager", rc.enforce_eager, "engines without CUDA graphs")
    put("shape.engine.in_process_logprobs", *in_process_logprobs(rc))
    put("shape.engine.name", rc.rollout_engine if rc.rollout_engine in ENGINES else None,
        "the rollout engine: a predicted profile's engine becomes it (its KV rule, its scheduling of prefill)")
    if rc.framework in ("nemo-rl", "openrlhf") and rc.rollout_engine in (None, "vllm") and (rc.rollout_tp or 1) > 1:
        who = "NeMo-RL" if rc.framework == "nemo-rl" else "OpenRLHF"
        put("shape.engine.distributed_executor_backend", "ray", f"{who} runs an engine of several GPUs on Ray's "
            "executor: no async scheduling before vLLM 0.21 "
            "(roofline.engine.RAY_ASYNC_SCHEDULING_VERSION)")
    trl_server = rc.framework == "trl" and rc.placement == "split" and not rc.rollout_gpus
    put("cluster.gpus", None if trl_server else rc.gpus, "GPUs in all")
    put("cluster.nodes", rc.nodes, "nodes")
    put("cluster.engine_tp", rc.rollout_tp, "GPUs per generation engine")
    put("cluster.gpu_memory_utilization", rc.gpu_memory_utilization, "the engines' memory share")
    if rc.placement == "colocated":
        put("cluster.placement", "colocated", "generation and training take turns on every GPU")
    elif rc.placement in ("one-step-off", "split"):
        put("cluster.placement", "split", "generation on its own GPUs")
        put("cluster.gen_gpus", rc.rollout_gpus, "GPUs that generate")
        if rc.framework == "nemo-rl":
            put("shape.sync.pipelined", True, "NeMo-RL broadcasts the weights in packed buckets from two buffers on "
                "their own CUDA streams (nemo_rl/utils/packed_tensor.py, NRL_REFIT_NUM_BUFFERS=2 from v0.4.0): the "
                "next bucket's gather overlaps this one's broadcast")
        if rc.placement == "split":
            put("shape.overlap", "separate", "training waits for generation (no step off-policy)")
        if rc.off_policy_steps and rc.off_policy_steps > 1:
            put("shape.off_policy_steps", rc.off_policy_steps, "steps generation may run ahead of training: that many "
                "steps' samples drain through the engines as one queue, a step charged its share")
        if rc.streaming and rc.staleness_share:
            put("shape.partial_rollout", min(rc.staleness_share, 1.0), "veRL's partial rollouts: staleness_threshold more "
                "samples in flight; responses cut at a weight sync resume after it (steady state)")
    return data, used, _not_modelled(rc)


# A config gives caps, not lengths. Published RL runs' mean prompts sat far below their prompt caps: 0.09-0.20 of
# them in the eight veRL logs of benchmarks/data/rl_runs (83-104 tokens under caps of 512 and 1,024; GSM8K and
# MATH), 101-178 tokens derived for NeMo-RL's (sequence caps of 1,536-8,192); a cap is set for the longest prompt
# of a dataset. A quarter of the cap leans long for those, and leaves room for datasets of longer prompts (tool
# descriptions, code, documents).
PROMPT_SHARE_OF_CAP = 0.25


def lengths(rc: RunConfig) -> tuple[Optional[int], Optional[int], str]:
    """(prompt tokens, response cap, what the prompt is) from the caps: a quarter of the prompt cap
    (PROMPT_SHARE_OF_CAP). Where a sequence cap bounds prompt plus response (NeMo-RL's max_total_sequence_length,
    OpenRLHF's --max_len), the response cap is what it leaves after that prompt; a prompt cap as large as the
    sequence cap says nothing of the prompt, so the prompt is decide's default (512) or a quarter of the
    sequence cap if that is less."""
    from throughputlab.decide.shape import RLShape

    total, prompt_cap, cap = rc.sequence_tokens_max, rc.prompt_tokens_max, rc.response_tokens_max
    prompt = _share(prompt_cap)
    why = (f"a quarter of the prompt cap {prompt_cap} (published RL runs' mean prompts were 0.09-0.20 of their "
           "caps; --prompt-len gives yours)")
    if total and (not prompt_cap or prompt_cap >= total):
        prompt = min(RLShape.model_fields["prompt_len"].default, _share(total))
        why = (f"not in the config (its prompt cap is the sequence cap {total}): decide's default 512 or a quarter "
               "of the cap, whichever is less (--prompt-len)")
    if total and prompt and total > prompt:
        cap = min(cap or total, total - prompt)
    return prompt, cap, why


def _share(cap: Optional[int]) -> Optional[int]:
    return max(int(cap * PROMPT_SHARE_OF_CAP), 1) if cap else None


def offload_knobs(rc, put) -> None:
    """Training state to host memory and back between phases, in copies per step of each GPU's shard:
    NeMo-RL's colocated step always moves the policy out for generation (offload_after_refit), back for the
    log-probs, swaps the reference in from host memory (three copies, with a reference model), and takes its
    fp32 gradients and optimizer out and back (nemo_rl/algorithms/grpo.py, megatron_policy_worker.py, v0.5.0);
    veRL's param_offload reloads and offloads the parameters around the log-prob pass and the update (4),
    optimizer_offload the optimizer around the update (2)."""
    if rc.framework == "nemo-rl" and rc.placement == "colocated":
        ref = rc.reference is not False
        put("shape.train.offload_param_copies", 5 if ref else 2, "NeMo-RL colocated: the policy offloaded for "
            "generation and reloaded" + (", the reference swapped in from host memory and out" if ref else ""))
        put("shape.train.offload_grad_copies", 2, "NeMo-RL colocated: fp32 gradients offloaded and reloaded")
        put("shape.train.offload_optimizer_copies", 2, "NeMo-RL colocated: the optimizer offloaded and reloaded")
        return
    if rc.states_sleep and not rc.param_offload:
        put("shape.train.offload_param_copies", 2, "--deepspeed_enable_sleep: the policy's parameters offloaded while "
            "the engines generate and reloaded (the reference's and critic's too, not priced)")
        put("shape.train.offload_optimizer_copies", 2, "--deepspeed_enable_sleep: the optimizer state likewise")
    if rc.param_offload:
        put("shape.train.offload_param_copies", 4, "param_offload: reloaded and offloaded around the log-prob "
            "pass and the update")
    if rc.optimizer_offload or rc.optimizer_on_cpu:
        put("shape.train.offload_optimizer_copies", 2, "optimizer_offload: reloaded and offloaded around the "
            "update")


def in_process_logprobs(rc: RunConfig) -> tuple[Optional[str], str]:
    """How the framework's synchronous vLLM rollout returns each sampled token's log-prob in its own process
    (roofline.engine.LOGPROBS_HOST_RATIO), and why; None where the engine serves requests as they come (its own
    process) or the framework is not one whose rollout code says."""
    if rc.rollout_engine not in (None, "vllm") or rc.rollout_async_engine:
        return None, ""
    if rc.framework == "nemo-rl":  # nemo_rl/models/generation/vllm/vllm_worker.py (v0.3-v0.7)
        if rc.rollout_detokenize:
            return "text", ("NeMo-RL's synchronous vLLM engine runs in its worker's process "
                            "(VLLM_ENABLE_V1_MULTIPROCESSING=0) and returns each token's log-prob with the text "
                            "(logprobs=0; its tokenizer kept for stop strings or skip_tokenizer_init: false; v0.4.0 "
                            "always)")
        return "ids", ("NeMo-RL's synchronous vLLM engine runs in its worker's process "
                       "(VLLM_ENABLE_V1_MULTIPROCESSING=0) and returns each token's log-prob without the text "
                       "(logprobs=0, skip_tokenizer_init: no stop strings; v0.4.0 kept the tokenizer: "
                       "--set shape.engine.in_process_logprobs=text)")
    if rc.framework == "verl":  # verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py
        return "ids", ("veRL's synchronous rollout runs vLLM in its worker's process (external_launcher) and returns "
                       "each token's log-prob without the text (logprobs=0, detokenize=False)")
    if rc.framework == "trl" and rc.rollout_engine == "vllm" and rc.placement == "colocated":
        return "text", ("TRL's colocated vLLM runs in each training process (external_launcher) and returns each "
                        "token's log-prob with the text (trl/generation/vllm_generation.py: logprobs=0)")
    return None, ""


def padded_seq_len(rc: RunConfig) -> Optional[int]:
    """veRL without remove-padding pads every sequence to prompt cap + response cap
    (:func:`roofline.padded_length`); None where sequences are packed or the caps are not stated."""
    if rc.framework != "verl" or rc.remove_padding is not False:
        return None
    if not rc.prompt_tokens_max or not rc.response_tokens_max:
        return None
    return rf.padded_length(rc.prompt_tokens_max, rc.response_tokens_max)


def _not_modelled(rc: RunConfig) -> list[str]:
    """Knobs that change the step but that the model cannot express, with what is predicted instead."""
    out = []
    if rc.remove_padding is False and padded_seq_len(rc) is None:
        out.append("remove_padding off: this framework pads each micro-batch to its longest sequence; predicted as "
                   "packed sequences, so training is optimistic")
    if rc.dynamic_batch and not rc.token_budget_per_gpu:
        out.append("token-budget micro-batches without a stated budget: predicted as the largest micro-batch that "
                   "fits the longest sequence")
    if rc.framework == "nemo-rl" and rc.param_offload and rc.train_strategy != "megatron":
        out.append("dtensor cpu_offload: FSDP2 streams the parameters from host memory into every forward and "
                   "backward; priced as copies between phases only, so training is optimistic")
    if rc.framework == "trl" and rc.placement == "split" and not rc.rollout_gpus:
        out.append(f"vllm_mode server: num_processes ({rc.gpus}) are the trainer's GPUs and the server's are not in "
                   "the config; the profile's GPUs are used: give --gpus (trainer plus server) and --gen-gpus")
    if rc.optimizer_on_cpu:
        out.append("the optimizer step on the CPU: its time is not modelled (only the state's copies over the "
                   "host link)")
    if rc.train_strategy != "megatron" and (rc.train_tp or 1) > 1:
        out.append(f"tensor parallelism {rc.train_tp} under FSDP: predicted as FSDP alone over the same GPUs")
    if rc.lora_rank:
        out.append(f"LoRA rank {rc.lora_rank}: predicted as full fine-tuning")
    if rc.multi_turn:
        out.append("multi-turn rollouts (tool calls between turns): predicted as one turn")
    if rc.reward_model:
        out.append("a reward model's forward pass: not modelled")
    if rc.streaming and not rc.staleness_share:
        out.append("partial rollouts with staleness_threshold 0 or unstated: veRL resumes nothing then (the "
                   "recipe's README); predicted as one step off-policy")
    return out


def describe(rc: RunConfig, used: list[str], missing: list[str]) -> list[str]:
    """What `decide` prints about the config: the knobs it read, those it ignored and why, and the
    ones it cannot model."""
    version = f" {rc.framework_version}" if rc.framework_version else ""
    lines = [f"config: {rc.source} ({rc.framework}{version}): {len(rc.read)} knobs read, {len(rc.ignored)} ignored"]
    lines += [f"  read: {k}" for k in used]
    if rc.read:
        lines.append("  keys read: " + ", ".join(f"{k.key}={_short(k.value)}" + (" (default)" if "not set" in k.note
                                                                                  else "") for k in rc.read))
    lines += [f"  not modelled: {m}" for m in missing]
    by_reason: dict[str, list[str]] = {}
    for k in rc.ignored:
        by_reason.setdefault(k.note, []).append(k.key)
    for note, keys in by_reason.items():
        shown = ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
        lines.append(f"  ignored ({note}): {shown}")
    return lines + timer_lines(rc.framework, rc.placement)


def drop_placement(data: dict, record: dict) -> None:
    """Remove the config's placement and the knobs that go with it (``--placement`` on the command line
    replaces them), NeMo-RL's colocated offload copies among them."""
    cluster, shape = data.get("cluster", {}), data.get("shape", {})
    for key in ("placement", "gen_gpus"):
        cluster.pop(key, None)
    for key in ("overlap", "off_policy_steps", "partial_rollout"):
        shape.pop(key, None)
    if record.get("framework") == "nemo-rl" and record.get("placement") == "colocated":
        for key in ("offload_param_copies", "offload_grad_copies", "offload_optimizer_copies"):
            shape.get("train", {}).pop(key, None)


def lengths_from_logs(data: dict, option: str) -> Optional[str]:
    """A run log beside the config: the config holds no response lengths (the half-cap mean is an assumption),
    so drop it and let the log's lengths stand; the line saying so, or None where there was none."""
    shape = data.get("shape", {})
    if "dist" not in shape.get("response", {}):
        return None
    shape.pop("response")
    return (f"  {option} LOG: response lengths from the log (its mean, longest and clip ratio), not the half-cap "
            "mean assumed above")


def regroup(data: dict, group: int) -> Optional[str]:
    """veRL counts ppo_mini_batch_size in prompts: with --group G over the config's n, the mini-batch in sequences
    follows G (the line saying so), where the config gave both."""
    old, train = data.get("group"), data.get("shape", {}).get("train", {})
    mini = train.get("mini_batch_samples")
    if not old or not mini or mini % old or group == old:
        return None
    train["mini_batch_samples"] = mini // old * group
    return (f"  ppo_mini_batch_size counts prompts (veRL): {mini // old} prompts x --group {group} = "
            f"{mini // old * group} sequences per optimizer step")


def overridden_lines(data: dict, flags: dict[str, tuple[str, Any]]) -> list[str]:
    """One line per flag that replaces a setting the config gave: ``{flag: (settings key, value)}``."""
    out = []
    for flag, (key, value) in flags.items():
        node: Any = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None and node != value:
            shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
            out.append(f"  {flag} {shown} overrides the config's {key} = {node}")
    return out


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _size(name: str) -> Optional[str]:
    """The parameter count a model name states (``Llama-3.1-8B-Instruct`` -> ``8b``), if any."""
    for token in re.split(r"[^a-z0-9.]+", name.lower()):
        if re.fullmatch(r"\d+(\.\d+)?b", token):
            return token
    return None


FAMILIES = ("llama", "qwen", "deepseek", "mixtral", "mistral", "gemma", "phi", "glm", "gpt", "olmo", "kimi")


def _family(name: str) -> Optional[str]:
    low = name.lower()
    return next((f for f in FAMILIES if f in low), None)


def model_mismatch(config_model: Optional[str], profile_model: str) -> Optional[str]:
    """A warning where the config's policy and the profile's model name different families or sizes (the
    profile's is the one predicted)."""
    if not config_model:
        return None
    mine, theirs = config_model.rstrip("/").rsplit("/", 1)[-1], profile_model.rstrip("/").rsplit("/", 1)[-1]
    fa, fb = _family(mine), _family(theirs)
    a, b = _size(mine), _size(theirs)
    if fa and fb and fa != fb:
        what = f"{fa} against {fb}"
    elif a and b and float(a[:-1]) != float(b[:-1]):
        what = f"{a.upper()} against {b.upper()}"
    else:
        return None
    return (f"the config trains {config_model} but the profile is of {profile_model} ({what}): every time here is "
            "the profile's model; measure or predict a profile of the config's model")


def read(path: str, overrides: tuple[str, ...] = (),
         framework: Optional[str] = None) -> tuple[dict, list[str], dict]:
    """The spec data of ``--config``, the lines to print, and what `--json` records of the config: its
    file, framework, policy model, the keys read (with what each set), ignored (with why) and the
    settings they became, and what cannot be modelled."""
    from throughputlab.rlconfig import read_run_config

    rc = read_run_config(path, overrides, framework=framework, source=f"--config {path}")
    data, used, missing = decide_data(rc)
    record = {"file": path, "framework": rc.framework, "framework_version": rc.framework_version, "model": rc.model,
              "placement": rc.placement,
              "settings": used, "not_modelled": missing,
              "read": [k.model_dump(mode="json") for k in rc.read],
              "ignored": [k.model_dump(mode="json") for k in rc.ignored],
              "timers": [line.strip() for line in timer_lines(rc.framework, rc.placement)]}
    return data, describe(rc, used, missing), record


# The run-config fields behind each of decide's words, for naming the config keys a refusal rests on.
_FIELDS_OF = {"--gpus": ("gpus", "gpus_per_node", "rollout_gpus"), "--nodes": ("nodes", "gpus_per_node"),
              "--engine-tp": ("rollout_tp",), "--gpu-memory-utilization": ("gpu_memory_utilization",),
              "--max-num-seqs": ("max_num_seqs",), "--max-num-batched-tokens": ("max_num_batched_tokens",),
              "--sequence-parallel": ("sequence_parallel",), "sequence_parallel": ("sequence_parallel",),
              "--train-tp": ("train_tp",), "--train-pp": ("train_pp",), "--train-ep": ("train_ep",),
              "micro_batch": ("micro_batch_sequences_per_gpu", "logprob_micro_batch_sequences_per_gpu"),
              "--placement": ("placement", "rollout_gpus"), "--gen-gpus": ("rollout_gpus",)}


def config_keys_behind(message: str, record: dict, given: set[str]) -> list[str]:
    """The config's ``key=value`` pairs that set what a refusal names (its flags and settings), leaving out
    those a flag of the command line replaced (``given``: the flags given)."""
    fields = {f for word, fs in _FIELDS_OF.items() if word in message and word not in given for f in fs}
    out = []
    for k in record.get("read", []):
        set_here = set(re.findall(r"(?:^|; )(\w+) = ", k["note"]))
        if set_here & fields:
            out.append(f"{k['key']}={_short(k['value'])}")
    return out
