"""Scoring the responses on the host after the rollout (NeMo-RL's math environment with math-verify):
priced from the config's workers, inside the generation it follows, and bad values refused."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from conftest import assert_user_error, run_cli, run_main
from throughputlab.decide.calculator import DecideSpec, decide_from_spec
from throughputlab.rlconfig import read_run_config
from throughputlab.roofline import rl as rf_rl

NEMO = Path(__file__).parent / "data" / "rlconfig" / "nemo"
SHAPE = {"prompt_len": 256, "response": {"dist": "lognormal:mean=600,sigma=0.5,max=2048"}}


def test_responses_are_split_in_equal_chunks_over_the_workers():
    assert rf_rl.reward_s(2048, 0.1, 8) == pytest.approx(25.6)
    assert rf_rl.reward_s(2049, 0.1, 8) == pytest.approx(25.7)  # one worker takes one more
    assert rf_rl.reward_s(2048, 0.0, 8) == 0.0
    assert rf_rl.reward_s(10, 0.1, 64) == pytest.approx(0.1)


def _step(profile, reward=None, split=False):
    shape = {**SHAPE, **({"reward": reward} if reward else {})}
    cluster = {"cluster": {"placement": "split", "gen_gpus": 4}} if split else {}
    spec = DecideSpec.model_validate({"profile": profile, "prompts": [32], "group": 16, "shape": shape, **cluster})
    return decide_from_spec(spec)[0].rows[0].step


def test_scoring_follows_the_rollout_inside_generation(q7_8xh100):
    plain = _step(q7_8xh100)
    scored = _step(q7_8xh100, {"per_response_s": 0.1, "workers": 8})
    expected = math.ceil(512 / 8) * 0.1
    assert plain.reward_s == 0.0 and scored.reward_s == pytest.approx(expected)
    assert scored.gen_s - plain.gen_s == pytest.approx(expected, rel=1e-9)
    assert scored.step_s - plain.step_s == pytest.approx(expected, rel=1e-9)


def test_an_overlapped_step_scores_beside_generation_and_training(q7_8xh100):
    plain = _step(q7_8xh100, split=True)
    learn = plain.logprob_s + plain.train_s + plain.critic_s + plain.offload_s
    for per in (1e-4, 0.5):  # hidden under the other stages, then the stage that sets the step
        scored = _step(q7_8xh100, {"per_response_s": per, "workers": 1}, split=True)
        assert scored.overlap == "off-policy" and scored.gen_s == pytest.approx(plain.gen_s)
        assert scored.step_s == pytest.approx(max(scored.gen_s, 512 * per, learn) + scored.sync_s)
    assert scored.step_s == pytest.approx(256 + scored.sync_s)


def test_nemo_rls_math_environment_is_read_as_math_verify_on_its_workers(tmp_path):
    rc = read_run_config(NEMO / "grpo_base.yaml")
    assert rc.reward_scorer == "math_verify" and rc.reward_workers == 8
    knob = rc.knob("env.math.num_workers")
    assert knob is not None and "reward_scorer" in knob.note
    dapo = tmp_path / "dapo.yaml"
    dapo.write_text("defaults: grpo_base.yaml\nenv:\n  math:\n    num_workers: 4\n    math_verify_impl: dapo_math_verify\n")
    (tmp_path / "grpo_base.yaml").write_text((NEMO / "grpo_base.yaml").read_text())
    assert read_run_config(dapo).reward_scorer is None  # a string match: not priced


def test_decide_config_prices_the_math_environment_and_says_so(q7_8xh100):
    r = run_main("decide", "--profile", q7_8xh100, "--config", str(NEMO / "grpo_base.yaml"), "--gpus", "8")
    assert r.exit_code == 0, r.output
    assert f"shape.reward.per_response_s = {rf_rl.MATH_VERIFY_S}" in r.output
    assert "shape.reward.workers = 8" in r.output
    assert (f"scoring the responses on the host: {rf_rl.MATH_VERIFY_S:g} s each on 8 process(es), after the rollout "
            "inside gen") in r.output


@pytest.mark.parametrize("setting", ["shape.reward.per_response_s=-1", "shape.reward.workers=0",
                                     "shape.reward.per_response_s=nan"])
def test_bad_reward_settings_are_one_line_errors(q7_8xh100, setting):
    r = run_cli("decide", "--profile", q7_8xh100, "--prompts", "32", "--set", setting)
    assert_user_error(r, setting.split("=")[0].split(".")[-1])


def test_a_calibration_keeps_an_overlapped_steps_scoring(q7_8xh100):
    from throughputlab.decide.against import calibrated_step
    from throughputlab.decide.logcheck import Calibration

    seen = []
    shape = {**SHAPE, "reward": {"per_response_s": 0.5, "workers": 1}}  # 256 s of scoring: the longest stage
    spec = DecideSpec.model_validate({"profile": q7_8xh100, "prompts": [32], "group": 16, "shape": shape,
                                      "cluster": {"placement": "split", "gen_gpus": 4}})
    decide_from_spec(spec, adjust_step=lambda steps, st: seen.append((steps, st)) or st)
    steps, st = seen[0]
    assert st.overlap == "off-policy" and st.step_s == pytest.approx(256 + st.sync_s)
    same = calibrated_step(steps, st, Calibration(log="x", factors={}, uncalibrated={}))
    assert same.step_s == pytest.approx(st.step_s)  # factors of 1 give the step back, scoring stage included
    faster = calibrated_step(steps, st, Calibration(log="x", factors={"gen": 0.5, "update_actor": 0.5},
                                                    uncalibrated={}))
    assert faster.step_s == pytest.approx(st.step_s)  # the host's scoring still sets it
