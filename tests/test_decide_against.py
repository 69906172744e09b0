"""decide --against / --calibrate-from: a veRL log whose phase times are known multiples of the
model's prediction gives those multiples back as ratios and factors, the calibrated decision
reproduces the logged times, and bad logs are one-line errors with exit code 2."""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import numpy as np
import pytest

from conftest import assert_user_error, run_cli
from throughputlab.decide.against import lengths_from_log
from throughputlab.decide.calculator import DecideSpec, decide_from_spec
from throughputlab.decide.lengths import parse_length_dist, sigma_for_longest
from throughputlab.errors import UserError
from throughputlab.imports.runlog import load_run_log
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, predict_analytic

SHAPE = {"prompt_len": 128, "response": {"dist": "lognormal:mean=200,sigma=0.5,max=512"}}
FLAGS = ["--group", "4", "--prompt-len", "128", "--gpus", "2", "--placement", "colocated"]
DIST = ["--response-dist", "lognormal:mean=200,sigma=0.5,max=512"]
K = {"gen": 2.0, "logprob": 1.5, "ref": 1.5, "update_actor": 0.5, "sync": 0.25}
VERL = {"gen": "timing_s/gen", "logprob": "timing_s/old_log_prob", "ref": "timing_s/ref",
        "update_actor": "timing_s/update_actor", "sync": "timing_s/update_weights"}


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    path = tmp_path_factory.mktemp("against") / "q05.json"
    predict_analytic(resolve_model("qwen2.5-0.5b").spec, "h100", layout=Layout(gpus=2)).save(path)
    return str(path)


def predicted(profile, prompts, **shape):
    spec = DecideSpec.model_validate({"profile": profile, "prompts": [prompts], "group": 4,
                                      "shape": {**SHAPE, **shape}, "cluster": {"gpus": 2}})
    return decide_from_spec(spec)[0].rows[0].step


def write_verl(path, phases: dict[str, float], steps: int = 5, extra: dict | None = None):
    """A veRL file-logger JSONL: a validation-only record, then ``steps`` identical training steps."""
    lines = [json.dumps({"step": 0, "data": {"val-core/reward/mean@1": 0.2}})]
    for i in range(1, steps + 1):
        data = {VERL.get(k, f"timing_s/{k}"): v for k, v in phases.items()}
        lines.append(json.dumps({"step": i, "data": {**data, **(extra or {}), "actor/pg_loss": -0.01}}))
    path.write_text("\n".join(lines) + "\n")
    return path


def k_times_log(tmp_path, st):
    pred = {"gen": st.gen_s, "logprob": st.logprob_s / 2, "ref": st.logprob_s / 2, "update_actor": st.train_s,
            "sync": st.sync_s}
    logged = {k: K[k] * v for k, v in pred.items()}
    logged["step"] = sum(logged.values())
    return write_verl(tmp_path / "verl.jsonl", logged), logged


def decide_cli(args, capsys):
    from throughputlab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["decide", *map(str, args)])
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def _row(out: str, phase: str) -> list[str]:
    return next(line.split() for line in out.splitlines() if line.split()[:1] == [phase])


def test_against_prints_the_ratio_of_each_phase(profile, tmp_path, capsys):
    st = predicted(profile, 8)
    log, logged = k_times_log(tmp_path, st)
    code, out, err = decide_cli(["--profile", profile, "--prompts", 8, *FLAGS, *DIST, "--against", log,
                                 "--json", tmp_path / "d.json"], capsys)
    assert code == 0, err
    assert "8 prompts x 4 = 32 responses per step" in out and "colocated on 2 GPUs" in out
    for phase, k in K.items():
        assert _row(out, phase)[-1] == f"{k:.2f}", (phase, _row(out, phase))
    step_ratio = logged["step"] / st.step_s
    assert _row(out, "step")[-1] == f"{step_ratio:.2f}"
    assert not any(line.split()[:1] == ["values"] for line in out.splitlines())  # GRPO, no critic logged
    data = json.loads((tmp_path / "d.json").read_text())
    (check,) = data["run_logs"]
    ratios = {p["phase"]: p["ratio"] for p in check["phases"]}
    assert {k: ratios[k] for k in K} == pytest.approx(K, rel=1e-9)
    assert ratios["step"] == pytest.approx(step_ratio, rel=1e-9)
    assert check["steps"] == 5 and check["responses"] == 32 and "calibration" not in data
    gen = next(p for p in check["phases"] if p["phase"] == "gen")
    assert gen["logged"]["median"] == pytest.approx(logged["gen"]) and gen["logged"]["n"] == 5


