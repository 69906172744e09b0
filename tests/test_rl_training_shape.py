"""Training as RL frameworks batch it: padded passes, token-budget micro-batches, the per-layer launch
cost of an eager pass, and veRL's defaults for the keys a config leaves out."""

from __future__ import annotations

import pytest
import yaml

from throughputlab import roofline as rf
from throughputlab.decide import runconfig
from throughputlab.decide.steptime import RLShape, StepModel
from throughputlab.models import resolve_model
from throughputlab.rlconfig import read_run_config
from throughputlab.roofline import Costs
from throughputlab.throughput import DecodeParams, ThroughputModel, TrainParams


def model(source="analytic") -> ThroughputModel:
    return ThroughputModel(
        source=source, costs=Costs.from_spec(resolve_model("demo").spec, 4),
        decode=DecodeParams(t0_s=2e-3, bw_bytes_per_s=10e9, phi_flops_per_s=80e9),
        train=TrainParams(t0_s=0.01, phi_flops_per_s=50e9, optimizer_step_s=0.2, mem0_bytes=2e9,
                          mem_per_sample_bytes=0.5e9, device_memory_bytes=8e9))


def shape(**train) -> RLShape:
    return RLShape.model_validate(dict(prompt_len=64, response={"dist": "fixed:len=32"}, train=train))


# -- roofline ------------------------------------------------------------------------------------------------
def test_launch_cost_grows_with_layers_and_passes():
    fwd = rf.pass_launch_s(24)
    assert fwd == pytest.approx(2 * rf.pass_launch_s(12))
    # the measured multiples of a plain forward: a forward under FSDP, a training micro-step, the recompute
    assert fwd == pytest.approx(24 * rf.TRAIN_LAYER_LAUNCH_S * rf.FORWARD_HOST_RATIO)
    train = rf.pass_launch_s(24, backward=True)
    assert train == pytest.approx(rf.TRAIN_STEP_HOST_RATIO / rf.FORWARD_HOST_RATIO * fwd) and train > 3 * fwd
    assert rf.pass_launch_s(24, True, "full") == pytest.approx(train * (1 + rf.RECOMPUTE_HOST_RATIO
                                                                        / rf.TRAIN_STEP_HOST_RATIO))
    assert rf.pass_launch_s(24, True, "selective") == rf.pass_launch_s(24, True, "none")
    assert rf.pass_launch_s(None) == 0.0 and rf.pass_launch_s(0, True) == 0.0
    # Megatron-core (no FSDP hooks, fused layers): kernels counted, a backward two forwards, the recompute one
    meg = rf.pass_launch_s(24, fsdp=False)
    assert meg == pytest.approx(24 * rf.TRAIN_LAYER_LAUNCH_S) and meg < fwd
    assert rf.pass_launch_s(24, True, "full", fsdp=False) == pytest.approx((2 + rf.BACKWARD_LAUNCH_RATIO) * meg)


def test_budget_micro_batch_and_padded_length():
    assert rf.budget_micro_batch(8000, 244.0) == 32
    assert rf.budget_micro_batch(100, 244.0) == 1  # a sequence longer than the budget still runs alone
    with pytest.raises(ValueError):
        rf.budget_micro_batch(0, 10.0)
    assert rf.padded_length(512, 256) == 768


# -- the step model --------------------------------------------------------------------------------------------
def test_a_padded_pass_computes_every_sequence_at_the_padded_length():
    m = model()
    packed = StepModel(m, shape(micro_batch=4)).step(8, 2)
    padded = StepModel(m, shape(micro_batch=4, padded_seq_len=512)).step(8, 2)
    assert packed.seq_len_mean == pytest.approx(96.0) and padded.seq_len_mean == 512
    assert padded.train_s > 4 * packed.train_s and padded.logprob_s > 4 * packed.logprob_s
    # a pad length below the real sequences changes nothing
    assert StepModel(m, shape(micro_batch=4, padded_seq_len=50)).step(8, 2).train_s == pytest.approx(packed.train_s)


def test_a_token_budget_sets_the_micro_batch_from_this_steps_lengths():
    m = model()
    st = StepModel(m, shape(token_budget=400, logprob_token_budget=1000)).step(10, 4)  # 40 sequences of 96
    assert st.micro_batch == 4  # 400 // 96
    fixed = StepModel(m, shape(micro_batch=4, logprob_micro_batch=10)).step(10, 4)
    assert st.train_s == pytest.approx(fixed.train_s) and st.logprob_s == pytest.approx(fixed.logprob_s)


