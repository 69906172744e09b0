"""`decide --config`: a run's own launch config as decide's settings, with flags over it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_main
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, predict_analytic

DATA = Path(__file__).parent / "data" / "rlconfig"
NEMO = DATA / "nemo" / "recipes" / "llm"


@pytest.fixture(scope="module")
def q7_16xh100(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "q7.json"
    predict_analytic(resolve_model("qwen2.5-7b").spec, "h100", layout=Layout(gpus=16, nodes=2)).save(path)
    return str(path)


def _decide(profile, *args, tmp_path):
    out = tmp_path / "d.json"
    r = run_main("decide", "--profile", profile, *args, "--json", str(out))
    assert r.exit_code == 0, r.output
    return r.output, json.loads(out.read_text())


def test_a_nemo_rl_recipe_alone_sets_the_decision(q7_16xh100, tmp_path):
    text, d = _decide(q7_16xh100, "--config", str(NEMO / "grpo-qwen2.5-7b-2n8g-dtensor.yaml"), tmp_path=tmp_path)
    assert "(nemo-rl): " in text and "knobs read" in text
    assert "read: group = 8" in text and "read: cluster.engine_tp = 2" in text
    # a colocated NeMo-RL step moves the policy to host memory and back: priced, not set aside
    assert "read: shape.train.offload_param_copies = 5" in text and "host offload" in text
    assert "ignored (" in text
    assert [r["prompts"] for r in d["rows"]] == [64, 128, 256]  # the run's batch, 2x and 4x
    assert d["rows"][0]["step"]["group"] == 8
    assert "colocated on 16 GPUs: 8 engines x TP 2" in d["rows"][0]["step"]["placement"]


def test_a_split_recipe_generates_on_its_own_node(q7_16xh100, tmp_path):
    text, d = _decide(q7_16xh100, "--config", str(NEMO / "grpo-qwen2.5-7b-2n8g-split.yaml"), tmp_path=tmp_path)
    assert "read: cluster.placement = split" in text and "read: cluster.gen_gpus = 8" in text
    step = d["rows"][0]["step"]
    assert step["placement"].startswith("split 8+8") and step["overlap"] == "separate"


def test_a_verl_config_reads_its_critic_and_flags_override_it(q7_16xh100, tmp_path):
    text, d = _decide(q7_16xh100, "--config", str(DATA / "verl_printed_ppo.yaml"), tmp_path=tmp_path)
    assert "(verl" in text and "read: shape.algo = ppo" in text
    assert all(r["step"]["critic_s"] > 0 for r in d["rows"])
    _, d2 = _decide(q7_16xh100, "--config", str(DATA / "verl_printed_ppo.yaml"), "--prompts", "64,128",
                    "--algo", "grpo", tmp_path=tmp_path)
    assert [r["prompts"] for r in d2["rows"]] == [64, 128, 1024]  # the run's own batch stays the baseline
    assert all(r["step"]["critic_s"] == 0 for r in d2["rows"])


def test_config_overrides_take_the_frameworks_own_form(q7_16xh100, tmp_path):
    text, d = _decide(q7_16xh100, "--config", str(NEMO / "grpo-qwen2.5-7b-2n8g-dtensor.yaml"),
                      "--config-set", "grpo.num_generations_per_prompt=4", tmp_path=tmp_path)
    assert "read: group = 4" in text and d["rows"][0]["step"]["group"] == 4


@pytest.mark.parametrize("args, fragment", [
    (["--config", "missing.yaml"], "missing.yaml"),
    (["--config-set", "a=1"], "--config-set and --framework go with --config FILE"),
    (["--config", str(DATA / "trl_grpo.yaml"), "--framework", "verl"], "trl_grpo.yaml"),
    (["--config", str(NEMO / "grpo-qwen2.5-7b-2n8g-dtensor.yaml"), "--config-set", "grpo.num_prompts_per_stepp=3"],
     "num_prompts_per_step"),
])
def test_bad_configs_are_one_line_errors(q7_16xh100, args, fragment):
    r = run_main("decide", "--profile", q7_16xh100, *args)
    out = r.output.strip()
    assert r.exit_code == 2 and len(out.splitlines()) == 1 and fragment in out and "Traceback" not in out, out


def test_a_sequence_cap_bounds_prompt_plus_response(tmp_path):
    """NeMo-RL's max_total_sequence_length caps prompt + response: the response cap is what it leaves after
    the prompt (a quarter of the prompt cap, as decide assumes prompts from caps), and a prompt cap equal to it
    (max_input_seq_length: ${policy.max_total_sequence_length}) is not taken as the prompt cap."""
    from throughputlab.decide.runconfig import decide_data
    from throughputlab.rlconfig import read_run_config

    rc = read_run_config(NEMO / "grpo-qwen2.5-7b-2n8g-dtensor.yaml")
    total, prompt_cap = rc.sequence_tokens_max, rc.prompt_tokens_max
    assert total and prompt_cap and prompt_cap < total
    data, used, _ = decide_data(rc)
    assert data["shape"]["prompt_len"] == prompt_cap // 4
    cap = min(rc.response_tokens_max or total, total - prompt_cap // 4)
    assert data["shape"]["response"]["dist"].endswith(f"max={cap}")
    assert any(u.startswith(f"shape.prompt_len = {prompt_cap // 4}: a quarter of the prompt cap {prompt_cap}")
               for u in used)
    # a prompt cap as large as the sequence cap says nothing of the prompt: decide's default prompt (512)
    same = rc.model_copy(update={"prompt_tokens_max": total, "response_tokens_max": None})
    data, _, _ = decide_data(same)
    assert data["shape"]["prompt_len"] == 512 and data["shape"]["response"]["dist"].endswith(f"max={total - 512}")
    small = same.model_copy(update={"sequence_tokens_max": 1024, "prompt_tokens_max": 1024})
    data, _, _ = decide_data(small)  # a cap below four default prompts: a quarter of it
    assert data["shape"]["prompt_len"] == 256 and data["shape"]["response"]["dist"].endswith("max=768")
    # veRL states both caps and no sequence cap: a quarter of the prompt cap, the response cap as it is
    verl = read_run_config(DATA / "verl_printed_ppo.yaml")
    data, _, _ = decide_data(verl)
    assert data["shape"]["prompt_len"] == verl.prompt_tokens_max // 4
    assert data["shape"]["response"]["dist"].endswith(f"max={verl.response_tokens_max}")


def test_nemo_rls_base_config_runs_alone_and_with_a_prompt_length(q7_16xh100, tmp_path):
    for extra in ((), ("--prompt-len", "200")):
        text, d = _decide(q7_16xh100, "--config", str(DATA / "nemo" / "grpo_base.yaml"), *extra, tmp_path=tmp_path)
        assert d["rows"] and "Recommendation" in text


def test_the_printout_names_the_config_keys_it_read(q7_16xh100, tmp_path):
    text, _ = _decide(q7_16xh100, "--config", str(DATA / "verl_printed_ppo.yaml"), tmp_path=tmp_path)
    keys = next(line for line in text.splitlines() if line.startswith("  keys read: "))
    assert "data.train_batch_size=" in keys and "actor_rollout_ref.rollout.n=" in keys


@pytest.mark.parametrize("config, timers", [
    (NEMO / "grpo-qwen2.5-7b-2n8g-dtensor.yaml",
     {"timing/train/generation": "rewards", "timing/train/prepare_for_generation": "sync"}),
    (DATA / "verl_printed_ppo.yaml", {"timing_s/gen": "after v0.7.0 not", "timing_s/update_weights": "sync"}),
    (DATA / "openrlhf_ppo_colocated.sh", {"train/timing/generation": "rewards", "train/timing/broadcast": "sync"}),
])
def test_the_printout_says_what_the_frameworks_timers_hold(q7_16xh100, tmp_path, config, timers):
    text, d = _decide(q7_16xh100, "--config", str(config), tmp_path=tmp_path)
    listed = text[text.index("timers in the run's log"):]
    for key, holds in timers.items():
        line = next(ln for ln in listed.splitlines() if ln.strip().startswith(key))
        assert holds in line, line
    assert any(t.startswith("timing") or t.startswith("train/timing") for t in
               [x.split(":")[0] for x in d["config"]["timers"][1:]])


def test_trl_defaults_and_a_missing_process_count(tmp_path):
    from throughputlab.errors import UserError
    from throughputlab.rlconfig import read_run_config

    p = tmp_path / "grpo.yaml"
    p.write_text("per_device_train_batch_size: 8\nnum_generations: 8\nuse_vllm: true\nnum_processes: 4\n")
    rc = read_run_config(p)
    # GRPOConfig's defaults (TRL 1.x): beta 0.0 (no reference model), vllm_mode colocate (v1.0; server before),
    # gradient checkpointing on (v0.22), bf16 unless fp16
    assert rc.reference is False and rc.placement == "colocated"
    assert rc.activation_checkpointing == "full" and rc.train_dtype == "bf16"
    for key in ("beta", "vllm_mode", "gradient_checkpointing", "bf16"):
        assert "TRL's default" in rc.knob(key).note, key
    assert "'server' before" in rc.knob("vllm_mode").note and "v0.22" in rc.knob("gradient_checkpointing").note
    p.write_text("per_device_train_batch_size: 8\nnum_generations: 8\nuse_vllm: true\nnum_processes: 4\n"
                 "vllm_mode: server\ngradient_checkpointing: false\nfp16: true\n")
    rc = read_run_config(p)
    assert rc.placement == "split" and rc.activation_checkpointing == "none" and rc.train_dtype == "fp16"
    p.write_text("per_device_train_batch_size: 8\nnum_generations: 8\nuse_vllm: true\n")
    with pytest.raises(UserError, match=r"grpo.yaml: num_processes: not set"):
        read_run_config(p)


def test_a_config_of_another_model_than_the_profiles_is_warned_about(q7_16xh100, tmp_path):
    from throughputlab.decide.runconfig import model_mismatch

    assert model_mismatch("meta-llama/Llama-3.1-8B-Instruct", "llama3.1-8b") is None
    assert model_mismatch("$HOME/models/Qwen2.5-Math-7B", "qwen2.5-7b") is None
    assert "30B against 32B" in model_mismatch("Qwen/Qwen3-30B-A3B", "qwen3-32b")
    assert "deepseek against qwen" in model_mismatch("deepseek-ai/DeepSeek-V3", "Qwen/Qwen2.5-7B")
    assert model_mismatch(None, "qwen2.5-7b") is None and model_mismatch("my-policy", "qwen2.5-7b") is None
    cfg = tmp_path / "run.yaml"
    cfg.write_text("data:\n  train_batch_size: 64\nactor_rollout_ref:\n  model:\n    path: meta-llama/Llama-3.1-70B\n"
                   "  rollout:\n    n: 4\n")
    text, d = _decide(q7_16xh100, "--config", str(cfg), tmp_path=tmp_path)
    assert "warning: the config trains meta-llama/Llama-3.1-70B but the profile is of qwen2.5-7b" in text
    assert any("llama against qwen" in n for n in d["notes"])


def test_the_placement_flag_replaces_a_split_configs_placement(q7_16xh100, tmp_path):
    text, d = _decide(q7_16xh100, "--config", str(NEMO / "grpo-qwen2.5-7b-2n8g-split.yaml"), "--placement", "colocated",
                      tmp_path=tmp_path)
    assert "--placement colocated replaces the config's placement" in text
    assert d["rows"][0]["step"]["placement"].startswith("colocated on 16 GPUs")


def test_the_json_records_the_config_and_the_flags_that_override_it(q7_16xh100, tmp_path):
    text, d = _decide(q7_16xh100, "--config", str(DATA / "verl_printed_ppo.yaml"), "--group", "4", "--prompts", "64,128",
                      tmp_path=tmp_path)
    cfg = d["config"]
    assert cfg["framework"] == "verl" and cfg["file"].endswith("verl_printed_ppo.yaml")
    keys = {k["key"] for k in cfg["read"]}
    assert "data.train_batch_size" in keys and any(k["key"].startswith("trainer.") for k in cfg["ignored"])
    assert any(line.startswith("group = ") for line in cfg["settings"])
    assert "  --group 4 overrides the config's group = " in text and "--prompts 64,128 overrides" in text
    assert d["rows"][0]["step"]["group"] == 4
    # veRL's mini-batch counts prompts: at --group 4 its sequences follow
    mini = next(k["value"] for k in cfg["read"] if k["key"] == "actor_rollout_ref.actor.ppo_mini_batch_size")
    assert f"{mini} prompts x --group 4 = {mini * 4} sequences per optimizer step" in text


def test_openrlhf_deepspeed_sleep_is_priced_and_dtensor_offload_named():
    from throughputlab.decide.runconfig import decide_data
    from throughputlab.rlconfig import read_run_config

    rc = read_run_config(DATA / "openrlhf_ppo_colocated.sh")
    assert rc.states_sleep is True
    data, used, _ = decide_data(rc)
    assert data["shape"]["train"]["offload_param_copies"] == 2 and data["shape"]["train"]["offload_optimizer_copies"] == 2
    assert any("--deepspeed_enable_sleep" in u for u in used)
    off = read_run_config(NEMO / "grpo-qwen2.5-7b-2n8g-split.yaml")
    if off.param_offload:
        assert any("dtensor cpu_offload" in m for m in decide_data(off)[2])
    fake = off.model_copy(update={"param_offload": True, "train_strategy": "fsdp2"})
    assert any("dtensor cpu_offload" in m for m in decide_data(fake)[2])


def test_review_cases_a_comment_naming_grpoconfig_a_placement_flag_over_nemo_offload_and_trl_server(q7_16xh100,
                                                                                                   tmp_path):
    from throughputlab.decide.runconfig import decide_data
    from throughputlab.rlconfig import read_run_config

    cfg = tmp_path / "t.yaml"
    cfg.write_text("# the same values as GRPOConfig(beta=0.04) in train.py\n" + (DATA / "trl_grpo.yaml").read_text())
    assert read_run_config(cfg).framework == "trl"
    text, d = _decide(q7_16xh100, "--config", str(NEMO / "grpo-qwen2.5-7b-2n8g-dtensor.yaml"), "--placement", "split",
                      tmp_path=tmp_path)
    assert "host offload" not in text and d["rows"][0]["step"]["placement"].startswith("split")
    server = tmp_path / "server.yaml"
    server.write_text("per_device_train_batch_size: 8\nnum_generations: 8\nuse_vllm: true\nvllm_mode: server\n"
                      "num_processes: 8\n")
    data, _, missing = decide_data(read_run_config(server))
    assert "gpus" not in data.get("cluster", {}) and any("vllm_mode server" in m for m in missing)


def test_a_refusal_resting_on_config_values_names_the_file_and_keys(q7_16xh100, tmp_path):
    p = tmp_path / "run.sh"
    p.write_text("python3 -m verl.trainer.main_ppo data.train_batch_size=64 actor_rollout_ref.rollout.n=4 "
                 "trainer.n_gpus_per_node=16 trainer.nnodes=1\n")
    r = run_main("decide", "--profile", str(q7_16xh100), "--config", str(p))
    out = r.output.strip()
    assert r.exit_code == 2 and len(out.splitlines()) == 1, out
    assert "holds at most 8 GPUs" in out and f"from --config {p}: trainer.n_gpus_per_node=16, trainer.nnodes=1" in out
    # the flags given replace what the config set: the refusal no longer rests on the config's GPU counts
    r = run_main("decide", "--profile", str(q7_16xh100), "--config", str(p), "--gpus", "16", "--nodes", "1")
    assert r.exit_code == 2 and "from --config" not in r.output, r.output
    p.write_text("python3 -m verl.trainer.main_ppo data.train_batch_size=64 trainer.n_gpus_per_node=2 "
                 "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4 actor_rollout_ref.rollout.tensor_model_parallel_size=1\n")
    r = run_main("decide", "--profile", str(q7_16xh100), "--config", str(p))
    assert r.exit_code == 2 and "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4" in r.output, r.output


def test_an_analytic_step_states_its_band_from_published_runs_of_its_framework(q7_16xh100, tmp_path):
    from throughputlab.spread_rl import RL_STEPS

    text, d = _decide(q7_16xh100, "--config", str(NEMO / "grpo-qwen2.5-7b-2n8g-dtensor.yaml"), tmp_path=tmp_path)
    band = d["step_spread"]
    n = len(RL_STEPS[("nemo-rl", "colocated")])
    assert f"over {n} published nemo-rl colocated runs" in band["basis"] and 0 < band["lo"] < band["hi"]
    base = next(r for r in d["rows"] if r["is_baseline"])
    lo, hi = base["step_s"] / band["hi"], base["step_s"] / band["lo"]
    assert f"could be {lo:.3g}-{hi:.3g} s" in text
    assert "these are decide's default" in text  # the config holds no lengths: the band does not cover that guess
    text, d = _decide(q7_16xh100, "--config", str(NEMO / "grpo-qwen2.5-7b-2n8g-split.yaml"),
                      "--response-dist", "lognormal:mean=400,sigma=0.6,max=1024", tmp_path=tmp_path)
    assert "nemo-rl split runs" in d["step_spread"]["basis"] and "decide's default" not in text


def test_a_recipe_that_rolls_out_on_sglang_prices_sglangs_engine(q7_16xh100, tmp_path):
    """NeMo-RL's generation.backend (veRL's rollout.name) makes a predicted profile's engine the run's: the KV cache by
    SGLang's rule (its pool in tokens, not vLLM's blocks), prefill in steps of its own. --set gives it back."""
    from throughputlab.decide.cluster import ClusterSpec, Placement, generation_model
    from throughputlab.decide.shape import EngineShape
    from throughputlab.fit import load_model
    from throughputlab.records.profile import Profile

    cfg = str(DATA / "nemo" / "v0.7" / "grpo-sglang.yaml")
    text, d = _decide(q7_16xh100, "--config", cfg, tmp_path=tmp_path)
    assert "read: shape.engine.name = sglang" in text
    assert "(blocks of 1); engine sglang (prefill in steps of its own" in text
    back, _ = _decide(q7_16xh100, "--config", cfg, "--set", "shape.engine.name=vllm", tmp_path=tmp_path)
    assert "(blocks of 16); engine vllm" in back and "steps of its own" not in back
    # without max_running_requests, SGLang's own cap: from its pool, 2,048 to 4,096 requests
    uncapped = tmp_path / "grpo-sglang-uncapped.yaml"
    uncapped.write_text(Path(cfg).read_text().replace("      max_running_requests: 128\n", ""))
    (tmp_path / "grpo_base.yaml").write_text((Path(cfg).parent / "grpo_base.yaml").read_text())  # its defaults
    text, _ = _decide(q7_16xh100, "--config", str(uncapped), tmp_path=tmp_path)
    seqs = int(text.split("engine limits (each engine): ")[1].split(" sequences")[0])
    assert "shape.engine.max_num_seqs" not in text and 2048 <= seqs <= 4096

    model = load_model(Profile.load(q7_16xh100))
    assert model.engine.name == "vllm" and not model.separate_prefill
    pl, cl = Placement(kind="colocated", gpus=8, gen_gpus=8, train_gpus=8, tp=2), ClusterSpec(gpu_memory_utilization=0.7)
    sg = generation_model(model, pl, cl, EngineShape(name="sglang"))
    vl = generation_model(model, pl, cl, EngineShape())
    assert sg.engine.name == "sglang" and sg.separate_prefill and sg.engine.block_tokens == 1
    assert sg.engine.version is None and sg.kv_cache_tokens != vl.kv_cache_tokens
    assert "SGLang" in sg.engine.kv_rule and "vLLM" in vl.engine.kv_rule