def test_calibrate_from_reproduces_the_logged_times_and_names_the_factors(profile, tmp_path, capsys):
    st = predicted(profile, 8)
    log, logged = k_times_log(tmp_path, st)
    code, out, err = decide_cli(["--profile", profile, "--prompts", "4,8,16", "--log-prompts", 8, *FLAGS, *DIST,
                                 "--calibrate-from", log, "--json", tmp_path / "d.json"], capsys)
    assert code == 0, err
    assert f"calibrated from {log}: gen x2, logprob x1.5, ref x1.5, update_actor x0.5, sync x0.25" in out
    data = json.loads((tmp_path / "d.json").read_text())
    assert data["calibration"]["factors"] == pytest.approx(K)
    assert data["calibration"]["uncalibrated"] == {}
    assert any(n.startswith(f"calibrated from {log}") for n in data["notes"])
    rows = {r["prompts"]: r["step"] for r in data["rows"]}
    # at the log's batch the calibrated phases are the logged ones, and so is the step
    at = rows[8]
    assert at["gen_s"] == pytest.approx(logged["gen"])
    assert at["logprob_s"] == pytest.approx(logged["logprob"] + logged["ref"])
    assert at["train_s"] == pytest.approx(logged["update_actor"])
    assert at["sync_s"] == pytest.approx(logged["sync"])
    assert at["step_s"] == pytest.approx(logged["step"])
    fit = {p["phase"]: p for p in data["run_logs"][0]["phases"]}
    assert all(fit[k]["calibrated_ratio"] == pytest.approx(1.0) for k in (*K, "step"))
    # at another batch each phase is the model's own time there, times the same factor
    raw = predicted(profile, 16)
    assert rows[16]["gen_s"] == pytest.approx(2.0 * raw.gen_s)
    assert rows[16]["train_s"] == pytest.approx(0.5 * raw.train_s)
    assert rows[16]["step_s"] == pytest.approx(2.0 * raw.gen_s + 1.5 * raw.logprob_s + 0.5 * raw.train_s
                                               + 0.25 * raw.sync_s)
    samples_per_s = {r["prompts"]: r["samples_per_s"] for r in data["rows"]}
    assert samples_per_s[16] == pytest.approx(64 / rows[16]["step_s"])


def test_a_calibration_is_checked_on_a_run_at_another_batch(profile, tmp_path, capsys):
    # two logs of one setup whose phases are the model's times K-fold: fitted at 8 prompts, checked at 16
    logs = {}
    for n in (8, 16):
        folder = tmp_path / str(n)
        folder.mkdir()
        logs[n] = k_times_log(folder, predicted(profile, n))[0]
    code, out, err = decide_cli(["--profile", profile, "--prompts", 16, "--log-prompts", 8, "--against-prompts", 16,
                                 *FLAGS, *DIST, "--calibrate-from", logs[8], "--against", logs[16],
                                 "--json", tmp_path / "d.json"], capsys)
    assert code == 0, err
    runs = json.loads((tmp_path / "d.json").read_text())["run_logs"]
    assert [r["prompts"] for r in runs] == [8, 16]
    checked = {p["phase"]: p for p in runs[1]["phases"]}
    assert checked["step"]["calibrated_ratio"] == pytest.approx(1.0, rel=1e-6)
    assert all(checked[k]["calibrated_ratio"] == pytest.approx(1.0, rel=1e-6) for k in K)
    code, out, err = decide_cli(["--profile", profile, "--prompts", 8, *FLAGS, *DIST, "--against", logs[8],
                                 "--against-prompts", 16], capsys)
    assert code == 2 and "--against-prompts goes with --calibrate-from LOG and --against LOG" in err


