"""The cluster decision: engines drain their own share, placements, GRPO prefix sharing at the
cluster's scale, the KV budget of the run, weight sync, and bad cluster input."""

from __future__ import annotations

import json

import pytest

from conftest import assert_user_error, run_cli
from throughputlab import roofline as rf
from throughputlab.decide.calculator import DecideSpec, decide_from_spec
from throughputlab.decide.cluster import ClusterSpec, placements, split_over_engines
from throughputlab.fit import load_model
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, predict_analytic
from throughputlab.roofline import rl as rf_rl

SHAPE = {"prompt_len": 1024, "response": {"dist": "lognormal:mean=2048,sigma=0.8,max=8192"}}


def _decide(profile, prompts, **kw):
    spec = DecideSpec.model_validate({"profile": profile, "prompts": prompts, "group": 8, "shape": SHAPE, **kw})
    return decide_from_spec(spec)


def test_engines_drain_their_own_share_and_the_step_waits_for_the_slowest(q7_8xh100):
    d = _decide(q7_8xh100, [128, 1024])[0]
    small, large = d.rows
    assert small.step.engines == 8 and small.step.engine_prompts == [16] * 8
    assert large.step.engine_prompts == [128] * 8
    assert small.step.gen_s >= small.step.gen_engine_mean_s  # the slowest replica sets the rollout
    gain = (large.responses if hasattr(large, "responses") else 1024 * 8) / large.step.gen_s / (128 * 8 / small.step.gen_s)
    assert 1.6 < gain < 2.8  # about 2x; one engine holding all 8,192 requests gave about 1.1x
    assert "8 engines x TP 1" in d.placement and small.step.prefix_sharing
    assert split_over_engines(10, 4) == [3, 3, 2, 2] and split_over_engines(2, 4) == [1, 1]


def test_prefix_sharing_makes_the_grpo_rollout_faster(q7_8xh100):
    shared = _decide(q7_8xh100, [1024])[0].rows[0].step.gen_s
    apart = _decide(q7_8xh100, [1024], shape={**SHAPE, "prefix_sharing": False})[0].rows[0].step.gen_s
    assert apart > 1.1 * shared


def test_kv_budget_follows_gpu_memory_utilization(q7_8xh100):
    model = load_model(__import__("throughputlab.records.profile", fromlist=["Profile"]).Profile.load(q7_8xh100))
    from throughputlab.decide.cluster import generation_model

    pl = placements(model, ClusterSpec())[0]
    low = generation_model(model, pl, ClusterSpec(gpu_memory_utilization=0.4)).kv_cache_tokens
    default = generation_model(model, pl, ClusterSpec()).kv_cache_tokens  # colocated: 0.5
    high = generation_model(model, pl, ClusterSpec(gpu_memory_utilization=0.9)).kv_cache_tokens
    assert low < default < high
    # the engine's own rule, as predict sizes it: at 0.5 the same tokens as predict --gpu-memory-utilization 0.5
    from throughputlab.predict_engine import size_kv

    mem = model.train.device_memory_bytes  # the datasheet row's memory as nvidia-smi reports it (81,559 MiB)
    half = model.engine.model_copy(update={"memory_fraction": 0.5})
    assert default == size_kv(half, model.costs, pl.tp, mem)[1]
    # below the bare share minus the weights: the profile run's activations, CUDA graphs and non-torch memory
    w = model.costs.total_weight_bytes
    assert default < int((0.5 * (mem - rf.CUDA_UNEXPOSED_BYTES) - w) / model.costs.kv_bytes_per_token)


def test_the_rl_shapes_engine_settings_reach_a_predicted_engine(q7_8xh100):
    from throughputlab.decide.cluster import generation_model
    from throughputlab.decide.steptime import EngineShape
    from throughputlab.records.profile import Profile

    model = load_model(Profile.load(q7_8xh100))
    pl = placements(model, ClusterSpec())[0]
    base = generation_model(model, pl, ClusterSpec())
    eager = generation_model(model, pl, ClusterSpec(), EngineShape(enforce_eager=True, max_num_seqs=64))
    launches = model.costs.num_layers * rf.EAGER_LAYER_S["vllm"]  # the host's, bounding the step (max, not sum)
    assert eager.decode.t0_s == pytest.approx(base.decode.t0_s) and eager.eager_host_s == pytest.approx(launches)
    assert eager.decode_step_s(1, 100) == pytest.approx(max(launches, base.decode_step_s(1, 100)))
    assert eager.max_num_seqs == 64 and eager.engine.enforce_eager
    sized = generation_model(model, pl, ClusterSpec(), EngineShape(kv_cache_gib=10.0))
    assert sized.kv_cache_tokens == rf.kv_cache_tokens_of(10 * rf.GIB, rf.tp_shard(model.costs, pl.tp), 16)
    slow = _decide(q7_8xh100, [128], shape={**SHAPE, "engine": {"enforce_eager": True}})[0].rows[0].step
    fast = _decide(q7_8xh100, [128])[0].rows[0].step
    assert slow.gen_s > fast.gen_s and slow.train_s == pytest.approx(fast.train_s)