def test_a_token_budget_counts_the_real_tokens_of_a_padded_pass():
    # veRL's dynamic batching splits by the attention mask: 960 tokens hold 10 sequences of 96 real tokens,
    # each computed at the padded 512
    st = StepModel(model(), shape(token_budget=960, padded_seq_len=512)).step(8, 2)
    assert st.seq_len_mean == 512 and st.real_len_mean == pytest.approx(96.0) and st.micro_batch == 10
    packed = StepModel(model(), shape(token_budget=960)).step(8, 2)
    assert packed.micro_batch == 10 and st.train_s > 4 * packed.train_s


def test_launches_are_paid_per_micro_batch_by_analytic_profiles_only():
    one, many = (StepModel(model(), shape(micro_batch=mb)).step(8, 2) for mb in (12, 1))
    f_one, f_many = (StepModel(model("fit"), shape(micro_batch=mb)).step(8, 2) for mb in (12, 1))
    launch = model().costs.num_layers * rf.TRAIN_LAYER_LAUNCH_S * rf.TRAIN_STEP_HOST_RATIO  # FSDP: measured
    # 16 sequences: 2 micro-batches of 12 against 16 of 1; a fitted profile's intercept holds its launches
    assert (many.train_s - one.train_s) - (f_many.train_s - f_one.train_s) == pytest.approx(14 * launch)
    ck = StepModel(model(), shape(micro_batch=1, activation_checkpointing=True)).step(8, 2)
    assert ck.train_s > many.train_s


# -- veRL's defaults and decide's reading -------------------------------------------------------------------
def _verl(tmp_path, **model_keys) -> str:
    tree = {"data": {"train_batch_size": 64, "max_prompt_length": 512, "max_response_length": 256},
            "actor_rollout_ref": {"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct", **model_keys},
                                  "actor": {"strategy": "fsdp", "ppo_mini_batch_size": 16,
                                            "ppo_micro_batch_size_per_gpu": 4},
                                  "rollout": {"n": 2, "tensor_model_parallel_size": 1}},
            "trainer": {"n_gpus_per_node": 8, "nnodes": 1}}
    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump(tree))
    return str(path)


def test_verl_keys_left_out_take_verls_defaults(tmp_path):
    rc = read_run_config(_verl(tmp_path))
    assert rc.activation_checkpointing == "full" and rc.remove_padding is False
    assert "default" in rc.knob("actor_rollout_ref.model.enable_gradient_checkpointing").note
    stated = read_run_config(_verl(tmp_path, enable_gradient_checkpointing=False, use_remove_padding=True))
    assert stated.activation_checkpointing == "none" and stated.remove_padding is True


def test_decide_reads_padding_and_token_budgets_from_a_verl_config(tmp_path):
    data, used, missing = runconfig.decide_data(read_run_config(_verl(tmp_path)))
    assert data["shape"]["train"]["padded_seq_len"] == 512 + 256
    assert data["shape"]["train"]["activation_checkpointing"] is True
    assert not any("remove_padding" in m for m in missing)
    packed, _, _ = runconfig.decide_data(read_run_config(_verl(tmp_path, use_remove_padding=True), (
        "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8000")))
    assert "padded_seq_len" not in packed["shape"]["train"]
    assert packed["shape"]["train"]["token_budget"] == 8000 and "micro_batch" not in packed["shape"]["train"]


