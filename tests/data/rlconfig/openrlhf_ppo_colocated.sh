#!/usr/bin/env bash
# An OpenRLHF PPO launch in the style of examples/scripts/train_ppo_llama_ray_hybrid_engine.sh:
# every model and the vLLM engines on the same 8 GPUs (hybrid engine), vLLM sleeping while training.
set -x
pip install openrlhf==0.8.5  # the version this script was written for

SAVE_PATH=/openrlhf/checkpoint/llama3-8b-rlhf
MICRO_TRAIN=8

ray job submit --address="http://127.0.0.1:8265" \
   --runtime-env-json='{"working_dir": "/openrlhf"}' \
   -- python3 -m openrlhf.cli.train_ppo_ray \
   --ref_num_nodes 1 \
   --ref_num_gpus_per_node 8 \
   --reward_num_nodes 1 \
   --reward_num_gpus_per_node 8 \
   --critic_num_nodes 1 \
   --critic_num_gpus_per_node 8 \
   --actor_num_nodes 1 \
   --actor_num_gpus_per_node 8 \
   --vllm_num_engines 4 \
   --vllm_tensor_parallel_size 2 \
   --colocate_all_models \
   --vllm_gpu_memory_utilization 0.5 \
   --vllm_enable_sleep \
   --deepspeed_enable_sleep \
   --vllm_sync_backend nccl \
   --enforce_eager \
   --pretrain OpenRLHF/Llama-3-8b-sft-mixture \
   --reward_pretrain OpenRLHF/Llama-3-8b-rm-700k \
   --save_path ${SAVE_PATH} \
   --ckpt_path "${SAVE_PATH}/ckpt" \
   --save_hf_ckpt \
   --micro_train_batch_size ${MICRO_TRAIN} \
   --train_batch_size 128 \
   --micro_rollout_batch_size 16 \
   --rollout_batch_size 1024 \
   --n_samples_per_prompt 8 \
   --max_epochs 1 \
   --prompt_max_len 1024 \
   --max_samples 100000 \
   --generate_max_len 1024 \
   --zero_stage 3 \
   --bf16 \
   --actor_learning_rate 5e-7 \
   --critic_learning_rate 9e-6 \
   --init_kl_coef 0.01 \
   --prompt_data OpenRLHF/prompt-collection-v0.1 \
   --input_key context_messages \
   --apply_chat_template \
   --normalize_reward \
   --gradient_checkpointing \
   --packing_samples \
   --adam_offload \
   --advantage_estimator gae \
   --use_wandb "${WANDB_TOKEN}"
