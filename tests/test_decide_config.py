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
