"""The framework-neutral description of an RL run's launch config: ``RunConfig`` and its ``Knob``s.

Every field is in the unit its name says (prompts, sequences, tokens, GPUs); ``None`` means the
config does not state it and the step model's own default applies. ``read`` lists each key of the
file that set a field (and which one), ``ignored`` each key that did not (and why), so a user can
check that nothing that changes the step time was missed.

``placement`` says where generation runs: ``colocated``, on the training GPUs in turn with training
(veRL's hybrid engine, NeMo-RL's colocated generation, OpenRLHF's ``--colocate_all_models``, TRL's
``vllm_mode: colocate``); ``split``, on ``rollout_gpus`` of its own while training waits for it
(on-policy); ``one-step-off``, on GPUs of its own and ahead of training by up to ``off_policy_steps``
steps (veRL's one-step-off and fully-async recipes, NeMo-RL's async GRPO, OpenRLHF's
``--async_train``); ``streaming`` marks the fully-async form, where responses reach the trainer as
they finish.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict

Framework = Literal["verl", "nemo-rl", "openrlhf", "trl"]
FRAMEWORK_NAMES = {"verl": "veRL", "nemo-rl": "NeMo-RL", "openrlhf": "OpenRLHF", "trl": "TRL"}
Placement = Literal["colocated", "one-step-off", "split"]
Checkpointing = Literal["none", "selective", "full"]


class Knob(BaseModel):
    """One key of the config: its dotted path (or ``--flag``), its value, and a note: what it set
    (in ``read``) or why it does not matter for the step time (in ``ignored``)."""

    model_config = ConfigDict(extra="forbid")
    key: str
    value: Any = None
    note: str


class RunConfig(BaseModel):
    """What an RL run's config says about its step time. ``None``: not stated."""

    model_config = ConfigDict(extra="forbid")
    framework: Framework
    framework_version: Optional[str] = None
    source: str  # the file, as the user named it
    model: Optional[str] = None  # policy model path or hub id
    algorithm: Optional[str] = None  # advantage estimator as the framework names it (grpo, gae, ...)

    # Batch: one RL step generates prompts_per_step x responses_per_prompt responses.
    prompts_per_step: Optional[int] = None
    responses_per_prompt: Optional[int] = None
    train_mini_batch_sequences: Optional[int] = None  # sequences per optimizer step (all GPUs)
    micro_batch_sequences_per_gpu: Optional[int] = None  # per data-parallel rank, one forward/backward
    epochs: Optional[int] = None  # passes of the policy update over each step's batch
    multi_turn: Optional[bool] = None  # tool calls / several assistant turns per response

    # Lengths.
    prompt_tokens_max: Optional[int] = None
    response_tokens_max: Optional[int] = None
    sequence_tokens_max: Optional[int] = None  # prompt + response cap; None: the sum of the two

    # Generation.
    rollout_engine: Optional[str] = None  # vllm, sglang, hf
    rollout_tp: Optional[int] = None  # GPUs per engine
    rollout_gpus: Optional[int] = None  # GPUs that only generate (placement one-step-off or split)
    gpu_memory_utilization: Optional[float] = None
    enforce_eager: Optional[bool] = None
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    rollout_async_engine: Optional[bool] = None  # engine serves requests as they come (AsyncLLM)
    rollout_detokenize: Optional[bool] = None  # the engine turns its outputs into text (None: the framework's default)
    rollout_dtype: Optional[str] = None  # bf16, fp16, fp8

    # Policy update.
    train_strategy: Optional[str] = None  # fsdp, fsdp2, megatron, deepspeed
    zero_stage: Optional[int] = None
    train_tp: Optional[int] = None
    train_pp: Optional[int] = None
    train_ep: Optional[int] = None
    sequence_parallel: Optional[int] = None  # GPUs one sequence is split over (Ulysses / context parallel)
    remove_padding: Optional[bool] = None  # sequences packed without padding
    critic_remove_padding: Optional[bool] = None  # the critic's own (veRL: critic.model.use_remove_padding)
    dynamic_batch: Optional[bool] = None  # micro-batches filled up to token_budget_per_gpu
    token_budget_per_gpu: Optional[int] = None
    param_offload: Optional[bool] = None  # parameters leave the GPU between phases
    optimizer_offload: Optional[bool] = None  # optimizer state leaves the GPU between phases
    optimizer_on_cpu: Optional[bool] = None  # the optimizer step itself runs on the CPU
    states_sleep: Optional[bool] = None  # the trainer's states leave the GPU while the engines generate (DeepSpeed sleep)
    activation_checkpointing: Optional[Checkpointing] = None
    train_dtype: Optional[str] = None  # bf16, fp16, fp32, fp8
    lora_rank: Optional[int] = None  # 0: full fine-tuning

    # Forward-only passes: old log-probs (policy) and the reference model.
    old_logprob: Optional[bool] = None  # False: the engine's log-probs are used instead
    logprob_micro_batch_sequences_per_gpu: Optional[int] = None
    logprob_token_budget_per_gpu: Optional[int] = None
    ref_micro_batch_sequences_per_gpu: Optional[int] = None
    ref_token_budget_per_gpu: Optional[int] = None

    # Other models of the step.
    critic: Optional[bool] = None  # a value model is run and trained (PPO with GAE)
    critic_model: Optional[str] = None
    critic_micro_batch_sequences_per_gpu: Optional[int] = None
    critic_token_budget_per_gpu: Optional[int] = None
    reference: Optional[bool] = None  # a reference-model forward pass each step (KL)
    kl: Optional[float] = None  # KL coefficient (loss or reward)
    reward_model: Optional[bool] = None  # a learned reward model's forward pass each step
    reward_scorer: Optional[Literal["math_verify"]] = None  # responses scored on the host by this (priced)
    reward_workers: Optional[int] = None  # processes scoring them in parallel

    # Cluster and placement.
    gpus: Optional[int] = None  # GPUs of the run in all
    gpus_per_node: Optional[int] = None
    nodes: Optional[int] = None
    placement: Optional[Placement] = None
    off_policy_steps: Optional[int] = None  # how many steps generation may run ahead of training
    streaming: Optional[bool] = None  # responses stream to the trainer as they finish (partial rollouts)
    staleness_share: Optional[float] = None  # extra samples in flight per weight sync, as a share of a step's

    read: list[Knob] = []
    ignored: list[Knob] = []

    @property
    def responses_per_step(self) -> Optional[int]:
        if self.prompts_per_step is None or self.responses_per_prompt is None:
            return None
        return self.prompts_per_step * self.responses_per_prompt

    def knob(self, key: str) -> Optional[Knob]:
        """The read or ignored entry of ``key`` (a dotted path or ``--flag``), if any."""
        for k in (*self.read, *self.ignored):
            if k.key == key:
                return k
        return None
