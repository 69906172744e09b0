"""RL step composition: phases, overlap modes, micro-batching, the critic, weight sync."""

from __future__ import annotations

import pytest

from throughputlab.decide.steptime import RLShape, StepModel
from throughputlab.errors import UserError
from throughputlab.models import resolve_model
from throughputlab.roofline import TRAIN_LAYER_LAUNCH_S, Costs, all_weight_bytes
from throughputlab.throughput import DecodeParams, ThroughputModel, TrainParams


def model(mem=True) -> ThroughputModel:
    return ThroughputModel(
        source="analytic", costs=Costs.from_spec(resolve_model("demo").spec, 4),
        decode=DecodeParams(t0_s=2e-3, bw_bytes_per_s=10e9, phi_flops_per_s=80e9),
        train=TrainParams(t0_s=0.01, phi_flops_per_s=50e9, optimizer_step_s=0.2,
                          mem0_bytes=2e9 if mem else None, mem_per_sample_bytes=0.5e9 if mem else None,
                          device_memory_bytes=8e9 if mem else None))


def shape(**kw) -> RLShape:
    base = dict(prompt_len=64, response={"dist": "fixed:len=32"})
    base.update(kw)
    return RLShape.model_validate(base)


def test_colocated_step_is_the_sum_of_its_phases_with_hand_counted_micro_batches():
    m = model()
    sm = StepModel(m, shape(train={"epochs": 2, "mini_batches": 2}))
    st = sm.step(10, 4)  # 40 responses of 64 + 32 tokens
    assert sm.micro_batch == 12  # (8e9 - 2e9) / 0.5e9
    seq = 96.0
    # each pass of an analytic profile pays its layers' host time: a forward 1.8 plain forwards, a training
    # micro-step 6.8 (no checkpointing; roofline.training)
    launch = m.costs.num_layers * TRAIN_LAYER_LAUNCH_S
    # and the RL loss's pass over the vocabulary's logits at the memory bandwidth (10 GB/s here): 50 bytes a
    # logit with the backward, 14 in a forward (roofline.rl_logits_s)
    v = m.costs.vocab_size
    logits = lambda b, per: b * seq * v * per / 10e9  # noqa: E731
    # two mini-batches of 20: one micro-batch of 12 and one of 8 each, an optimizer step each, two epochs
    mini = m.train_step_s(12, seq) + m.train_step_s(8, seq) + 2 * 6.8 * launch + logits(20, 50) + 0.2
    assert st.train_s == pytest.approx(2 * 2 * mini)
    assert st.optimizer_steps == 4
    fwd = lambda b: 0.01 + (m.train_step_s(b, seq) - 0.01) / 3 + 1.8 * launch + logits(b, 14)  # noqa: E731
    assert st.logprob_s == pytest.approx(2 * (3 * fwd(12) + fwd(4)))  # old policy + reference, 40 = 3*12 + 4
    assert st.sync_s == pytest.approx(all_weight_bytes(m.costs) / 5e9)  # device copy: read + write at 10 GB/s
    assert st.critic_s == 0
    assert st.step_s == pytest.approx(st.gen_s + st.logprob_s + st.train_s + st.sync_s)
    assert st.samples_per_s == pytest.approx(40 / st.step_s)


def test_off_policy_overlaps_generation_with_training():
    m = model()
    on = StepModel(m, shape(overlap="separate", sync={"bytes_per_s": 1e9})).step(16, 8)
    off = StepModel(m, shape(overlap="off-policy", sync={"bytes_per_s": 1e9})).step(16, 8)
    assert off.step_s == pytest.approx(max(off.gen_s, off.logprob_s + off.train_s) + off.sync_s)
    assert off.step_s < on.step_s
    assert on.step_s == pytest.approx(on.gen_s + on.logprob_s + on.train_s + on.sync_s)


def test_separate_devices_need_the_link_bandwidth():
    with pytest.raises(UserError, match="sync.bytes_per_s"):
        StepModel(model(), shape(overlap="separate"))


def test_ppo_adds_a_critic_scaled_by_its_size():
    m = model()
    grpo = StepModel(m, shape(algo="grpo", prefix_sharing=False)).step(8, 4)  # PPO's responses share nothing
    ppo = StepModel(m, shape(algo="ppo")).step(8, 4)
    assert grpo.critic_s == 0 and ppo.critic_s > 0
    small = Costs.from_spec(resolve_model("tiny").spec, 4)
    ppo_small = StepModel(m, shape(algo="ppo"), critic_costs=small).step(8, 4)
    assert 0 < ppo_small.critic_s < ppo.critic_s
    assert ppo.step_s == pytest.approx(grpo.step_s + ppo.critic_s)


def test_micro_batch_unknown_without_memory_model_is_a_user_error():
    with pytest.raises(UserError, match="train.micro_batch"):
        StepModel(model(mem=False), shape())
    sm = StepModel(model(mem=False), shape(train={"micro_batch": 4}))
    assert sm.micro_batch == 4


def test_fixed_mini_batch_size_gives_more_optimizer_steps_at_larger_batch():
    sm = StepModel(model(), shape(train={"mini_batch_samples": 64}))
    assert sm.step(16, 8).optimizer_steps == 2
    assert sm.step(64, 8).optimizer_steps == 8


def test_engine_cap_comes_from_the_rl_configuration_never_from_the_bench():
    m = model().model_copy(update={"max_num_seqs": 16})  # the largest concurrency a bench swept
    assert StepModel(m, shape()).caps.max_num_seqs == 1024  # veRL's rollout default
    assert StepModel(m, shape(engine={"max_num_seqs": 4})).caps.max_num_seqs == 4
    capped = StepModel(m, shape(engine={"max_num_seqs": 16})).step(8, 8)
    assert capped.rollout.peak_concurrency == 16
    assert StepModel(m, shape()).step(8, 8).rollout.peak_concurrency == 64


def test_all_batch_sizes_at_once_equal_each_on_its_own_over_several_engines():
    from throughputlab.decide.cluster import Placement

    m = model()
    pl = Placement(kind="colocated", gpus=3, gen_gpus=3, train_gpus=3, tp=1)
    sm = StepModel(m, shape(response={"dist": "lognormal:mean=60,sigma=0.9,max=300"},
                            engine={"max_num_seqs": 16, "kv_cache_tokens": 700}), placement=pl)
    prompts = [1, 2, 5, 9, 16]
    together = sm.steps(prompts, 4)
    assert any(st.rollout.kv_limited for st in together)
    for p, st in zip(prompts, together):
        alone = sm.step(p, 4)
        assert st.step_s == pytest.approx(alone.step_s, rel=1e-12) and st.engine_prompts == alone.engine_prompts
        assert st.rollout.preemptions == alone.rollout.preemptions


def test_a_micro_batch_set_above_what_fits_is_warned_about(caplog):
    from types import SimpleNamespace

    from throughputlab.decide.steptime import micro_batch_for

    fits = SimpleNamespace(max_micro_batch=lambda: 4)
    with caplog.at_level("WARNING"):
        assert micro_batch_for(fits, 4) == 4
    assert not caplog.text
    with caplog.at_level("WARNING"):
        assert micro_batch_for(fits, 64) == 64
    assert "train.micro_batch 64 is above the 4 sequences that the memory model fits" in caplog.text
    with pytest.raises(UserError, match=r"use more training GPUs \(--gpus\), --activation-checkpointing"):
        micro_batch_for(SimpleNamespace(max_micro_batch=lambda: 0), None)
