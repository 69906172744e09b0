"""What each framework's logged step timers hold, in the step model's phases: a run's log is compared
with the model timer by timer, and the frameworks draw the boundaries differently (NeMo-RL times the
environment's rewards and the engines' sleep inside its generation; veRL's generation held the weight
sync and wake-up until the releases after v0.7.0; OpenRLHF logs no phase times before v0.9.6).

Read from each framework's source at the tags named (the trainer loop and the workers it calls);
``timer_lines`` gives the lines `decide --config` prints. The model's phases: gen (the engines'
generation), sync (weights into the engines, with the engines' wake-up when colocated), logprob (old
policy and reference), train (the update; critic for PPO), offload (training state to host and back),
reward (scoring on the host: priced where the config names math-verify, shape.reward). The responses'
decode to text is not modelled."""

from __future__ import annotations

from typing import Optional

# framework -> (source, [(timer, what it holds, where the framework changed it)]); colocated and
# separate-GPU differences are written into the text.
TIMERS: dict[str, tuple[str, list[tuple[str, str]]]] = {
    "nemo-rl": ("nemo_rl/algorithms/grpo.py and experience/rollouts.py, v0.3.1 to v0.7.0 and main", [
        ("timing/train/generation",
         "gen, plus the environment's rewards (reward: priced for env.math's math-verify), the responses' decode "
         "to text (not modelled) and, colocated, the engines' sleep (finish_generation)"),
        ("timing/train/prepare_for_generation (v0.4+: /total)",
         "sync and offload's moves to the host: colocated, the optimizer to host, the engines' wake-up, the weight "
         "transfer, the model to host; separate GPUs, the weight broadcast alone (v0.4+: "
         "/transfer_and_update_weights is the transfer alone)"),
        ("timing/train/logprob_inference_prep", "offload: the model to the GPU, the optimizer to the host (both "
         "placements)"),
        ("timing/train/training_prep", "offload: the model and optimizer to the GPU"),
        ("timing/train/policy_and_reference_logprobs", "logprob (both passes)"),
        ("timing/train/policy_training", "train"),
        ("timing/train/reward_calculation", "not the rewards: baselines and advantages only (v0.6+: "
         "advantage_calculation holds the advantages)"),
        ("timing/train/total_step_time", "the step, plus validation and checkpoints on the steps that run them"),
        ("asynchronous GRPO (one-step-off, k steps off)", "other keys: exposed_generation (waiting for "
         "trajectories), weight_sync (the refit), policy_and_reference_logprobs, policy_training; the rewards are "
         "scored in the background collector, in no step timer"),
    ]),
    "verl": ("verl/trainer/ppo/ray_trainer.py and the workers' rollout and sharding managers, v0.5.0 to v0.7.0 "
             "and the commits after it", [
        ("timing_s/gen",
         "gen and the engines' sleep; up to v0.7.0 also the weight sync, the wake-up and offload's moves (sync, "
         "offload), after v0.7.0 not; in the agent loop (v0.6+ async, v0.7 on) also the rewards per sample"),
        ("timing_s/update_weights", "after v0.7.0: sync (the weight sync and the wake-up) and offload's moves"),
        ("timing_s/reshard (v0.5 sync mode)", "the weight sync and wake-up inside timing_s/gen"),
        ("timing_s/generate_sequences (v0.5-v0.6 sync mode)", "gen alone"),
        ("timing_s/reward", "the rewards (reward; not priced for veRL's string-match scores); in the agent loop "
         "only reading them; with launch_reward_fn_async only the launch (the wait lands in timing_s/adv)"),
        ("timing_s/old_log_prob, timing_s/ref", "logprob, with the offload reloads when param_offload is on"),
        ("timing_s/update_actor, timing_s/values, timing_s/update_critic", "train (actor; critic for PPO), "
         "with the offload reloads"),
        ("timing_s/step", "the step, plus validation and checkpoints on the steps that run them"),
    ]),
    "openrlhf": ("openrlhf/trainer/ppo_trainer.py, v0.9.6 to v0.11.0 and main (no phase times before v0.9.6)", [
        ("train/timing/generation", "gen, plus the rewards (reward function or remote reward model, not modelled) "
         "and, colocated, the engines' KV-cache wake-up and sleep"),
        ("train/timing/make_experience", "logprob (actor and reference), the critic's values, a reward model's "
         "forward (not modelled), advantages"),
        ("train/timing/ppo_train", "train, with DeepSpeed's state reload and offload when colocated"),
        ("train/timing/broadcast", "sync (colocated: with the weights' wake-up)"),
        ("train/timing/step_total", "the sum of the four above in the synchronous trainer, not a wall time; the "
         "asynchronous one (v0.9.7+) logs the wall time"),
    ]),
    "trl": ("trl/trainer/grpo_trainer.py, v0.16 to 1.x: profiling/Time taken: GRPOTrainer.<name>, per call", [
        ("vLLM.generate", "gen alone (colocated, the wake-up and sleep are outside it)"),
        ("_move_model_to_vllm (v0.28+: sync_weights)", "sync (v0.28+: with the weights' wake-up)"),
        ("_calculate_rewards", "the rewards (not modelled)"),
        ("_get_per_token_logps(_and_entropies)", "logprob and the update's forward passes together"),
        ("step_time (trainer_state.json, where the version logs it)", "the step"),
    ]),
}


def timer_lines(framework: str, placement: Optional[str] = None) -> list[str]:
    """The lines that say what the framework's logged timers hold in the model's phases."""
    if framework not in TIMERS:
        return []
    source, rows = TIMERS[framework]
    where = f", {placement}" if placement else ""
    return ([f"  timers in the run's log ({source}{where}):"]
            + [f"    {key}: {holds}" for key, holds in rows])
