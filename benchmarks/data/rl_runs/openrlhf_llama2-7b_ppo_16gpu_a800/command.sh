#!/usr/bin/env bash
# OpenRLHF PPO, 7B model, 16x A800-80GB: only the values the source states.
# Source: OpenRLHF/OpenRLHF README.md @ commit 391e1de4b0866473082173a5eb1f47fe901081c5 (2024-05-18, section 'Performance')
#   "The average time (seconds) it took to train 1024 prompts with 1 PPO epoch" -> 471.11 s (7B, 16 A800 GPUs)
# The README does not publish the command of this benchmark. Not stated (left out below):
#   model names (actor/critic/reward/ref), per-role GPU counts, vLLM engines and TP, ZeRO stage, offload,
#   micro batch sizes, train_batch_size, prompt/generate max lengths, packing, colocation flags, versions.
# Entry point of that commit: examples/train_ppo_ray.py (ray job submit ... -- python3 examples/train_ppo_ray.py).
python3 examples/train_ppo_ray.py \
    --rollout_batch_size 1024 \
    --max_epochs 1