def test_ppo_critic_phases_and_a_phase_missing_from_the_log(profile, tmp_path, capsys):
    st = predicted(profile, 8, algo="ppo")
    # values is one forward pass of a critic the policy's size, logged here at a log-prob pass's time
    log = write_verl(tmp_path / "ppo.jsonl", {"gen": 3 * st.gen_s, "values": 2 * st.logprob_s / 2,
                                              "update_critic": 9.0, "step": 100.0})
    code, out, err = decide_cli(["--profile", profile, "--prompts", 8, *FLAGS, *DIST, "--algo", "ppo",
                                 "--calibrate-from", log, "--json", tmp_path / "d.json"], capsys)
    assert code == 0, err
    data = json.loads((tmp_path / "d.json").read_text())
    ph = {p["phase"]: p for p in data["run_logs"][0]["phases"]}
    # the predicted value pass is a log-prob pass without the RL loss's pass over the vocabulary (a value head)
    v = ph["values"]["predicted_s"]
    assert v < st.logprob_s / 2 and ph["values"]["ratio"] == pytest.approx(st.logprob_s / v)
    assert ph["values"]["predicted_s"] + ph["update_critic"]["predicted_s"] == pytest.approx(st.critic_s)
    assert ph["update_actor"]["status"] == "not logged" and ph["update_actor"]["logged"] is None
    assert "update_actor" in _row(out, "update_actor") and "not" in _row(out, "update_actor")
    cal = data["calibration"]
    assert set(cal["factors"]) == {"gen", "values", "update_critic"}
    # veRL logs no sync timer: its timing_s/gen holds the sync, so the gen factor covers both, counted once
    assert cal["uncalibrated"] == {"logprob": "not logged", "ref": "not logged", "update_actor": "not logged"}
    assert cal["sync_in_gen"] and ph["gen"]["predicted_s"] == pytest.approx(st.gen_s + st.sync_s)
    assert "uncalibrated (factor 1): logprob (not logged)" in out
    assert "gen is compared with the model's generation + sync" in out
    step = data["rows"][0]["step"]
    assert step["train_s"] == pytest.approx(st.train_s) and step["gen_s"] == pytest.approx(3 * st.gen_s)
    assert step["sync_s"] == 0
    assert step["critic_s"] == pytest.approx(2 * st.logprob_s / 2 + 9.0)


def test_a_grpo_model_names_the_critic_phases_it_does_not_have(profile, tmp_path, capsys):
    log = write_verl(tmp_path / "v.jsonl", {"gen": 10.0, "values": 2.0, "step": 20.0})
    code, out, err = decide_cli(["--profile", profile, "--prompts", 8, *FLAGS, *DIST, "--against", log], capsys)
    assert code == 0, err
    assert "not in the model: GRPO has no critic" in " ".join(_row(out, "values"))
    assert "in gen: veRL's timing_s/gen holds it" in " ".join(_row(out, "sync"))
    assert "not in the model" in " ".join(_row(out, "other"))  # step - gen - values


def test_response_lengths_default_to_the_logs(profile, tmp_path, capsys):
    log = write_verl(tmp_path / "v.jsonl", {"gen": 10.0, "step": 20.0},
                     extra={"response_length/mean": 180.0, "response_length/max": 400.0,
                            "response_length/clip_ratio": 0.0})
    code, out, err = decide_cli(["--profile", profile, "--prompts", 8, *FLAGS, "--against", log,
                                 "--json", tmp_path / "d.json"], capsys)
    assert code == 0, err
    assert f"(from run log {log}: per-step mean 180 tokens, max 400)" in out
    data = json.loads((tmp_path / "d.json").read_text())
    assert "mean 180 tokens" in data["run_logs"][0]["response_lengths"]
    assert any(n.startswith("response lengths for the decision from run log") for n in data["notes"])
    code, out, err = decide_cli(["--profile", profile, "--prompts", 8, *FLAGS, *DIST, "--against", log], capsys)
    assert "(from --response-dist" in out


def test_lengths_from_log_match_the_logged_clip_ratio_and_mean(tmp_path):
    # the logged mean is after the cut: the form holds the logged share at the cut and that mean
    log = write_verl(tmp_path / "v.jsonl", {"gen": 1.0}, extra={
        "response_length/mean": 300.0, "response_length/max": 1024.0, "response_length/clip_ratio": 0.02})
    dist, _ = lengths_from_log(load_run_log(log), responses=256)
    assert dist == "capped:mean=300,clip=0.02,max=1024"
    x = parse_length_dist(dist).sample(200_000, seed=1)
    assert x.mean() == pytest.approx(300, rel=0.01) and (x == 1024).mean() == pytest.approx(0.02, abs=0.002)


