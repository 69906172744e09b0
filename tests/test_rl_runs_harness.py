"""The published-RL-runs harness (benchmarks/rl_runs.py): rows with ratios on small runs, veRL's colocated
gen timer against generation + weight sync, one line and exit 2 on a malformed data file, and the check
that split runs are predicted faster than their colocated siblings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from _harness import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "rl_runs"
GRPO = "verl_qwen2.5-0.5b-instruct_grpo_8gpu_h100-colocated"
PPO = "verl_qwen2.5-0.5b-instruct_ppo_8gpu_h100-colocated"
NEMO = "nemo-rl_llama3.1-8b-instruct_grpo_8gpu_gb200-colocated"


h = load_benchmark("rl_runs")


@pytest.fixture(scope="module")
def rows():
    return {(r.run, r.measurement): r for r in h.run_all(h.load_runs(DATA, (GRPO, PPO, NEMO)))}


def test_every_run_folder_loads():
    runs = h.load_runs(DATA)
    assert len(runs) >= 33
    assert all(r.measurements and r.measurements[0].step_s > 0 for r in runs)


def test_small_runs_are_predicted_with_ratios(rows):
    for key in ((GRPO, "published"), (PPO, "published"), (NEMO, "v0.5-gb200")):
        r = rows[key]
        assert r.predicted, (key, r.reason)
        assert r.compared and r.compared[0].model == "step"
        for c in r.compared:
            assert c.published > 0 and c.predicted > 0
            assert c.ratio == pytest.approx(c.predicted / c.published)
        assert r.step["step_s"] == pytest.approx(r.compared[0].predicted)


def test_published_lengths_become_the_response_distribution(rows):
    r = rows[(GRPO, "published")]
    assert r.lengths_published and r.inputs["prompt_len"] == 104
    assert "mean=140.229" in r.inputs["response_dist"] and "max=192" in r.inputs["response_dist"]
    if h.capped_form_available():
        assert r.inputs["response_dist"].startswith("capped:") and "clip=0.137" in r.inputs["response_dist"]
    else:
        assert r.inputs["response_dist"].startswith("lognormal:")


def test_a_published_longest_response_sets_the_spread_where_nothing_sits_at_the_cap():
    run = h.load_runs(DATA, ("verl_deepseek-llm-7b-chat_grpo_8gpu_mi300x-colocated",))[0]
    meas = run.measurements[0]
    assert meas.clip == 0 and meas.longest == 554
    form, why = h.response_dist(meas, 1024, True, 5120)
    assert form.startswith("capped:mean=132.965,clip=0,max=1024,sigma=0.4") and "longest response 554" in why
    # a published share at the cap keeps the clip form; without a longest, the default spread
    assert h.response_dist(h.Measurement(**{**meas.__dict__, "clip": 0.02}), 1024, True, 5120)[0] == \
        "capped:mean=132.965,clip=0.02,max=1024"
    assert "sigma=0.6" in h.response_dist(h.Measurement(**{**meas.__dict__, "longest": None, "clip": None}),
                                          1024, True, 5120)[0]


def test_verl_colocated_gen_is_compared_with_generation_plus_weight_sync(rows):
    r = rows[(GRPO, "published")]
    gen = next(c for c in r.compared if c.timer == "timing_s/gen")
    assert gen.model == "gen+sync"
    assert gen.predicted == pytest.approx(r.step["gen_s"] + r.step["sync_s"])
    logprob = next(c for c in r.compared if c.model == "logprob")
    assert logprob.timer == "timing_s/old_log_prob + timing_s/ref"
    assert any(s.startswith("timing_s/reward") for s in r.not_compared)
    ppo = rows[(PPO, "published")]
    critic = next(c for c in ppo.compared if c.model == "critic")
    assert critic.timer == "timing_s/values + timing_s/update_critic"


def test_nemo_rl_rows_compare_the_step_only(rows):
    r = rows[(NEMO, "v0.5-gb200")]
    assert [c.model for c in r.compared] == ["step"]
    assert any("step totals only" in s for s in r.not_compared)
    assert r.inputs["prompt_len_source"].startswith("derived")


def test_a_colocated_step_only_row_shows_the_generation_its_step_implies(rows):
    r = rows[(NEMO, "v0.5-gb200")]
    implied = r.published_step - (r.step["step_s"] - r.step["gen_s"])
    assert implied > r.step["gen_s"] > 0  # the published 91 s step leaves more than the predicted generation
    assert h.implied_generation_s("colocated", r.published_step, r.step) == pytest.approx(implied)
    line = next(x for x in r.not_compared if x.startswith("generation implied by the published step"))
    assert f"pred/implied {r.step['gen_s'] / implied:.2f}" in line
    block = "\n".join(h.render_summary(list(rows.values()), h.summary(list(rows.values()))))
    assert "the generation their step implies" in block and NEMO in block.split("the generation their step implies")[1]
    # only a colocated step is its phases in turn; nothing is implied past a step shorter than the other phases
    assert h.implied_generation_s("one-step-off", r.published_step, r.step) is None
    assert h.implied_generation_s("colocated", 1.0, r.step) is None


def test_fully_async_gen_is_not_compared():
    step = dict(gen_s=10.0, logprob_s=1.0, train_s=20.0, critic_s=0.0, sync_s=1.0, step_s=22.0)
    meas = h.Measurement(id="published", step_s=25.0, timer="timing_s/step",
                         phases={"timing_s/gen": 3.0, "timing_s/update_actor": 19.0, "timing_s/old_log_prob": None})
    compared, skipped = h.compare("verl", "fully-async", meas, step)
    assert [c.model for c in compared] == ["step", "train"]
    assert any(s.startswith("timing_s/gen") and "wait" in s for s in skipped)


def test_verl_offload_is_compared_inside_the_log_prob_and_update_timers():
    # param_offload (4 copies) and optimizer_offload (2): half the parameter copies around the log-prob pass,
    # the rest and the optimizer's with the update, by bytes (16-bit parameters, 12-byte optimizer state)
    base = {"shape": {"train": {"offload_param_copies": 4, "offload_optimizer_copies": 2}}}
    split = h.offload_split(base, 6.0, 2)
    assert split["offload_logprob_s"] == pytest.approx(6.0 * 4 / (8 + 24))
    assert split["offload_logprob_s"] + split["offload_train_s"] == pytest.approx(6.0)
    step = dict(gen_s=10.0, logprob_s=1.0, train_s=20.0, critic_s=0.0, sync_s=1.0, offload_s=6.0, step_s=39.0,
                **split)
    meas = h.Measurement(id="published", step_s=40.0, timer="timing_s/step",
                         phases={"timing_s/old_log_prob": 2.0, "timing_s/update_actor": 26.0})
    compared, _ = h.compare("verl", "colocated", meas, step)
    by = {c.model: c for c in compared}
    assert by["logprob+offload"].predicted == pytest.approx(1.75)
    assert by["train+offload"].predicted == pytest.approx(25.25) and "veRL times inside" in by["train+offload"].note
    # no offload: the passes alone, named as such
    none = h.offload_split({}, 0.0, 2)
    compared, _ = h.compare("verl", "colocated", meas, dict(step, offload_s=0.0, **none))
    assert [c.model for c in compared] == ["step", "logprob", "train"]


def test_a_malformed_data_file_is_one_line_and_exit_2(tmp_path, capsys):
    shutil.copytree(DATA / GRPO, tmp_path / GRPO)
    pub = tmp_path / GRPO / "published.yaml"
    pub.write_text(pub.read_text().replace("gpus:\n  value: 8", "gpus:\n  value: eight", 1))
    assert h.main(["--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "published.yaml" in err and "gpus" in err
    pub.write_text("config_files: [config.yaml\n")
    assert h.main(["--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "YAML" in err


def _row(run: str, published: float, predicted: float):
    r = h.Row(run=run, measurement="published", framework="verl", placement=None, config_complete=True,
              primary=True, published_step=published, predicted=True, inputs={"group": 8})
    r.step = {"step_s": predicted}
    r.compared = [h.Compared("timing_s/step", published, predicted, "step", predicted / published)]
    return r


def test_the_pair_check_on_a_synthetic_pair():
    col = "verl_m_grpo_16gpu_h20-colocated-fsdp2"
    off = "verl_m_grpo_16gpu_h20-onestepoff-fsdp2-4-12"
    other = "verl_m_grpo_32gpu_h20-fullyasync16-16"  # no colocated sibling on 32 GPUs
    good = h.pairs([_row(col, 700, 800), _row(off, 500, 600), _row(other, 100, 50)])
    assert len(good) == 1 and good[0]["colocated"] == col and good[0]["split"] == off
    assert good[0]["published_faster"] and good[0]["ok"] is True
    bad = h.pairs([_row(col, 700, 500), _row(off, 500, 600)])
    assert bad[0]["ok"] is False
    assert h.summary([_row(col, 700, 500), _row(off, 500, 600)])["pairs_ok"] is False
    slower = h.pairs([_row(col, 400, 500), _row(off, 500, 600)])
    assert slower[0]["ok"] is None  # the published split run is not faster: nothing to check
    fp8 = h.pairs([_row(col.replace("-fsdp2", ""), 700, 800), _row("verl_m_grpo_16gpu_h20-fp8-onestepoff", 500, 600)])
    assert fp8 == []  # another precision is no sibling


def test_json_holds_every_row_and_the_summary(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert h.main(["--run", GRPO, "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert GRPO in text and "Summary: 1 runs, 1 predicted" in text
    data = json.loads(out.read_text())
    assert [r["run"] for r in data["rows"]] == [GRPO]
    assert data["rows"][0]["compared"][0]["ratio"] > 0 and "per_run" in data["summary"]


def test_a_phase_predicted_at_zero_ranks_worst_without_failing():
    r = h.Row(run="r", measurement="m", framework="verl", placement="colocated", config_complete=True, primary=True,
              published_step=10.0, predicted=True)
    r.compared = [h.Compared("timing_s/step", 10.0, 9.0, "step", 0.9),
                  h.Compared("timing_s/update_critic", 5.0, 0.0, "critic", 0.0)]
    worst = h._worst([r], 2)
    assert [w["timer"] for w in worst] == ["timing_s/update_critic", "timing_s/step"]


def test_the_step_ratios_for_decides_band_take_one_row_per_run_with_published_lengths(rows, tmp_path):
    out = h.spread_ratios(list(rows.values()))
    grpo, nemo = rows[(GRPO, "published")], rows[(NEMO, "v0.5-gb200")]
    assert sorted(out) == [("nemo-rl", "colocated"), ("verl", "colocated")]
    assert round(grpo.compared[0].ratio, 4) in out[("verl", "colocated")] and len(out[("verl", "colocated")]) == 2
    assert out[("nemo-rl", "colocated")] == [round(nemo.compared[0].ratio, 4)]
    path = tmp_path / "spread_rl.py"
    assert h.write_spread(list(rows.values()), path) == 3
    ns: dict = {}
    exec(path.read_text(), ns)  # the written table is the module the library imports
    assert ns["RL_STEPS"] == {k: sorted(v) for k, v in out.items()} and "3 runs" in ns["SOURCE"]
