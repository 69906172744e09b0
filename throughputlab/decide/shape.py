"""The RL shape decide evaluates: response lengths, the training, critic, sync and engine settings,
and the placement's overlap (the spec's ``shape``; docs/decide.md)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from throughputlab.decide.lengths import CAPPED_SIGMA, LengthDist, parse_length_dist, read_lengths_file
from throughputlab.errors import UserError

Overlap = Literal["colocated", "separate", "off-policy"]
OVERLAPS = ("colocated", "separate", "off-policy")


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # a setting of inf or nan is refused


class ResponseSpec(_Spec):
    """Response lengths: ``dist`` (``lognormal:mean=..,sigma=..,max=..``) or ``file`` of observed lengths."""

    dist: Optional[str] = Field(None, description="lognormal:mean=..,sigma=..,max=.. (mean before the cut) | "
                                                 "capped:mean=..,max=..[,clip=..][,sigma=..] (mean after the cut, "
                                                 "the share at it given or implied) | uniform:min=..,max=.. | "
                                                 "fixed:len=..; ,group_corr=R: a prompt's responses share R of "
                                                 "their log-length spread (0 by default: independent)")
    file: Optional[str] = Field(None, description="Observed response lengths (tokens), one per line; a CSV with a "
                                                  "uid, prompt_id, prompt or group column also gives group_corr.")
    max_tokens: Optional[int] = None  # cut applied to observed lengths

    def resolve(self) -> LengthDist:
        if bool(self.dist) == bool(self.file):
            raise UserError("give the response lengths once: --response-lengths FILE or --response-dist "
                            "lognormal:mean=..,sigma=..,max=.. (shape.response.file or .dist in the spec)")
        if self.file:
            return read_lengths_file(self.file, self.max_tokens)
        return parse_length_dist(self.dist)


class TrainShape(_Spec):
    epochs: int = 1  # PPO epochs over each batch
    mini_batches: int = 1  # optimizer steps per epoch (unless mini_batch_samples is set)
    mini_batch_samples: Optional[int] = None  # fixed mini-batch size in responses
    micro_batch: Optional[int] = None  # None: the largest that fits, from the profile's memory model
    logprob_micro_batch: Optional[int] = None  # None: the training micro-batch
    old_logprob: bool = True  # forward pass for the old policy's log-probs
    ref_logprob: bool = True  # forward pass of the reference model (KL term)
    activation_checkpointing: bool = Field(False, description=(  # veRL: on
        "Training recomputes each block's forward (veRL's default): 4x instead of 3x forward FLOPs."))
    padded_seq_len: Optional[int] = Field(None, gt=0)  # every sequence padded to this many tokens (no remove-padding)
    token_budget: Optional[int] = Field(None, gt=0)  # tokens per GPU per update micro-batch (dynamic batching)
    logprob_token_budget: Optional[int] = Field(None, gt=0)  # the same for the log-prob passes
    # the training backend: FSDP (weights all-gathered per micro-batch) or Megatron-core (weights resident,
    # TP x PP per model replica, the rest data-parallel; roofline/rl.py); tp/pp/ep are Megatron's layout
    backend: Literal["fsdp", "megatron"] = Field("fsdp", description=(
        "The training backend: FSDP (weights all-gathered in every micro-batch) or Megatron-core (weights "
        "resident in replicas of TP x PP GPUs, the rest data-parallel; an approximation)."))
    # training state moved to host memory and back between phases, in copies per step over the host link
    # (roofline.rl.offload_bytes): NeMo-RL's colocated step, veRL's param_offload / optimizer_offload
    offload_param_copies: float = Field(0.0, ge=0, description=(
        "Copies of each training GPU's parameter shard that cross the host link per step (offload and reload "
        "between phases; NeMo-RL colocated: 5 with a reference model, veRL param_offload: 4)."))
    offload_grad_copies: float = Field(0.0, ge=0, description=(
        "Copies of each training GPU's fp32 gradient shard that cross the host link per step (NeMo-RL colocated "
        "Megatron: 2)."))
    offload_optimizer_copies: float = Field(0.0, ge=0, description=(
        "Copies of each training GPU's optimizer shard (fp32 master weights and Adam moments) that cross the host "
        "link per step (NeMo-RL colocated and veRL optimizer_offload: 2)."))
    sequence_parallel: int = Field(1, ge=1, description=(
        "FSDP training: Ulysses sequence parallelism (veRL's ulysses_sequence_parallel_size): each sequence split "
        "over this many GPUs, with all-to-alls around attention; micro-batches and token budgets count sequences "
        "and tokens per group of that many GPUs (a token budget is per GPU, as veRL's), its activations split. "
        "Megatron training: context parallelism (context_parallel_size), a replica of TP x PP x CP GPUs."))
    tp: int = Field(1, ge=1, description="Megatron training: tensor-parallel size of a model replica.")
    pp: int = Field(1, ge=1, description="Megatron training: pipeline stages of a model replica.")
    ep: int = Field(1, ge=1, description="Megatron training: expert-parallel size (MoE models).")


class CriticShape(_Spec):
    model: str = "same"  # "same" as the policy, or a preset / model folder / hub id
    micro_batch: Optional[int] = None
    token_budget: Optional[int] = Field(None, gt=0)  # tokens per GPU per micro-batch (dynamic batching)
    # every critic pass padded to this many tokens (veRL's critic without remove-padding); 0: packed; None: as the
    # policy's passes (shape.train.padded_seq_len)
    padded_seq_len: Optional[int] = Field(None, ge=0)


class SyncShape(_Spec):
    bytes_per_s: Optional[float] = None  # colocated default: a device copy at the fitted bandwidth
    latency_s: float = 0.0
    pipelined: bool = Field(False, description=(
        "The weights go over in buckets from two buffers, so gathering the next bucket from the training shards "
        "overlaps sending this one (NeMo-RL's packed broadcast from v0.4): the sync takes the longer of the two, "
        "not their sum."))


class EngineShape(_Spec):
    """Overrides of the engine's settings recorded in the profile (the flags of `predict`'s engine)."""

    name: Optional[Literal["vllm", "sglang", "trtllm"]] = Field(None, description=(
        "The rollout engine (veRL rollout.name, NeMo-RL generation.backend): a predicted profile's engine becomes "
        "it, with its KV rule, its prefill scheduling (SGLang: steps of their own) and its defaults. A predicted "
        "profile's engine only."))

    max_num_seqs: Optional[int] = Field(None, gt=0, description=(  # None: 1024, veRL's rollout default
        "Sequences an engine runs at once (rollout.max_num_seqs)."))
    kv_cache_tokens: Optional[int] = Field(None, gt=0)
    block_size: Optional[int] = Field(None, gt=0)  # None: the profile's engine, else 16 (vLLM: 16 on GPU, 128 on CPU)
    kv_cache_gib: Optional[float] = Field(None, gt=0, description=(
        "The KV-cache memory per GPU the engine logged, instead of the engine's rule."))
    enforce_eager: Optional[bool] = Field(None, description=(  # None: as the profile's engine ran or was predicted
        "Engines without CUDA graphs (rollout.enforce_eager): the launches of every layer in each decode step. "
        "A predicted profile's engine only."))
    max_num_batched_tokens: Optional[int] = Field(None, gt=0, description=(
        "The chunked-prefill token budget per engine step."))
    in_process_logprobs: Optional[Literal["off", "ids", "text"]] = Field(None, description=(
        "Each sampled token's log-prob returned by engines in the trainer's process without async scheduling: "
        "ids (veRL's synchronous rollout) or text (detokenized: NeMo-RL's synchronous engine), more host time per "
        "running sequence a decode step (roofline.engine.LOGPROBS_HOST_RATIO). A predicted profile's engine only."))
    max_model_len: Optional[int] = Field(None, gt=0, description="The engines' max_model_len (sizes vLLM's profile run).")
    distributed_executor_backend: Optional[Literal["mp", "uni", "external_launcher", "ray"]] = Field(None, description=(
        "vLLM's executor: ray (NeMo-RL's and OpenRLHF's engines of several GPUs) schedules asynchronously only from "
        "vLLM 0.21, so on the profile's earlier engine every decode step keeps its host time per running sequence "
        "(roofline.engine.RAY_ASYNC_SCHEDULING_VERSION). A predicted profile's engine only."))


class RewardShape(_Spec):
    """Scoring the responses on the host after the rollout (an environment or a reward function); 0: not priced."""

    per_response_s: float = Field(0.0, ge=0, description=(
        "Host seconds to score one response (math-verify: 0.005, roofline.rl.MATH_VERIFY_S); 0: not priced."))
    workers: int = Field(1, ge=1, description="Processes scoring responses in parallel (NeMo-RL env.math.num_workers).")


class RLShape(_Spec):
    algo: Literal["grpo", "ppo"] = Field("grpo", description="PPO adds a critic.")
    prompt_len: int = Field(512, description="Prompt tokens per request.")
    response: ResponseSpec = ResponseSpec(dist=f"lognormal:mean=512,sigma={CAPPED_SIGMA:g},max=2048")
    overlap: Overlap = Field("colocated", description=(
        "Phases in sequence on shared or separate devices, or one-step off-policy overlap."))
    train: TrainShape = TrainShape()
    critic: Optional[CriticShape] = None  # PPO: default the policy's own size
    sync: SyncShape = SyncShape()
    engine: EngineShape = EngineShape()
    reward: RewardShape = RewardShape()
    prefix_sharing: bool = True  # GRPO: a prompt's responses share its prefill and KV (vLLM prefix caching, n > 1)
    partial_rollout: float = Field(0.0, description=(  # 0: full rollouts
        "Partial rollouts (APRIL): OVER more prompts in flight as a share of the batch (0.25: 25%), generation "
        "ends when the batch is done, unfinished responses resume next step."))
    # overlapped placements: steps generation may run ahead of training (NeMo-RL's
    # grpo.async_grpo.max_trajectory_age_steps); k > 1 puts k steps' samples in the engines' queue at once
    off_policy_steps: int = Field(1, ge=1, le=64, description=(
        "Overlapped placements: steps generation may run ahead of training (NeMo-RL's "
        "grpo.async_grpo.max_trajectory_age_steps); K > 1 queues K steps' samples in the engines at once."))
    seed: int = Field(0, description="Seed for the response lengths drawn per batch.")

    @field_validator("prompt_len")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError("must be a positive integer")
        return v

    @field_validator("seed")
    @classmethod
    def _seed(cls, v: int) -> int:
        if v < 0:
            raise ValueError(f"must be a non-negative integer, got {v}")
        return v

    @field_validator("partial_rollout")
    @classmethod
    def _share(cls, v: float) -> float:
        if not 0 <= v <= 1:  # (also refuses NaN)
            raise ValueError(f"must be an over-provisioning share between 0 and 1 (0.25: 25% more prompts), got {v}")
        return v
