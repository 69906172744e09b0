"""Host time the frameworks' rollouts add (per-token log-probs in the caller's process, the Ray executor) and how they sync
weights; per-token log-probs returned by an engine in the caller's process (RL rollouts): more host time per running
sequence a decode step, where the engine pays its host time in the step (vLLM without async scheduling)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import refused, run_main
from throughputlab import roofline as rf
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, analytic_model, predict_analytic
from throughputlab.predict_engine import EngineOptions

pytestmark = pytest.mark.quick
DATA = Path(__file__).parent / "data" / "rlconfig"
NEMO = DATA / "nemo" / "recipes" / "llm"


def test_log_probs_add_their_share_of_the_host_time_only_where_it_is_paid():
    sync = rf.SYNC_HOST_PER_SEQ_S
    assert rf.sync_host_per_seq_s("vllm", "0.10.0", logprobs="off") == sync
    ids = rf.sync_host_per_seq_s("vllm", "0.10.0", logprobs="ids")
    text = rf.sync_host_per_seq_s("vllm", "0.10.0", logprobs="text")
    assert ids == pytest.approx(sync * rf.LOGPROBS_HOST_RATIO["ids"]) and text > ids > sync
    # async scheduling (vLLM 0.14 on) and the overlap schedulers of other engines hide it all
    assert rf.sync_host_per_seq_s("vllm", "0.14.0", logprobs="text") == 0.0
    assert rf.sync_host_per_seq_s("vllm", "0.10.0", async_scheduling=True, logprobs="text") == 0.0
    assert rf.sync_host_per_seq_s("sglang", "0.4.6", logprobs="text") == 0.0
    # V0 over several GPUs: its own per-sequence figure, the log-probs' share on top
    v0 = rf.sync_host_per_seq_s("vllm", "0.6.3", tp=2)
    assert rf.sync_host_per_seq_s("vllm", "0.6.3", tp=2, logprobs="text") - v0 == pytest.approx(text - sync)
    # multi-step scheduling pays the host round once per N steps, the log-probs' share with it
    assert rf.sync_host_per_seq_s("vllm", "0.6.3", None, 4, logprobs="ids") == pytest.approx(ids / 4)


def test_predict_prices_the_log_probs_in_its_steps_and_says_so():
    spec = resolve_model("llama3.1-8b").spec
    steps = {}
    for mode in ("off", "text"):
        model, _, _ = analytic_model(spec, "h100", engine=EngineOptions(engine_version="0.10.0",
                                                                       in_process_logprobs=mode))
        steps[mode] = [model.decode_step_s(c, 600) for c in (1, 256)]
    extra = rf.SYNC_HOST_PER_SEQ_S * (rf.LOGPROBS_HOST_RATIO["text"] - 1)
    for c, off, text in zip((1, 256), steps["off"], steps["text"]):
        assert text - off == pytest.approx(extra * c, rel=1e-6)
    r = run_main("predict", "--model", "llama3.1-8b", "--gpu", "h100", "-c", "256", "--engine-version", "0.10.0",
                 "--in-process-logprobs", "text")
    assert r.exit_code == 0 and "for per-token log-probs with their text in the caller's process" in r.output
    refused("predict", "--model", "llama3.1-8b", "--gpu", "h100", "--in-process-logprobs", "all",
            fragments=("--in-process-logprobs",))
    refused("predict", "--model", "llama3.1-8b", "--gpu", "h100", "--set", "engine.in_process_logprobs=all",
            fragments=("--in-process-logprobs all", "ids", "text"))


def test_the_frameworks_synchronous_rollouts_are_read_as_theirs(tmp_path):
    from throughputlab.decide.runconfig import decide_data
    from throughputlab.rlconfig import read_run_config

    nemo = read_run_config(NEMO / "grpo-qwen2.5-7b-2n8g-dtensor.yaml")
    assert not nemo.rollout_async_engine and nemo.rollout_detokenize is False  # no stop strings: no tokenizer
    data, used, _ = decide_data(nemo)
    assert data["shape"]["engine"]["in_process_logprobs"] == "ids"
    assert any(u.startswith("shape.engine.in_process_logprobs = ids: NeMo-RL's synchronous vLLM") for u in used)
    # stop strings (or skip_tokenizer_init: false) keep the engine's tokenizer: the log-probs come with the text
    for change in ({"policy.generation.stop_strings": ["</answer>"]},
                   {"policy.generation.vllm_cfg.skip_tokenizer_init": "false"}):
        rc = read_run_config(NEMO / "grpo-qwen2.5-7b-2n8g-dtensor.yaml",
                             overrides=[f"{k}={v}" for k, v in change.items()])
        assert rc.rollout_detokenize is True
        assert decide_data(rc)[0]["shape"]["engine"]["in_process_logprobs"] == "text"
    # NeMo-RL's async engine (AsyncLLM) keeps its engine in a process of its own: nothing added
    data, _, _ = decide_data(nemo.model_copy(update={"rollout_async_engine": True}))
    assert "in_process_logprobs" not in data["shape"].get("engine", {})
    verl = read_run_config(DATA / "verl_printed_ppo.yaml")
    data, _, _ = decide_data(verl)
    assert data["shape"]["engine"]["in_process_logprobs"] == "ids"
    for other in ({"rollout_async_engine": True}, {"rollout_engine": "sglang"}):
        data, _, _ = decide_data(verl.model_copy(update=other))
        assert "in_process_logprobs" not in data["shape"].get("engine", {})
    # TRL: vLLM colocated in the training processes asks for them with the text; its server mode does not
    trl = read_run_config(DATA / "trl_grpo_v1.yaml")  # vllm_mode: colocate
    assert decide_data(trl)[0]["shape"]["engine"]["in_process_logprobs"] == "text"
    server = tmp_path / "server.yaml"
    server.write_text((DATA / "trl_grpo_v1.yaml").read_text().replace("vllm_mode: colocate", "vllm_mode: server"))
    data, _, _ = decide_data(read_run_config(str(server)))
    assert "in_process_logprobs" not in data["shape"].get("engine", {})


def _gen_s(profile: str, tmp_path, *args) -> float:
    out = tmp_path / "d.json"
    r = run_main("decide", "--profile", profile, "--prompts", "64", "--group", "8", *args, "--json", str(out))
    assert r.exit_code == 0, r.output
    return json.loads(out.read_text())["rows"][0]["step"]["gen_s"]


def test_decide_adds_the_log_probs_to_a_predicted_engine_and_moves_v0s_host_time_with_the_engines_tp(tmp_path):
    spec = resolve_model("qwen2.5-7b").spec
    old = tmp_path / "v10.json"
    predict_analytic(spec, "h100", layout=Layout(gpus=8), engine=EngineOptions(engine_version="0.10.0")).save(old)
    off = _gen_s(str(old), tmp_path)
    ids = _gen_s(str(old), tmp_path, "--in-process-logprobs", "ids")
    text = _gen_s(str(old), tmp_path, "--in-process-logprobs", "text")
    assert off < ids < text
    assert _gen_s(str(old), tmp_path, "--in-process-logprobs", "off") == pytest.approx(off)
    # a current engine schedules asynchronously: the log-probs' host work overlaps the device's step
    new = tmp_path / "now.json"
    predict_analytic(spec, "h100", layout=Layout(gpus=8)).save(new)
    assert _gen_s(str(new), tmp_path, "--in-process-logprobs", "text") == pytest.approx(_gen_s(str(new), tmp_path))
    # V0 predicted at TP 1 and run at TP 2: its per-sequence host time is the TP > 1 figure in decide too
    from throughputlab.decide.cluster import ClusterSpec, Placement, generation_model
    from throughputlab.fit import load_model

    model = load_model(predict_analytic(spec, "h100", layout=Layout(gpus=8),
                                        engine=EngineOptions(engine_version="0.6.3")))
    pl = Placement(kind="colocated", gpus=8, gen_gpus=8, train_gpus=8, tp=2)
    moved = generation_model(model, pl, ClusterSpec(gpus=8, engine_tp=2))
    assert moved.decode.t_seq_s - model.decode.t_seq_s == pytest.approx(
        rf.V0_TP_HOST_PER_SEQ_S - rf.SYNC_HOST_PER_SEQ_S, rel=1e-6)
    assert generation_model(model, pl.model_copy(update={"tp": 1}), ClusterSpec(gpus=8)).decode == model.decode


def test_a_measured_engine_keeps_its_host_time_and_says_why(caplog):
    from tests._synth import make_profile
    from throughputlab.decide.cluster import ClusterSpec, generation_model, placements
    from throughputlab.decide.shape import EngineShape
    from throughputlab.fit import load_model

    model = load_model(make_profile())
    pl = placements(model, ClusterSpec())[0]
    with caplog.at_level("WARNING"):
        same = generation_model(model, pl, ClusterSpec(), EngineShape(in_process_logprobs="text"))
    assert same.decode == model.decode
    assert "not applied to a measured engine" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        same = generation_model(model, pl, ClusterSpec(), EngineShape(distributed_executor_backend="ray"))
    assert same.decode == model.decode and "not applied to a measured engine" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):  # a run on SGLang over a measured vLLM engine: priced as measured, and said
        same = generation_model(model, pl, ClusterSpec(), EngineShape(name="sglang"))
    assert same.decode == model.decode and not same.separate_prefill and "engine.name" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        generation_model(model, pl, ClusterSpec(), EngineShape(name="vllm"))
    assert "not applied" not in caplog.text


# ---------------------------------------------------------------- the ray executor


def test_the_ray_executor_defers_async_scheduling_to_vllm_0_21():
    sync = rf.SYNC_HOST_PER_SEQ_S
    assert rf.sync_host_per_seq_s("vllm", "0.17.1", executor="ray") == sync
    assert rf.sync_host_per_seq_s("vllm", "0.17.1", executor="ray", logprobs="text") == pytest.approx(
        sync * rf.LOGPROBS_HOST_RATIO["text"])
    for other in ("mp", "uni", "external_launcher", None):
        assert rf.sync_host_per_seq_s("vllm", "0.17.1", executor=other) == 0.0
    # RayExecutorV2 from 0.21, a current engine (no version), or async scheduling asked for: overlapped
    assert rf.sync_host_per_seq_s("vllm", "0.21.0", executor="ray") == 0.0
    assert rf.sync_host_per_seq_s("vllm", None, executor="ray") == 0.0
    assert rf.sync_host_per_seq_s("vllm", "0.17.1", async_scheduling=True, executor="ray") == 0.0
    # before 0.14 the executor changes nothing: no engine scheduled asynchronously by itself
    assert rf.sync_host_per_seq_s("vllm", "0.11.2", executor="ray") == rf.sync_host_per_seq_s("vllm", "0.11.2") == sync
    assert rf.sync_host_per_seq_s("sglang", "0.4.6", executor="ray") == 0.0


def test_predict_takes_the_executor_and_refuses_it_where_it_means_nothing():
    spec = resolve_model("llama3.1-8b").spec
    steps = {}
    for ex in (None, "ray"):
        model, _, _ = analytic_model(spec, "h100", engine=EngineOptions(engine_version="0.17.1",
                                                                       distributed_executor_backend=ex))
        steps[ex] = model.decode_step_s(256, 600)
    assert steps["ray"] - steps[None] == pytest.approx(rf.SYNC_HOST_PER_SEQ_S * 256, rel=1e-6)
    r = run_main("predict", "--model", "llama3.1-8b", "--gpu", "h100", "-c", "256", "--engine-version", "0.17.1",
                 "--distributed-executor-backend", "ray")
    assert r.exit_code == 0 and "executor ray" in r.output and "RAY_ASYNC_SCHEDULING_VERSION" in r.output
    refused("predict", "--model", "llama3.1-8b", "--gpu", "h100", "--set", "engine.distributed_executor_backend=dask",
            fragments=("--distributed-executor-backend dask", "ray"))
    refused("predict", "--model", "llama3.1-8b", "--gpu", "h100", "--engine", "sglang",
            "--distributed-executor-backend", "ray", fragments=("vLLM's setting", "sglang"))


def test_configs_of_ray_engines_say_so_and_decide_prices_it_on_the_profiles_version(tmp_path):
    from throughputlab.decide.runconfig import decide_data
    from throughputlab.rlconfig import read_run_config

    nemo = read_run_config(NEMO / "grpo-qwen2.5-7b-2n8g-dtensor.yaml")
    one = decide_data(nemo.model_copy(update={"rollout_tp": 1}))[0]
    assert "distributed_executor_backend" not in one["shape"].get("engine", {})
    data, used, _ = decide_data(nemo.model_copy(update={"rollout_tp": 4}))
    assert data["shape"]["engine"]["distributed_executor_backend"] == "ray"
    assert any(u.startswith("shape.engine.distributed_executor_backend = ray: NeMo-RL runs") for u in used)
    verl = read_run_config(DATA / "verl_printed_ppo.yaml")
    assert "distributed_executor_backend" not in decide_data(verl.model_copy(update={"rollout_tp": 4}))[0][
        "shape"].get("engine", {})
    spec = resolve_model("qwen2.5-7b").spec
    gen = {}
    for version in ("0.17.1", "0.21.0"):
        prof = tmp_path / f"{version}.json"
        predict_analytic(spec, "h100", layout=Layout(gpus=8, tp=2), engine=EngineOptions(engine_version=version)).save(prof)
        gen[version] = (_gen_s(str(prof), tmp_path), _gen_s(str(prof), tmp_path, "--distributed-executor-backend", "ray"))
    assert gen["0.17.1"][1] > gen["0.17.1"][0] * 1.01
    assert gen["0.21.0"][1] == pytest.approx(gen["0.21.0"][0])


def test_nemo_rl_split_runs_sync_in_pipelined_buckets_others_do_not():
    from throughputlab.decide.runconfig import decide_data
    from throughputlab.rlconfig import read_run_config

    split = read_run_config(NEMO / "grpo-qwen2.5-7b-2n8g-split.yaml")
    data, used, _ = decide_data(split)
    assert data["shape"]["sync"]["pipelined"] is True
    assert any(u.startswith("shape.sync.pipelined = True: NeMo-RL broadcasts the weights in packed buckets") for u in used)
    colocated = decide_data(read_run_config(NEMO / "grpo-qwen2.5-7b-2n8g-dtensor.yaml"))[0]
    assert "pipelined" not in colocated["shape"].get("sync", {})
    verl = read_run_config(DATA / "verl_printed_ppo.yaml")
    assert "pipelined" not in decide_data(verl.model_copy(update={"placement": "split", "rollout_gpus": 4}))[0][
        "shape"].get("sync", {})
