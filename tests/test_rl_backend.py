"""The training backend: Megatron keeps weights resident (no FSDP all-gather per micro-batch), pays its TP
all-reduces, the pipeline bubble and the distributed optimizer's traffic; the config's backend reaches the
shape and the output says which backend was assumed. Engine TP across nodes at the network's rate."""

from __future__ import annotations

import pytest
import yaml

from throughputlab.decide import runconfig
from throughputlab.decide.calculator import DecideSpec, decide_from_spec
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, predict_analytic
from throughputlab.rlconfig import read_run_config
from throughputlab.roofline import Costs
from throughputlab.roofline import rl as rfl

SHAPE = {"prompt_len": 256, "response": {"dist": "lognormal:mean=512,sigma=0.6,max=1024"},
         "train": {"micro_batch": 2, "mini_batches": 2}}


@pytest.fixture(scope="module")
def q7_16(tmp_path_factory):
    path = tmp_path_factory.mktemp("backend") / "q7.json"
    predict_analytic(resolve_model("qwen2.5-7b").spec, "h100", layout=Layout(gpus=16, nodes=2)).save(path)
    return str(path)


def _step(profile, train=None, cluster=None):
    shape = {**SHAPE, "train": {**SHAPE["train"], **(train or {})}}
    spec = DecideSpec.model_validate({"profile": profile, "prompts": [64], "group": 8, "shape": shape,
                                      "cluster": {"gpus": 16, "nodes": 2, **(cluster or {})}})
    d = decide_from_spec(spec)[0]
    return d.rows[0].step, d.notes


def test_roofline_terms():
    c = Costs.from_spec(resolve_model("qwen2.5-7b").spec, 2)
    fwd = rfl.megatron_tp_comm_s(c, 4096, 4, 300e9, 10e-6)
    assert rfl.megatron_tp_comm_s(c, 4096, 1, 300e9) == 0.0
    assert rfl.megatron_tp_comm_s(c, 4096, 4, 300e9, 10e-6, backward=True) == pytest.approx(2 * fwd)
    assert rfl.megatron_tp_comm_s(c, 4096, 4, 300e9, 10e-6, True, "full") == pytest.approx(3 * fwd)
    assert rfl.pipeline_bubble(4, 12) == pytest.approx(0.25) and rfl.pipeline_bubble(1, 3) == 0.0
    # a rank's shard of the distributed optimizer shrinks with TP x PP
    assert rfl.megatron_dp_sync_s(c, 4, 4, 50e9) == pytest.approx(rfl.megatron_dp_sync_s(c, 1, 4, 50e9) / 4)
    assert rfl.megatron_dp_sync_s(c, 1, 1, 50e9) == 0.0
    # EP: two all-to-alls per MoE layer of each token's top-k hidden states; none for a dense model
    moe = Costs.from_spec(resolve_model("qwen3-30b-a3b").spec, 2)
    assert rfl.megatron_ep_comm_s(c, 4096, 8, 300e9) == 0.0 and rfl.megatron_ep_comm_s(moe, 4096, 1, 300e9) == 0.0
    one = rfl.megatron_ep_comm_s(moe, 4096, 8, 300e9)
    assert one == pytest.approx(2 * moe.moe_layers * 4096 * moe.moe_top_k * moe.hidden_size * 2 * 7 / 8 / 300e9)
    assert rfl.megatron_ep_comm_s(moe, 4096, 8, 300e9, backward=True) == pytest.approx(2 * one)
    bw, alpha, crosses = rfl.cross_node_tp_link(300e9, 17e-6, 16, 8, 40e9, rfl.INTER_NODE_ALPHA_S)
    assert crosses and bw == 40e9 and alpha == rfl.INTER_NODE_ALPHA_S
    assert rfl.cross_node_tp_link(300e9, 17e-6, 8, 8, 40e9, 20e-6) == (300e9, 17e-6, False)
    # a micro-batch: compute split over TP x PP, one stage's share of the launches and collectives
    assert rfl.megatron_microbatch_s(8.0, 2, 4, 0.4, 0.8) == pytest.approx(8.0 / 8 + 1.2 / 4)
    # a mini-batch: the 1F1B bubble on its passes plus the optimizer's traffic not hidden
    assert rfl.megatron_minibatch_extra_s(10.0, 4, 12, 2.0, 0.75) == pytest.approx(0.25 * 10.0 + 0.5)
    assert rfl.megatron_minibatch_extra_s(10.0, 1, 12, 0.0, 1.0) == 0.0