def test_a_critic_without_remove_padding_is_padded_while_the_actor_packs(tmp_path):
    # veRL PPO: the actor packs its sequences, the critic (critic.model.use_remove_padding, default False) pads
    ppo = ("algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=4")
    rc = read_run_config(_verl(tmp_path, use_remove_padding=True), ppo)
    assert rc.remove_padding is True and rc.critic_remove_padding is False
    assert "veRL's default False" in rc.knob("critic.model.use_remove_padding").note
    data, _, _ = runconfig.decide_data(rc)
    assert "padded_seq_len" not in data["shape"]["train"] and data["shape"]["critic"]["padded_seq_len"] == 512 + 256
    both, _, _ = runconfig.decide_data(read_run_config(_verl(tmp_path, use_remove_padding=True),
                                                       (*ppo, "critic.model.use_remove_padding=True")))
    assert "padded_seq_len" not in both["shape"].get("critic", {})
    # the step: the critic's passes at the padded length, the actor's at the real one
    base = dict(prompt_len=64, response={"dist": "fixed:len=32"}, algo="ppo", train=dict(micro_batch=4))
    packed = StepModel(model(), RLShape.model_validate(base)).step(8, 2)
    padded = StepModel(model(), RLShape.model_validate({**base, "critic": {"padded_seq_len": 512}})).step(8, 2)
    assert padded.train_s == pytest.approx(packed.train_s) and padded.critic_s > 4 * packed.critic_s
    # a critic packed where the policy pads (0) is computed at the real length
    pol = dict(micro_batch=4, padded_seq_len=512)
    own = StepModel(model(), RLShape.model_validate({**base, "train": pol, "critic": {"padded_seq_len": 0}})).step(8, 2)
    same = StepModel(model(), RLShape.model_validate({**base, "train": pol})).step(8, 2)
    assert own.critic_s == pytest.approx(packed.critic_s) and same.critic_s > 4 * own.critic_s


def test_split_training_devices_span_the_fewest_whole_nodes():
    from throughputlab.decide.cluster import Placement

    def nodes(kind, gpus, gen, nodes):
        return Placement(kind=kind, gpus=gpus, gen_gpus=gen, train_gpus=gpus - gen if kind == "split" else gpus,
                         tp=1, nodes=nodes).train_nodes
    assert nodes("split", 16, 8, 2) == 1  # 8 + 8 on two nodes of 8: FSDP on one node's links
    assert nodes("split", 32, 16, 4) == 2
    assert nodes("split", 16, 4, 2) == 2  # 12 training devices need both nodes
    assert nodes("colocated", 16, 16, 2) == 2


# -- Ulysses sequence parallelism ---------------------------------------------------------------------------
def test_ulysses_all_to_alls_by_hand():
    c = Costs.from_spec(resolve_model("qwen2.5-7b").spec, 2)
    kv = c.kv_bytes_per_token / c.num_layers  # K and V of a token in a layer, 16-bit
    # 4,096 tokens per GPU over 4 GPUs: 3/4 of q, k, v and the output leave each GPU, four all-to-alls a layer
    one = c.num_layers * (4096 * (2 * c.hidden_size * 2 + kv) * 0.75 / 300e9 + 4 * 20e-6)
    assert rf.ulysses_comm_s(c, 4096, 4, 300e9, 20e-6) == pytest.approx(one)
    assert rf.ulysses_comm_s(c, 4096, 4, 300e9, 20e-6, passes=3) == pytest.approx(3 * one)
    assert rf.ulysses_comm_s(c, 4096, 1, 300e9, 20e-6) == 0.0


@pytest.fixture(scope="module")
def h100_profile(tmp_path_factory):
    from throughputlab.predict import Layout, predict_analytic
    path = tmp_path_factory.mktemp("sp") / "qwen7b.json"
    predict_analytic(resolve_model("qwen2.5-7b").spec, "h100", layout=Layout(gpus=8)).save(path)
    return str(path)


def _sp_step(profile: str, sp: int, response: str, budget=16384):
    from throughputlab.decide.calculator import DecideSpec, decide_from_spec
    budgets = {"token_budget": budget, "logprob_token_budget": budget} if budget else {}
    shape = {"prompt_len": 512, "response": {"dist": response}, "algo": "grpo",
             "train": {"sequence_parallel": sp, "activation_checkpointing": True, "mini_batch_samples": 128,
                       **budgets}}
    spec = DecideSpec.model_validate({"profile": profile, "prompts": [32], "group": 8, "shape": shape,
                                      "cluster": {"gpus": 8, "engine_tp": 1}})
    d = decide_from_spec(spec)[0]
    assert (f"Ulysses sequence parallelism over groups of {sp} GPUs" in " ".join(d.notes)) == (sp > 1)
    return next(r.step for r in d.rows if r.prompts == 32)


