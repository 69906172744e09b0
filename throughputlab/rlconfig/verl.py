"""veRL: the Hydra config of ``verl.trainer.main_ppo`` (and its one-step-off and fully-async recipes)
read into a ``RunConfig``.

The config is the resolved one veRL prints at start-up, a ``ppo_trainer.yaml``-style file (its
Hydra defaults list composed by ``rlconfig.hydra``), the overrides of a launch script, or any of
these with ``a.b.c=value`` overrides on top. A key the file does not set is veRL's default and is
left ``None``. veRL counts ``ppo_mini_batch_size`` in prompts (it multiplies by ``rollout.n``) and
its ``*_per_gpu`` micro-batches in sequences; ``use_dynamic_bsz`` replaces the micro-batch by a
token budget per GPU, so only one of the two is read.
"""

from __future__ import annotations

from typing import Optional

from throughputlab.rlconfig.common import Ctx
from throughputlab.rlconfig.hydra import PACKAGED

A = "actor_rollout_ref.actor"
R = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"
M = "actor_rollout_ref.model"
DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16",
          "float32": "fp32", "fp32": "fp32", "float": "fp32", "fp8": "fp8"}
STRATEGIES = ("fsdp", "fsdp2", "megatron")


def looks_like(tree: dict) -> bool:
    if "actor_rollout_ref" in tree:
        return True
    defaults = tree.get("defaults")
    if isinstance(defaults, list) and any(d in PACKAGED for d in defaults if isinstance(d, str)):
        return True  # a recipe's Hydra config over veRL's own (recipe/dapo/config/dapo_trainer.yaml)
    trainer = tree.get("trainer")
    return isinstance(trainer, dict) and "data" in tree and bool({"n_gpus_per_node", "nnodes"} & set(trainer))


def read(ctx: Ctx) -> None:
    _cluster(ctx)
    _batch(ctx)
    _rollout(ctx)
    _actor(ctx)
    _kl_and_roles(ctx)
    _asynchronous(ctx)
    _framework_defaults(ctx)
    mini = ctx.raw(f"{A}.ppo_mini_batch_size")
    tbs = ctx.fields.get("prompts_per_step")
    if isinstance(mini, int) and not isinstance(mini, bool) and tbs and mini > tbs:
        raise ctx.fail(f"{A}.ppo_mini_batch_size", f"{mini} prompts per optimizer step is more than the {tbs} "
                       "prompts of a step (data.train_batch_size); veRL refuses it")