def test_megatron_drops_fsdps_all_gathers_and_says_so(q7_16):
    fsdp, fnotes = _step(q7_16)
    meg, mnotes = _step(q7_16, {"backend": "megatron"})
    # across two nodes FSDP's gathers are exposed; a resident-weight layout does not pay them
    assert meg.train_s < fsdp.train_s and meg.logprob_s < fsdp.logprob_s
    assert any(n.startswith("training backend: FSDP") for n in fnotes)
    assert any(n.startswith("training backend: Megatron") and "approximation" in n for n in mnotes)
    # TP adds its all-reduces, PP its bubble
    tp, _ = _step(q7_16, {"backend": "megatron", "tp": 4})
    pp, _ = _step(q7_16, {"backend": "megatron", "pp": 4})
    assert tp.train_s > meg.train_s and pp.train_s > meg.train_s
    assert meg.train_devices == 16


def test_the_configs_backend_reaches_the_shape(tmp_path):
    cfg = {"grpo": {"num_prompts_per_step": 8, "num_generations_per_prompt": 4},
           "policy": {"train_global_batch_size": 32, "dtensor_cfg": {"enabled": False},
                      "megatron_cfg": {"enabled": True, "tensor_model_parallel_size": 2,
                                       "pipeline_model_parallel_size": 2, "expert_model_parallel_size": 4}}}
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(cfg))
    data, used, missing = runconfig.decide_data(read_run_config(str(p)))
    t = data["shape"]["train"]
    assert (t["backend"], t["tp"], t["pp"], t["ep"]) == ("megatron", 2, 2, 4)
    assert not any("Megatron" in m or "predicted as FSDP" in m for m in missing)


def test_engine_tp_across_nodes_is_priced_at_the_network(q7_16):
    within, _ = _step(q7_16, cluster={"engine_tp": 8})
    across, notes = _step(q7_16, cluster={"engine_tp": 16})
    assert across.engines == 1 and within.engines == 2
    assert any("across nodes" in n and "TP 16" in n for n in notes)
    # one engine on twice the GPUs, its all-reduces over the network: not twice as fast
    assert across.gen_s > 0.5 * within.gen_s


def test_verl_megatron_without_a_strategy_and_the_rollout_tp_default(tmp_path):
    cfg = {"actor_rollout_ref": {"rollout": {"n": 4, "name": "vllm"},
                                 "actor": {"ppo_mini_batch_size": 8,
                                           "megatron": {"tensor_model_parallel_size": 4,
                                                        "pipeline_model_parallel_size": 2}}},
           "data": {"train_batch_size": 8}}
    p = tmp_path / "v.yaml"
    p.write_text(yaml.safe_dump(cfg))
    rc = read_run_config(str(p), framework="verl")
    assert rc.train_strategy == "megatron" and rc.rollout_tp == 2  # rollout.yaml's tensor_model_parallel_size
    assert "veRL's default 2" in rc.knob("actor_rollout_ref.rollout.tensor_model_parallel_size").note
    data, _, _ = runconfig.decide_data(rc)
    assert data["shape"]["train"]["backend"] == "megatron" and data["cluster"]["engine_tp"] == 2
    cfg["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"] = 8
    p.write_text(yaml.safe_dump(cfg))
    assert read_run_config(str(p), framework="verl").rollout_tp == 8