def test_ulysses_keeps_the_compute_per_gpu_and_adds_its_all_to_alls(h100_profile):
    one, four = (_sp_step(h100_profile, sp, "fixed:len=3584") for sp in (1, 4))
    # the token budget is per GPU: a group of 4 fills micro-batches of 4 x 16,384 tokens and shares each
    assert four.micro_batch == 4 * one.micro_batch
    # the same micro-steps per GPU, each with its all-to-alls: a little slower, never faster
    assert one.train_s < four.train_s < 1.15 * one.train_s
    assert one.logprob_s < four.logprob_s < 1.15 * one.logprob_s


def test_ulysses_splits_a_sequence_s_activations(h100_profile):
    # 64K-token sequences: the micro-batch is the largest that fits; none does on one GPU, split 8 ways one does
    from throughputlab.errors import UserError
    with pytest.raises(UserError, match="not even one sequence fits"):
        _sp_step(h100_profile, 1, "fixed:len=65024", budget=None)
    st = _sp_step(h100_profile, 8, "fixed:len=65024", budget=None)
    assert st.micro_batch >= 1 and st.train_s > 0
    with pytest.raises(UserError, match="sequence_parallel 3 does not divide the 8 training GPU"):
        _sp_step(h100_profile, 3, "fixed:len=3584")