@pytest.mark.slow
def test_eager_mode_is_refused_on_a_measured_engine(tmp_path):
    from tests._synth import make_profile

    path = tmp_path / "m.json"
    make_profile().save(path)
    assert_user_error(run_cli("decide", "--profile", str(path), "--prompts", "2", "--enforce-eager"),
                      "measured as it ran")


def test_colocated_sync_reshards_and_sleeps_split_sync_crosses_the_link(q7_8xh100):
    colo = _decide(q7_8xh100, [128])[0].rows[0].step
    split = _decide(q7_8xh100, [128], cluster={"placement": "split", "gen_gpus": 4})[0].rows[0].step
    assert colo.sync_s > rf_rl.sleep_wake_s(1e9, 1)  # the engines' sleep and wake on GPUs (15 GB a GPU at level 1)
    assert 0 < split.sync_s < colo.sync_s
    assert split.overlap == "off-policy" and split.step_s == pytest.approx(
        max(split.gen_s, split.logprob_s + split.train_s) + split.sync_s)
    assert set(split.idle_share) == {"generation devices", "training devices"}


def test_a_pipelined_sync_takes_the_longer_of_gather_and_send_and_moves_16_bit_weights(q7_8xh100):
    from throughputlab.decide.cluster import Placement, sync_s
    from throughputlab.records.profile import Profile

    model = load_model(Profile.load(q7_8xh100))
    pl = Placement(kind="split", gpus=16, gen_gpus=8, train_gpus=8, tp=1, nodes=2)
    spec = ClusterSpec(gpus=16, nodes=2)
    serial, piped = (sync_s(model, pl, spec, None, 0.0, False, p) for p in (False, True))
    move = rf.transfer_s(rf.sync_weight_bytes(model.costs), 2e10)  # the send, at a rate sync_s is given
    sent, sent_piped = (sync_s(model, pl, spec, 2e10, 0.0, False, p) for p in (False, True))
    gather = sent - move  # gathering from 8 FSDP shards, then the send
    assert 0 < gather < move and sent_piped == pytest.approx(move) and sent == pytest.approx(move + gather)
    assert 0 < piped < serial <= 2 * piped
    # the trainer's 16-bit weights cross, whatever the engine's dtype: an FP8 engine quantizes them as it loads
    c16 = rf.Costs.from_spec(resolve_model("llama3.1-8b").spec, 2)
    c8 = rf.Costs.from_spec(resolve_model("llama3.1-8b").spec, 1)
    assert rf.sync_weight_bytes(c16) == rf.all_weight_bytes(c16) == pytest.approx(2 * c8.total_params)
    assert rf.sync_weight_bytes(c8) == pytest.approx(rf.sync_weight_bytes(c16))
    assert rf.sync_weight_bytes(c8) > rf.all_weight_bytes(c8)


