"""Memory lines of decide's micro-batch checks. A Megatron layout uses each rank's shard of the weights,
gradients and distributed optimizer and the activations split over TP, not FSDP's line: a 70B policy on
TP 4 x PP 4 over 64 H100s fits a 4,096-token micro-batch (NeMo-RL's v0.3 70B recipe runs one), FSDP's line
over the same GPUs fits none. A log-prob pass (no backward) holds one block's activations and the logits."""

from __future__ import annotations

import logging

import pytest

from throughputlab.decide.backend import MegatronLayout, memory_model
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, predict_analytic
from throughputlab.roofline import Costs
from throughputlab.roofline import rl as rfl
from throughputlab.throughput import ThroughputModel


def _costs(name: str) -> Costs:
    return Costs.from_spec(resolve_model(name).spec, 2)


def test_dense_state_is_its_shard_plus_its_share_of_the_optimizer():
    c = _costs("llama3.1-70b")
    params = c.total_weight_bytes / 2
    # TP 4 x PP 4 over 64 GPUs: 1/16 of the weights and gradients (2 + 2 bytes), the optimizer's 12 bytes over 4 DP ranks
    assert rfl.megatron_state_bytes_per_rank(c, 4, 4, 1, 64) == pytest.approx(params / 16 * (4 + 12 / 4))
    # one replica: the whole optimizer shard stays on the rank; more replicas only shrink the optimizer's share
    one = rfl.megatron_state_bytes_per_rank(c, 4, 4, 1, 16)
    assert one == pytest.approx(params / 16 * 16)
    assert rfl.megatron_state_bytes_per_rank(c, 4, 4, 1, 128) < rfl.megatron_state_bytes_per_rank(c, 4, 4, 1, 64) < one


def test_experts_split_over_ep_the_rest_over_tp():
    c = _costs("qwen3-30b-a3b")
    params = c.total_weight_bytes / 2
    experts = c.moe_layers * c.moe_num_experts * c.moe_expert_bytes / 2
    assert 0.5 * params < experts < params
    got = rfl.megatron_state_bytes_per_rank(c, 2, 1, 8, 64)
    dense, exp = (params - experts) / 2, experts / 8
    assert got == pytest.approx(4 * (dense + exp) + 12 * (dense / 32 + exp / 8))
    # EP shards the experts: without it every rank would hold them all
    assert rfl.megatron_state_bytes_per_rank(c, 2, 1, 1, 64) > 3 * got


def _model(tmp_path) -> ThroughputModel:
    from throughputlab.fit.load import load_model
    from throughputlab.records.profile import Profile

    path = tmp_path / "70b.json"
    predict_analytic(resolve_model("llama3.1-70b").spec, "h100", layout=Layout(gpus=64, nodes=8),
                     seq_len=4096).save(path)
    return load_model(Profile.load(path))


def test_the_memory_line_follows_the_layout(tmp_path):
    model = _model(tmp_path)
    assert model.max_micro_batch() == 0  # FSDP's line: a 4,096-token sequence's activations fill the device
    layout = MegatronLayout(tp=4, pp=4, ep=1, dp=4)
    mem = memory_model(model, layout)
    assert mem.train.mem0_bytes == pytest.approx(rfl.megatron_state_bytes_per_rank(model.costs, 4, 4, 1, 64))
    assert mem.train.mem_per_sample_bytes == pytest.approx(model.train.mem_per_sample_bytes / 4)
    assert mem.max_micro_batch() >= 1
    assert memory_model(model, None) is model


def test_a_megatron_step_checks_its_micro_batch_against_its_own_memory(tmp_path, caplog):
    from throughputlab.decide.calculator import DecideSpec, decide_from_spec

    path = tmp_path / "70b.json"
    predict_analytic(resolve_model("llama3.1-70b").spec, "h100", layout=Layout(gpus=64, nodes=8),
                     seq_len=4096).save(path)
    shape = {"prompt_len": 128, "response": {"dist": "lognormal:mean=1024,sigma=0.6,max=3968"},
             "train": {"micro_batch": 1, "logprob_micro_batch": 1}}

    def decide(train: dict) -> str:
        caplog.clear()
        spec = DecideSpec.model_validate({"profile": str(path), "prompts": [64], "group": 32,
                                          "cluster": {"gpus": 64, "nodes": 8, "engine_tp": 4},
                                          "shape": {**shape, "train": {**shape["train"], **train}}})
        with caplog.at_level(logging.WARNING):
            decide_from_spec(spec)
        return caplog.text

    fsdp = decide({"backend": "fsdp"})
    assert "train.micro_batch 1 is above the 0 sequences" in fsdp
    assert "logprob_micro_batch" not in fsdp  # a forward pass keeps one block's activations, not eighty
    assert "memory model fits" not in decide({"backend": "megatron", "tp": 4, "pp": 4})


def test_a_forward_pass_holds_one_block_and_the_logits():
    from throughputlab.roofline.memory import activation_bytes_per_sequence, forward_bytes_per_sequence

    spec = resolve_model("llama3.1-70b").spec
    c = _costs("llama3.1-70b")
    fwd = forward_bytes_per_sequence(c, 4096)
    assert fwd == pytest.approx(34 * 4096 * spec.hidden_size + 8 * 4096 * spec.vocab_size)
    assert fwd < activation_bytes_per_sequence(spec, 4096, 2) / 10
    assert forward_bytes_per_sequence(c.model_copy(update={"vocab_size": None}), 4096) is None