def test_decide_reads_ulysses_from_a_verl_config(tmp_path):
    rc = read_run_config(_verl(tmp_path, use_remove_padding=True),
                         ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",))
    data, used, missing = runconfig.decide_data(rc)
    assert data["shape"]["train"]["sequence_parallel"] == 2
    assert not any("sequence parallelism" in m or "context parallelism" in m for m in missing)
    assert any("Ulysses" in line for line in used)


def test_the_rl_loss_pays_its_pass_over_the_vocabulary():
    # 50 bytes a logit with the backward, 14 in a forward, at the memory bandwidth; split over shards
    assert rf.rl_logits_s(1000, 150_000, 3e12, backward=True) == pytest.approx(1000 * 150_000 * 50 / 3e12)
    assert rf.rl_logits_s(1000, 150_000, 3e12) == pytest.approx(1000 * 150_000 * 14 / 3e12)
    assert rf.rl_logits_s(1000, 150_000, 3e12, True, shards=4) == pytest.approx(rf.rl_logits_s(1000, 150_000, 3e12,
                                                                                              True) / 4)
    assert rf.rl_logits_s(1000, None, 3e12) == 0.0 and rf.rl_logits_s(1000, 150_000, None) == 0.0
    # a small model with a large vocabulary pays a large share (Qwen2.5-0.5B on an H100: about a third of a
    # micro-step's compute), a 7B a small one
    from throughputlab.predict import analytic_model
    for name, lo, hi in (("qwen2.5-0.5b", 0.2, 0.6), ("qwen2.5-7b", 0.005, 0.05)):
        m, _, _ = analytic_model(resolve_model(name).spec, "h100")
        extra = rf.rl_logits_s(4096, m.costs.vocab_size, m.decode.bw_bytes_per_s, True)
        assert lo < extra / float(m.train_step_s(4, 1024)) < hi, name


def test_a_critic_s_value_head_has_no_logits_pass():
    from throughputlab.roofline import rl as rf_rl
    base = dict(prompt_len=64, response={"dist": "fixed:len=32"}, train=dict(micro_batch=4))
    ppo = StepModel(model(), RLShape.model_validate({**base, "algo": "ppo"}))
    st = ppo.step(8, 2)
    # the critic is the policy less its output projection over the vocabulary: its value pass is a log-prob pass
    # without the RL loss's logits pass, at the value model's FLOPs
    per_pass = st.logprob_s / 2  # old policy and reference
    critic = model().model_copy(update={"costs": rf_rl.value_model_costs(model().costs)})
    logits = rf.rl_logits_s(16 * 96, model().costs.vocab_size, model().decode.bw_bytes_per_s)
    flops_saved = sum(float(m.forward_s(4, 96.0)) for m in (model(),)) - float(critic.forward_s(4, 96.0))
    assert flops_saved > 0
    assert ppo.critic_forward_s(16, 96.0) == pytest.approx(per_pass - logits - 4 * flops_saved)


# -- Megatron context parallelism ---------------------------------------------------------------------------
def test_context_parallel_key_value_ring_by_hand():
    from throughputlab.roofline import rl as rf_rl
    c = Costs.from_spec(resolve_model("qwen2.5-7b").spec, 2)
    kv = c.kv_bytes_per_token / c.num_layers  # K and V of a token in a layer, 16-bit
    # 8,192 tokens over CP 4 at TP 2: each GPU sends 3/4 of the tokens' K and V (its TP half) per layer
    fwd = c.num_layers * (8192 * kv / 2 * 0.75 / 300e9 + 3 * 20e-6)
    assert rf_rl.context_parallel_comm_s(c, 8192, 4, 2, 300e9, 20e-6) == pytest.approx(fwd)
    assert rf_rl.context_parallel_comm_s(c, 8192, 4, 2, 300e9, 20e-6, backward=True) == pytest.approx(3 * fwd)
    assert rf_rl.context_parallel_comm_s(c, 8192, 4, 2, 300e9, 20e-6, True, "full") == pytest.approx(4 * fwd)
    assert rf_rl.context_parallel_comm_s(c, 8192, 1, 2, 300e9) == 0.0


def _megatron_step(profile: str, cp: int, response: str):
    from throughputlab.decide.calculator import DecideSpec, decide_from_spec
    shape = {"prompt_len": 512, "response": {"dist": response}, "algo": "grpo",
             "train": {"backend": "megatron", "tp": 2, "pp": 1, "sequence_parallel": cp,
                       "activation_checkpointing": True, "mini_batch_samples": 128}}
    spec = DecideSpec.model_validate({"profile": profile, "prompts": [32], "group": 8, "shape": shape,
                                      "cluster": {"gpus": 8, "engine_tp": 1}})
    d = decide_from_spec(spec)[0]
    return d, next(r.step for r in d.rows if r.prompts == 32)


def test_megatron_context_parallelism_splits_each_sequence_over_a_replica(h100_profile):
    from throughputlab.errors import UserError
    d1, one = _megatron_step(h100_profile, 1, "fixed:len=3584")
    d2, two = _megatron_step(h100_profile, 2, "fixed:len=3584")
    assert "TP 2 x PP 1 x CP 2" in " ".join(d2.notes) and "4 data-parallel replica(s)" not in " ".join(d2.notes)
    # the compute per GPU is the same; CP adds its key-value exchanges: a little slower, never faster
    assert one.train_s < two.train_s < 1.15 * one.train_s
    # 128K-token sequences fit a CP-4 replica's GPUs where they fit no TP-2 one (activations 1/cp, the optimizer
    # sharded over data-parallel x CP ranks)
    with pytest.raises(UserError, match="not even one sequence fits"):
        _megatron_step(h100_profile, 1, "fixed:len=130560")
    assert _megatron_step(h100_profile, 4, "fixed:len=130560")[1].micro_batch >= 1
    with pytest.raises(UserError, match="context parallel 3 does not divide the 8 training GPU"):
        _megatron_step(h100_profile, 3, "fixed:len=3584")


def test_decide_takes_sequence_parallelism_as_a_flag(h100_profile):
    from conftest import run_main
    ok = run_main("decide", "--profile", h100_profile, "--prompts", "32", "--sequence-parallel", "2")
    assert ok.exit_code == 0, ok.output
    assert "Ulysses sequence parallelism over groups of 2 GPUs (4 data-parallel groups)" in ok.output
    for bad in ("0", "3"):
        r = run_main("decide", "--profile", h100_profile, "--prompts", "32", "--sequence-parallel", bad)
        lines = [line for line in r.output.splitlines() if line.strip()]
        assert r.exit_code == 2 and len(lines) == 1 and "sequence" in lines[0], r.output


def test_a_value_model_has_no_output_projection_over_the_vocabulary():
    from throughputlab.roofline import rl as rf_rl
    c = Costs.from_spec(resolve_model("qwen2.5-0.5b").spec, 2)
    v = rf_rl.value_model_costs(c)
    assert c.flops_per_token - v.flops_per_token == pytest.approx(2 * c.hidden_size * (c.vocab_size - 1))
    assert 0.2 < 1 - v.flops_per_token / c.flops_per_token < 0.35  # a quarter of a 0.5B's FLOPs
    assert v.total_weight_bytes == c.total_weight_bytes and v.kv_bytes_per_token == c.kv_bytes_per_token
    seven = Costs.from_spec(resolve_model("qwen2.5-7b").spec, 2)
    assert 0.05 < 1 - rf_rl.value_model_costs(seven).flops_per_token / seven.flops_per_token < 0.1