def test_a_log_whose_responses_all_run_to_the_cap_gives_that_length(tmp_path):
    # TRL with a model that never stops: every step's mean is its longest (one step with an early stop)
    state = {"log_history": [{"step": i, "step_time": 5.0, "completions/mean_length": m, "completions/max_length": 32.0,
                              "completions/min_length": lo, "completions/clipped_ratio": c}
                             for i, (m, lo, c) in enumerate([(32.0, 32.0, 1.0)] * 4 + [(31.7, 15.0, 0.98)], 1)]}
    log = tmp_path / "trainer_state.json"
    log.write_text(json.dumps(state))
    dist, why = lengths_from_log(load_run_log(log), responses=64)
    assert dist == "fixed:len=32" and "= the longest" in why and "100% at the cut" in why
    # a mean below the longest keeps a spread
    state["log_history"][0]["completions/mean_length"] = 20.0
    for h in state["log_history"]:
        h["completions/mean_length"], h["completions/clipped_ratio"] = 20.0, 0.0
    log.write_text(json.dumps(state))
    assert lengths_from_log(load_run_log(log), responses=64)[0].startswith("lognormal:mean=20,")


def test_a_run_config_beside_its_log_takes_the_logs_lengths(profile, tmp_path, capsys):
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text("per_device_train_batch_size: 8\nnum_generations: 4\nnum_processes: 2\nmax_completion_length: 512\n"
                   "gradient_checkpointing: false\n")
    log = write_verl(tmp_path / "v.jsonl", {"gen": 10.0, "step": 20.0},
                     extra={"response_length/mean": 180.0, "response_length/max": 400.0,
                            "response_length/clip_ratio": 0.0})
    args = ["--profile", profile, "--config", cfg, "--prompt-len", 128, "--against", log, "--log-prompts", 4]
    code, out, err = decide_cli(args, capsys)
    assert code == 0, err
    assert "response lengths from the log" in out and f"(from run log {log}: per-step mean 180 tokens, max 400)" in out
    # lengths the user gives still win over the log's, and then the config's listing does not claim the log's
    code, out, err = decide_cli([*args, *DIST], capsys)
    assert code == 0, err
    assert "(from --response-dist" in out and "response lengths from the log" not in out


def test_a_capped_form_keeps_the_mean_after_the_cut_where_a_lognormal_does_not():
    # a published run: mean 3,196 after a cut at 4,096 with 30% of responses at it
    capped = parse_length_dist("capped:mean=3196,clip=0.3,max=4096").sample(100_000, seed=2)
    assert capped.mean() == pytest.approx(3196, rel=0.01) and (capped == 4096).mean() == pytest.approx(0.3, abs=0.01)
    assert capped.max() == 4096 and (capped[capped < 4096] < 4096).all()
    cut = parse_length_dist("lognormal:mean=3196,sigma=0.6,max=4096").sample(100_000, seed=2)
    assert cut.mean() < 0.9 * 3196  # the mean before the cut: the cut one comes out shorter


def test_a_capped_form_without_a_share_takes_the_one_a_cut_lognormal_implies():
    """A published mean (after the cut) and the cap alone: the share at the cap is what a lognormal of sigma 0.6
    cut there holds when its mean after the cut is the published one; sampled, both come back."""
    from throughputlab.decide.lengths import censored_clip

    for mean, cap in ((3200, 3994), (745, 1434), (1019, 3969)):
        d = parse_length_dist(f"capped:mean={mean},max={cap}")
        assert d.clip_implied and d.clip == pytest.approx(censored_clip(mean, 0.6, cap))
        x = d.sample(200_000, seed=3)
        assert x.mean() == pytest.approx(mean, rel=0.01) and (x == cap).mean() == pytest.approx(d.clip, abs=0.005)
        # the same share from a lognormal drawn and cut: its mean after the cut is the given mean
        rng = np.random.default_rng(4)
        mu = np.log(cap) - 0.6 * NormalDist().inv_cdf(1 - d.clip)
        raw = np.minimum(rng.lognormal(mu, 0.6, 400_000), cap)
        assert raw.mean() == pytest.approx(mean, rel=0.01)
    # a mean near the cap puts much of the mass at it; a mean far below it, almost none
    assert parse_length_dist("capped:mean=3200,max=3994").clip > 0.4 > 0.01 > parse_length_dist(
        "capped:mean=1019,max=3969").clip
    assert "implied" in parse_length_dist("capped:mean=745,max=1434").describe()