def _dp(ctx: Ctx, sp_key: str) -> Optional[int]:
    """Data-parallel ranks of the trainer (its GPUs over the sequence-parallel size at ``sp_key``):
    veRL divides a global micro-batch by these."""
    gpus = ctx.fields.get("gpus")
    if gpus is None:
        return None
    sp = ctx.raw(sp_key)
    sp = sp if isinstance(sp, int) and not isinstance(sp, bool) and sp > 0 else 1
    return max(1, (gpus - (ctx.fields.get("rollout_gpus") or 0)) // sp)


def _cluster(ctx: Ctx) -> None:
    gpn = ctx.int("trainer.n_gpus_per_node", note="GPUs per node of the trainer")
    nn = ctx.int("trainer.nnodes", note="nodes of the trainer")
    rgpn = ctx.int("rollout.n_gpus_per_node", note="GPUs per node that only generate")
    rnn = ctx.int("rollout.nnodes", note="nodes that only generate")
    hybrid = ctx.bool("actor_rollout_ref.hybrid_engine",
                      note="true: generation and training share the GPUs (colocated); false: separate GPUs")
    aa = ctx.raw("async_training")
    # recipe/partial_rollout (verl-project/verl-recipe): a synchronous trainer that sets only
    # async_training.partial_rollout and has no rollout pool of its own: colocated, not fully async
    sync_partial = (hybrid is not False and rgpn is None and rnn is None and isinstance(aa, dict) and bool(aa)
                    and set(aa) <= {"partial_rollout"})
    if sync_partial:
        ctx.ignore("async_training", "the synchronous partial-rollout recipe (no rollout pool): generation and "
                   "training take turns on the same GPUs; carrying long responses into the next step is not modelled")
    split = hybrid is False or rgpn is not None or rnn is not None or (ctx.has("async_training") and not sync_partial)
    if not split:
        gpn = gpn if gpn is not None or ctx.stated("trainer.n_gpus_per_node") else _default_int(
            ctx, "trainer.n_gpus_per_node", GPUS_PER_NODE_DEFAULT)
        nn = nn if nn is not None or ctx.stated("trainer.nnodes") else _default_int(ctx, "trainer.nnodes", 1)
        ctx.set("gpus_per_node", gpn, "trainer.n_gpus_per_node")
        ctx.set("nodes", nn, "trainer.nnodes")
        if gpn is not None and nn is not None:
            ctx.set("gpus", gpn * nn, "trainer.nnodes")
        if hybrid:
            ctx.set("placement", "colocated", "actor_rollout_ref.hybrid_engine")
        return
    ctx.set("placement", "one-step-off", "actor_rollout_ref.hybrid_engine" if hybrid is False else "rollout.nnodes")
    if gpn is not None and nn is not None and rgpn is not None and rnn is not None:
        ctx.set("rollout_gpus", rgpn * rnn, "rollout.nnodes")
        ctx.set("gpus", gpn * nn + rgpn * rnn, "trainer.nnodes")
        # The config does not say whether the two pools share nodes: the same GPUs per node on each
        # side reads as whole nodes to each (fully-async 64:64 on 16 nodes of 8), different counts on
        # as many nodes as the trainer's as nodes split between them (one-step-off 12:4 on 2 of 8).
        if gpn == rgpn:
            ctx.set("nodes", nn + rnn, "trainer.nnodes")
            ctx.set("gpus_per_node", gpn, "trainer.n_gpus_per_node")
        elif nn == rnn:
            ctx.set("nodes", nn, "trainer.nnodes")
            ctx.set("gpus_per_node", gpn + rgpn, "trainer.n_gpus_per_node")


def _batch(ctx: Ctx) -> None:
    tbs = ctx.int("data.train_batch_size", note="prompts per step", minimum=0)
    if tbs:
        ctx.set("prompts_per_step", tbs, "data.train_batch_size")
    ctx.int("data.max_prompt_length", "prompt_tokens_max")
    ctx.int("data.max_response_length", "response_tokens_max")
    for key, field, twin in ((f"{R}.prompt_length", "prompt_tokens_max", "data.max_prompt_length"),
                             (f"{R}.response_length", "response_tokens_max", "data.max_response_length")):
        if ctx.raw(key) == ctx.raw(twin):
            ctx.ignore(key, f"the same as {twin}")
        else:  # the engine's own cap wins over the data's
            ctx.int(key, field, note="the engine's cap")
    ctx.int(f"{R}.n", "responses_per_prompt")
    ctx.int(f"{A}.ppo_epochs", "epochs")
    ctx.str("algorithm.adv_estimator", "algorithm")
    ctx.bool(f"{R}.multi_turn.enable", "multi_turn")
    if ctx.raw(f"{R}.multi_turn.enable") is False:
        ctx.ignore(f"{R}.multi_turn", "multi-turn off: its tool settings are unused")
    if ctx.raw("critic.rollout_n") == ctx.raw(f"{R}.n"):
        ctx.ignore("critic.rollout_n", f"the same as {R}.n")


def _rollout(ctx: Ctx) -> None:
    ctx.str(f"{R}.name", "rollout_engine")
    mode = ctx.str(f"{R}.mode", note="async: the engine serves requests as they come", choices=("sync", "async"))
    ctx.set("rollout_async_engine", None if mode is None else mode == "async", f"{R}.mode")
    tp = ctx.int(f"{R}.tensor_model_parallel_size", "rollout_tp")
    if tp is None and ctx.fields.get("rollout_engine") != "hf":
        # verl/trainer/config/rollout/rollout.yaml (volcengine/verl 035682e): tensor_model_parallel_size: 2
        ctx.fields["rollout_tp"] = ROLLOUT_TP_DEFAULT
        ctx.note(f"{R}.tensor_model_parallel_size", ROLLOUT_TP_DEFAULT,
                 f"not set: veRL's default {ROLLOUT_TP_DEFAULT} (rollout.yaml)")
    ctx.float(f"{R}.gpu_memory_utilization", "gpu_memory_utilization", lo=0.01, hi=1.0)
    if ctx.bool(f"{R}.enforce_eager", "enforce_eager") is None and ctx.fields.get("rollout_engine") != "hf":
        # rollout.yaml from v0.6.0 (volcengine/verl #2956, 2025-08-08): False; ppo_trainer.yaml before it: True
        ctx.note(f"{R}.enforce_eager", None, "not set: veRL's default is false from v0.6.0, true before; the "
                 "profile's engine is taken (CUDA graphs when predicted): set it true for an older veRL")
    ctx.int(f"{R}.max_num_seqs", "max_num_seqs")
    ctx.int(f"{R}.max_num_batched_tokens", "max_num_batched_tokens")
    dtype = ctx.str(f"{R}.dtype", note="engine weights and activations", choices=DTYPES)
    ctx.set("rollout_dtype", DTYPES.get(dtype or ""), f"{R}.dtype")
    _micro(ctx, R, "log_prob", "logprob_micro_batch_sequences_per_gpu", "logprob_token_budget_per_gpu",
           _dp(ctx, f"{A}.ulysses_sequence_parallel_size"), "old log-prob pass")


def _micro(ctx: Ctx, section: str, stem: str, micro_field: str, budget_field: str, dp: Optional[int],
           what: str) -> None:
    """A pass's micro-batch or, with dynamic batching, its token budget per GPU (veRL reads one)."""
    pre = f"{section}.{stem}_" if stem else f"{section}."
    dyn_key = f"{pre}use_dynamic_bsz"
    per_gpu = f"{pre}micro_batch_size_per_gpu" if stem else f"{section}.ppo_micro_batch_size_per_gpu"
    glob = f"{pre}micro_batch_size" if stem else f"{section}.ppo_micro_batch_size"
    budget = f"{pre}max_token_len_per_gpu" if stem else f"{section}.ppo_max_token_len_per_gpu"
    dyn = ctx.bool(dyn_key, "dynamic_batch" if micro_field == "micro_batch_sequences_per_gpu" else None,
                   note=f"{what}: micro-batches filled up to a token budget")
    if dyn is True:
        ctx.int(budget, budget_field, note=f"{what}: tokens per GPU per micro-batch")
        for k in (per_gpu, glob):
            if ctx.has(k):
                ctx.ignore(k, f"unused: {dyn_key} is true")
        return
    micro = ctx.int(per_gpu, micro_field, note=f"{what}: sequences per GPU per micro-batch")
    whole = ctx.int(glob, note=f"{what}: micro-batch over all GPUs (older form)")
    if micro is None and whole is not None and dp:
        ctx.set(micro_field, max(1, whole // dp), glob)
    if dyn is False:
        if ctx.has(budget):
            ctx.ignore(budget, f"unused: {dyn_key} is false")
    else:
        ctx.int(budget, budget_field, note=f"{what}: tokens per GPU per micro-batch (with dynamic batching)")


def _actor(ctx: Ctx) -> None:
    strategy = ctx.str(f"{A}.strategy", "train_strategy", choices=STRATEGIES)
    mini = ctx.int(f"{A}.ppo_mini_batch_size", note="prompts per optimizer step (x rollout.n sequences)")
    n = ctx.raw(f"{R}.n")
    if mini is not None and isinstance(n, int) and not isinstance(n, bool):
        ctx.set("train_mini_batch_sequences", mini * n, f"{A}.ppo_mini_batch_size")
    sp = ctx.int(f"{A}.ulysses_sequence_parallel_size", "sequence_parallel")
    _micro(ctx, A, "", "micro_batch_sequences_per_gpu", "token_budget_per_gpu",
           _dp(ctx, f"{A}.ulysses_sequence_parallel_size"), "policy update")
    ctx.str(f"{M}.path", "model")
    megatron = strategy == "megatron" or (strategy is None and ctx.has(f"{A}.megatron"))
    pad = ctx.bool(f"{M}.use_remove_padding", "remove_padding")
    gc = ctx.bool(f"{M}.enable_gradient_checkpointing", note="activation checkpointing of every layer")
    if not megatron:  # both keys act on the Hugging Face model that FSDP trains
        pad = _default(ctx, f"{M}.use_remove_padding", pad, False, "remove_padding")
        gc = _default(ctx, f"{M}.enable_gradient_checkpointing", gc, True)
    ctx.set("activation_checkpointing", None if gc is None else ("full" if gc else "none"),
            f"{M}.enable_gradient_checkpointing")
    ctx.int(f"{M}.lora_rank", "lora_rank", minimum=0)
    if "lora_rank" not in ctx.fields:  # v0.7's Megatron LoRA section (model.lora.rank)
        ctx.int(f"{M}.lora.rank", "lora_rank", minimum=0)
    if megatron:
        if strategy is None:  # the recipe names no strategy but configures Megatron (the megatron trainer's config)
            ctx.set("train_strategy", "megatron", f"{A}.megatron")
        if ctx.has(f"{A}.fsdp_config"):
            ctx.ignore(f"{A}.fsdp_config", "unused: the actor trains with Megatron")
        meg = f"{A}.megatron"
        ctx.int(f"{meg}.tensor_model_parallel_size", "train_tp")
        ctx.int(f"{meg}.pipeline_model_parallel_size", "train_pp")
        ctx.int(f"{meg}.expert_model_parallel_size", "train_ep")
        cp = ctx.int(f"{meg}.context_parallel_size", note="context parallel: GPUs per sequence")
        if cp is not None and (cp > 1 or sp is None):
            ctx.set("sequence_parallel", cp, f"{meg}.context_parallel_size")
        ctx.bool(f"{meg}.param_offload", "param_offload")
        ctx.bool(f"{meg}.optimizer_offload", "optimizer_offload")
        gran = ctx.str(f"{meg}.override_transformer_config.recompute_granularity",
                       note="Megatron activation recomputation", choices=("full", "selective"))
        ctx.set("activation_checkpointing", gran, f"{meg}.override_transformer_config.recompute_granularity")
    else:
        if ctx.has(f"{A}.megatron"):
            ctx.ignore(f"{A}.megatron", f"unused: the actor trains with {strategy}")
        ctx.bool(f"{A}.fsdp_config.param_offload", "param_offload")
        ctx.bool(f"{A}.fsdp_config.optimizer_offload", "optimizer_offload")
    opt = f"{A}.optim.override_optimizer_config"
    on_cpu = ctx.bool(f"{opt}.optimizer_cpu_offload", note="Megatron's CPU optimizer step")
    frac = ctx.float(f"{opt}.optimizer_offload_fraction", note="share of the optimizer step on the CPU", hi=1.0)
    if on_cpu is not None:
        ctx.set("optimizer_on_cpu", bool(on_cpu and (frac is None or frac > 0)), f"{opt}.optimizer_cpu_offload")


# veRL's defaults for keys a config may leave out, as ppo_trainer.yaml sets them (actor_rollout_ref.model at
# volcengine/verl 008db45; verl/trainer/config/model/hf_model.yaml at 17aa18c keeps both): gradient
# checkpointing on, remove-padding off. Both act on the Hugging Face model definition, so FSDP only.
DEFAULTS = {f"{M}.enable_gradient_checkpointing": True, f"{M}.use_remove_padding": False,
            "critic.model.use_remove_padding": False}
# The rest of veRL's defaults that change a step (ppo_trainer.yaml; docs/examples/config.rst, "Config
# Explanation"): 1024 prompts a step, prompt and response caps of 512, one response per prompt, and no KL
# term (actor.use_kl_loss and algorithm.use_kl_in_reward both false: no reference model).
STEP_DEFAULTS = (("data.train_batch_size", "prompts_per_step", 1024),
                 ("data.max_prompt_length", "prompt_tokens_max", 512),
                 ("data.max_response_length", "response_tokens_max", 512),
                 (f"{R}.n", "responses_per_prompt", 1))
GPUS_PER_NODE_DEFAULT = 8  # ppo_trainer.yaml's trainer.n_gpus_per_node (trainer.nnodes: 1)
ROLLOUT_TP_DEFAULT = 2  # rollout.yaml's tensor_model_parallel_size (vLLM and SGLang; not effective for hf)


def _default_int(ctx: Ctx, key: str, default: int) -> int:
    """veRL's own value for a count the config leaves out, recorded as read and saying so."""
    ctx.note(key, default, f"not set: veRL's default {default} (ppo_trainer.yaml)")
    return default


def _default(ctx: Ctx, key: str, value: Optional[bool], default: bool, field: Optional[str] = None) -> bool:
    """``value`` as read, or veRL's default where the config does not state the key (recorded as read,
    saying it is the default)."""
    if value is not None:
        return value
    assert DEFAULTS[key] == default
    if field is not None:
        ctx.fields[field] = default
    ctx.note(key, default, f"not set: veRL's default {default} (ppo_trainer.yaml)")
    return default


def _framework_defaults(ctx: Ctx) -> None:
    """veRL's own value for each step-changing key the config leaves out, recorded as read and saying so."""
    for key, field, default in STEP_DEFAULTS:
        if ctx.fields.get(field) is None and not ctx.stated(key):
            ctx.fields[field] = default
            ctx.note(key, default, f"{field} = {default!r}; not set: veRL's default (ppo_trainer.yaml)")
    mini = ctx.raw(f"{A}.ppo_mini_batch_size")
    if ctx.fields.get("train_mini_batch_sequences") is None and isinstance(mini, int) and not isinstance(mini, bool):
        ctx.set("train_mini_batch_sequences", mini * ctx.fields["responses_per_prompt"], f"{A}.ppo_mini_batch_size")
    if ctx.fields.get("reference") is None:
        ctx.fields["reference"] = False
        ctx.fields.setdefault("kl", 0.0)
        ctx.note(f"{A}.use_kl_loss", False, "reference = False; not set, nor algorithm.use_kl_in_reward: veRL's "
                 "default false for both (no reference model)")


def _kl_and_roles(ctx: Ctx) -> None:
    adv = ctx.fields.get("algorithm")
    use_loss = ctx.bool(f"{A}.use_kl_loss", note="KL to the reference model in the loss")
    in_reward = ctx.bool("algorithm.use_kl_in_reward", note="KL to the reference model in the reward")
    coef = None
    if use_loss:
        coef = ctx.float(f"{A}.kl_loss_coef", "kl")
    elif ctx.has(f"{A}.kl_loss_coef"):
        ctx.ignore(f"{A}.kl_loss_coef", "unused: use_kl_loss is " + ("false" if use_loss is False else "not set"))
    if in_reward:
        coef = ctx.float("algorithm.kl_ctrl.kl_coef", "kl")
    elif ctx.has("algorithm.kl_ctrl.kl_coef"):
        ctx.ignore("algorithm.kl_ctrl.kl_coef", "unused: use_kl_in_reward is "
                   + ("false" if in_reward is False else "not set"))
    if use_loss is not None or in_reward is not None:
        ref = bool(use_loss or in_reward)
        which = f"{A}.use_kl_loss" if use_loss is not None else "algorithm.use_kl_in_reward"
        ctx.set("reference", ref, which)
        ctx.set("kl", coef if ref else 0.0, None if ref else which)
    if ctx.fields.get("reference") is False:
        ctx.ignore(REF, "no reference model: neither use_kl_loss nor use_kl_in_reward")
    else:
        _micro(ctx, REF, "log_prob", "ref_micro_batch_sequences_per_gpu", "ref_token_budget_per_gpu",
               _dp(ctx, f"{REF}.ulysses_sequence_parallel_size"), "reference pass")
    if adv is not None:
        ctx.set("critic", adv == "gae", "algorithm.adv_estimator")
    if adv is not None and adv != "gae":
        ctx.ignore("critic", f"no critic: adv_estimator is {adv}")
    else:
        ctx.str("critic.model.path", "critic_model")
        strategy = ctx.str("critic.strategy", note="critic trainer", choices=STRATEGIES)
        pad = ctx.bool("critic.model.use_remove_padding", "critic_remove_padding",
                       note="the critic's passes packed (true) or padded to prompt cap + response cap (false)")
        if strategy != "megatron":
            _default(ctx, "critic.model.use_remove_padding", pad, False, "critic_remove_padding")
        _micro(ctx, "critic", "", "critic_micro_batch_sequences_per_gpu", "critic_token_budget_per_gpu",
               _dp(ctx, "critic.ulysses_sequence_parallel_size"), "critic update")
    # newer veRL: reward.reward_model (reward/reward.yaml); before it, the top-level reward_model section
    new = "reward.reward_model.enable"
    ctx.bool(new if ctx.has(new) else "reward_model.enable", "reward_model")


def _asynchronous(ctx: Ctx) -> None:
    """The fully-async recipe: a step is one weight sync, ``trigger_parameter_sync_step`` updates of
    ``require_batches`` mini-batches each."""
    own = ctx.bool(f"{A}.use_rollout_log_probs", note="true: the engine's log-probs replace the old log-prob pass")
    if own is not None:
        ctx.set("old_logprob", not own, f"{A}.use_rollout_log_probs")
    if not ctx.has("async_training") or ctx.fields.get("placement") != "one-step-off":
        if ctx.fields.get("placement") == "one-step-off":
            ctx.set("off_policy_steps", 1, "actor_rollout_ref.hybrid_engine" if ctx.has(
                "actor_rollout_ref.hybrid_engine") else "rollout.nnodes")
        return
    aa = "async_training"
    trig = ctx.int(f"{aa}.trigger_parameter_sync_step", note="policy updates per weight sync")
    req = ctx.int(f"{aa}.require_batches", note="mini-batches per policy update")
    part = ctx.bool(f"{aa}.partial_rollout", "streaming", note="responses cut at a weight sync resume after it")
    if part is False:
        ctx.set("streaming", False, f"{aa}.partial_rollout")
    own = ctx.bool(f"{aa}.use_rollout_log_probs", note="true: the engine's log-probs replace the old log-prob pass")
    if own is not None:
        ctx.set("old_logprob", not own, f"{aa}.use_rollout_log_probs")
    # recipe/fully_async_policy/README.md (volcengine/verl): between two weight syncs the rollouter generates at
    # most (1 + staleness_threshold) x trigger_parameter_sync_step x require_batches x ppo_mini_batch_size
    # samples; partial_rollout takes effect only when staleness_threshold > 0
    ctx.float(f"{aa}.staleness_threshold", "staleness_share", lo=0.0,
              note="extra samples in flight per weight sync, as a share of the step's")
    mini = ctx.raw(f"{A}.ppo_mini_batch_size")
    if not ctx.fields.get("prompts_per_step") and isinstance(mini, int) and trig is not None:
        ctx.set("prompts_per_step", mini * (req or 1) * trig)
        ctx.note(f"{aa}.trigger_parameter_sync_step", trig,
                 f"prompts_per_step = ppo_mini_batch_size {mini} x require_batches {req or 1}"
                 f"{'' if req else ' (not set: the recipe default)'} x {trig} updates per weight sync")