@pytest.mark.slow
def test_placement_search_ranks_colocated_against_splits(q7_8xh100, tmp_path):
    out = tmp_path / "d.json"
    r = run_cli("decide", "--profile", q7_8xh100, "--prompts", "128,1024", "--group", "8", "--prompt-len", "1024",
                "--response-dist", "lognormal:mean=2048,sigma=0.8,max=8192", "--placement", "search",
                "--engine-tp", "1", "--json", str(out), "--html", str(tmp_path / "d.html"))
    assert r.returncode == 0, r.stderr
    assert "placements, best first" in r.stdout and "colocated on 8 GPUs" in r.stdout
    for split in ("split 2+6", "split 4+4"):
        assert split in r.stdout
    # with 2 training GPUs the 7B model's training state does not fit: said, not dropped silently
    assert "placement split 6+2: 6 engines x TP 1 generate, FSDP over 2 train left out: not even one sequence" \
        in r.stdout
    assert "generation devices idle" in r.stdout and "training devices idle" in r.stdout
    data = json.loads(out.read_text())
    listed = [x for x in r.stdout.splitlines() if x.startswith("  colocated") or x.startswith("  split")]
    assert len(data["placements"]) == len(listed) >= 4
    assert "Placements" in (tmp_path / "d.html").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("args,fragment", [
    (["--engine-tp", "16"], "--engine-tp 16 is larger than the 8 gpu(s) of a node"),
    (["--placement", "split", "--gen-gpus", "8"], "a split needs at least one generating and one training gpu"),
    (["--nodes", "3"], "--nodes 3 does not divide --gpus 8"),
    (["--engine-tp", "3"], "--engine-tp 3 does not divide --gpus 8"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be in (0, 1]"),
    (["--seed", "-1"], "must be a non-negative integer, got -1"),
    (["--gen-gpus", "2"], "gen_gpus (--gen-gpus) goes with --placement split"),
    (["--baseline", "0"], "baseline: must be a positive number of prompts, got 0"),
    (["--overlap", "off-policy"], "needs separate devices, and the profile's 8 GPUs are one colocated cluster"),
    (["--lr-ref", "-1"], "lr.ref: must be a positive number, got -1.0"),
    (["--gpus", "0"], "--gpus"),
    (["--max-num-seqs", "0"], "shape.engine.max_num_seqs: Input should be greater than 0"),
    (["--max-model-len", "0"], "shape.engine.max_model_len: Input should be greater than 0"),
    (["--max-num-batched-tokens", "-5"], "shape.engine.max_num_batched_tokens: Input should be greater than 0"),
    (["--kv-cache-gib", "0"], "shape.engine.kv_cache_gib: Input should be greater than 0"),
])
def test_bad_cluster_input_gets_one_line_errors(q7_8xh100, args, fragment):
    assert_user_error(run_cli("decide", "--profile", q7_8xh100, "--prompts", "64", *args), fragment)


@pytest.mark.slow
def test_a_model_that_fits_no_placement_is_refused(tmp_path):
    path = tmp_path / "big.json"
    predict_analytic(resolve_model("qwen2.5-72b").spec, "l4").save(path)
    assert_user_error(run_cli("decide", "--profile", str(path), "--prompts", "64"), "fits no colocated placement")


def test_responses_past_the_models_length_are_said(tmp_path):
    demo = resolve_model("demo").spec
    path = tmp_path / "demo.json"
    predict_analytic(demo, "h100").save(path)
    limit = demo.max_position_embeddings

    def notes(response_len):
        spec = DecideSpec.model_validate({"profile": str(path), "prompts": [16], "group": 4, "shape": {
            "prompt_len": 512, "response": {"dist": f"fixed:len={response_len}"}}})
        return " ".join(decide_from_spec(spec)[0].notes)

    assert "max_position_embeddings" not in notes(limit - 512)
    assert f"prompt 512 + longest response {limit} = {limit + 512} tokens is past demo's " \
           f"max_position_embeddings ({limit})" in notes(limit)


def test_batches_the_kv_cache_held_back_are_named_with_their_preemptions(q7_8xh100):
    tight = _decide(q7_8xh100, [64, 1024], cluster={"gpu_memory_utilization": 0.3})[0]
    rows = {r.prompts: r.step.rollout for r in tight.rows}
    assert rows[1024].kv_limited and not rows[64].kv_limited
    note = next(n for n in tight.notes if n.startswith("the KV cache limited admission"))
    assert f"at 1024 prompts ({rows[1024].preemptions} preemptions)" in note and "64 prompts" not in note
    assert not any(n.startswith("the KV cache limited") for n in _decide(q7_8xh100, [64])[0].notes)


def test_the_links_follow_the_decisions_nodes_not_the_profiles(tmp_path):
    spec = resolve_model("qwen2.5-7b").spec
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    predict_analytic(spec, "h100", layout=Layout(gpus=8)).save(one)
    predict_analytic(spec, "h100", layout=Layout(gpus=16, nodes=2)).save(two)
    cluster = {"gpus": 16, "nodes": 2}
    a = _decide(str(one), [128], cluster=cluster)[0]
    b = _decide(str(two), [128], cluster=cluster)[0]
    assert a.rows[0].step.step_s == pytest.approx(b.rows[0].step.step_s, rel=1e-9)
    assert any("predicted for 8 GPU(s) on 1 node(s)" in n and "follow the decision" in n for n in a.notes)
    assert not any("predicted for" in n for n in b.notes)
    # a decision on one node says its FSDP ring stays on the node's link
    local = _decide(str(two), [128], cluster={"gpus": 8, "nodes": 1})[0]
    assert any("within one node" in n for n in local.notes)