@pytest.mark.parametrize("form, needle", [
    ("capped:mean=90,clip=0.5,max=192", "cannot hold 50.0% of the responses at 192"),
    ("capped:mean=200,clip=0.1,max=192", "must lie between"),
    ("capped:mean=150,clip=1.5,max=192", "clip is a share in [0, 1]"),
    ("capped:mean=200,max=192", "without clip the mean after the cut must lie between 1 and the cut 192"),
    ("capped:mean=150,clip=0.1,max=192,width=3", "unknown key(s) width"),
    ("capped:mean=x,clip=0.1,max=192", "must be numbers"),
])
def test_bad_capped_forms_name_the_problem(form, needle):
    with pytest.raises(UserError) as e:
        parse_length_dist(form)
    assert needle in str(e.value) and len(str(e.value).splitlines()) == 1


# ---------------------------------------------------------------- bad input


@pytest.mark.slow
def test_a_log_without_timing_keys_is_one_line_exit_2(profile, tmp_path):
    log = tmp_path / "val.jsonl"
    log.write_text('{"step": 1, "data": {"val-core/reward/mean@1": 0.2}}\n')
    r = run_cli("decide", "--profile", profile, "--prompts", "8", *FLAGS, *DIST, "--against", str(log))
    assert_user_error(r, str(log), "no timing keys", "timing_s/gen")


@pytest.mark.parametrize("args,needles", [
    (["--against", "missing.jsonl"], ["--against missing.jsonl", "no such file"]),
    (["--calibrate-from", "{csv}", "--log-format", "trl"], ["--calibrate-from", "TRL trainer_state.json", "not JSON"]),
    (["--against", "{csv}", "--log-format", "xyz"], ["--log-format", "xyz"]),
    (["--against", "{other}"], ["not a veRL", "--log-format verl|trl|csv"]),
    (["--against", "{verl}", "--prompts", "4,8"], ["several", "--log-prompts"]),
    (["--calibrate-from", "{verl}", "--placement", "search"], ["one placement", "--placement colocated"]),
    (["--log-format", "verl"], ["--log-format", "--against LOG"]),
    (["--against", "{csv}", "--log-column", "gen=nope"], ["--log-column gen=nope", "'nope'"]),
    (["--against", "{verl_nolen}"], ["no response lengths", "--response-dist"]),
])
def test_bad_log_input_is_one_line_exit_2(profile, tmp_path, capsys, args, needles):
    files = {"csv": tmp_path / "log.csv", "other": tmp_path / "other.json", "verl": tmp_path / "v.jsonl",
             "verl_nolen": tmp_path / "n.jsonl"}
    files["csv"].write_text("step,gen,step_time\n1,2.0,3.0\n")
    files["other"].write_text('{"benchmarks": []}')
    write_verl(files["verl"], {"gen": 1.0}, extra={"response_length/mean": 100.0})
    write_verl(files["verl_nolen"], {"gen": 1.0})
    args = [a.format(**files) for a in args]
    if "--prompts" not in args:
        args += ["--prompts", "8"]
    lengths = [] if str(files["verl_nolen"]) in args else DIST
    code, out, err = decide_cli(["--profile", profile, *FLAGS, *lengths, *args], capsys)
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    for n in needles:
        assert n.replace("several", "has 2 values") in err, (n, err)


def test_the_spread_from_a_logged_longest_puts_the_batch_longest_there():
    # veRL logs each step's longest response: the lognormal whose 1 - 1/(n+1) quantile is that longest, same mean
    n, mean, longest = 5120, 133.0, 554.0
    s = sigma_for_longest(mean, longest, 1 / (n + 1))
    mu = math.log(mean) - s * s / 2
    assert math.exp(mu + NormalDist().inv_cdf(1 - 1 / (n + 1)) * s) == pytest.approx(longest, rel=1e-9)
    assert 0.3 < s < 0.6  # narrower than the 0.6 default: a longest of 4.2x the mean among 5,120
    rng = np.random.default_rng(0)  # and sampled batches of n have about that longest
    tops = [rng.lognormal(mu, s, n).max() for _ in range(200)]
    assert np.median(tops) == pytest.approx(longest, rel=0.1)
    # the same longest among fewer responses needs a wider spread; a longest at the mean, none
    assert sigma_for_longest(mean, longest, 1 / 513) > s
    assert sigma_for_longest(mean, mean, 1 / (n + 1)) == 0.0
