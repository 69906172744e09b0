"""RL run logs (throughputlab.imports.runlog): veRL's file logger, TRL's trainer_state.json and a
CSV give per-phase medians, p10/p90 and counts computed by hand from the fixtures' phase times
(make_fixtures.py: step i = 1..20 has gen 50+(i-1) s, logprob 10+(i-1)/2, ref 8, values 6,
update_critic 12, update_actor 20+(i-1)/2, weight sync 3 (9 at step 7), step = the sum + 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import assert_user_error, run_cli
from throughputlab.errors import UserError
from throughputlab.imports.runlog import PHASES, load_run_log

DATA = Path(__file__).parent / "data" / "imports"

# gen: 50..69; p10 of 20 values sits at position 1.9 (51.9), p90 at 17.1 (67.1)
GEN = dict(n=20, median=59.5, p10=51.9, p90=67.1, min=50.0, max=69.0)
# step = 110 + 2k for k = 0..19, except k = 6 (122 + 6 = 128): sorted, the middle two are 128 and 130
STEP = dict(n=20, median=129.0, min=110.0, max=148.0)


def _check(spread, expected):
    for k, v in expected.items():
        assert getattr(spread, k) == pytest.approx(v), (k, getattr(spread, k), v)


def test_verl_file_logger():
    log = load_run_log(DATA / "verl_metrics.jsonl")
    assert log.format == "verl" and len(log.steps) == 20 and log.skipped == 1  # step 0: validation only
    ph = log.phase_summary()
    assert list(ph) == list(PHASES)  # every phase, in order
    _check(ph["gen"], GEN)
    _check(ph["step"], STEP)
    _check(ph["logprob"], dict(median=14.75, p10=10.95, p90=18.55))
    _check(ph["sync"], dict(median=3.0, p10=3.0, p90=3.0, max=9.0, mean=3.3))
    _check(ph["ref"], dict(median=8.0, p10=8.0, p90=8.0, n=20))
    assert log.keys["sync"] == "timing_s/update_weights" and log.keys["logprob"] == "timing_s/old_log_prob"
    # response length/mean is 300 + 10(i-1): median 395, p10 319, p90 471
    _check(log.response_length_summary(), dict(n=20, median=395.0, p10=319.0, p90=471.0))
    extra = log.extra_summary()
    _check(extra["response_length_max"], dict(median=1024.0))
    _check(extra["max_memory_allocated_gb"], dict(median=61.5))
    assert extra["tokens"].median == pytest.approx(1_000_000 + 1000 * 10.5)


def test_trl_trainer_state():
    log = load_run_log(DATA / "trl_trainer_state.json")
    assert log.format == "trl" and log.skipped == 1  # the final train_runtime entry
    ph = log.phase_summary()
    assert list(ph) == ["step"]
    _check(ph["step"], STEP)
    _check(log.response_length_summary(), dict(median=395.0))
    # num_tokens is cumulative (adds 32768 + 64 i at step i): per step 32768 + 64 i for i = 2..20
    _check(log.extra_summary()["tokens"], dict(n=19, median=32768 + 64 * 11))


def test_csv_with_and_without_renames():
    log = load_run_log(DATA / "runlog.csv")
    assert log.format == "csv"
    ph = log.phase_summary()
    assert list(ph) == ["gen", "logprob", "ref", "update_actor", "sync", "step"]
    _check(ph["gen"], GEN)
    _check(ph["step"], STEP)
    assert log.keys["step"] == "step_time"
    renamed = load_run_log(DATA / "runlog_renamed.csv", columns={"gen": "rollout_seconds"})
    _check(renamed.phase_summary()["gen"], GEN)
    assert "gen" not in load_run_log(DATA / "runlog_renamed.csv").phase_summary()


def test_csv_step_column_rename_and_verl_key_rename(tmp_path):
    text = (DATA / "runlog.csv").read_text().replace("step,", "iteration,", 1)
    (tmp_path / "it.csv").write_text(text)
    log = load_run_log(tmp_path / "it.csv", columns={"step_index": "iteration"})
    assert [s.step for s in log.steps] == list(range(1, 21))
    lines = (DATA / "verl_metrics.jsonl").read_text().replace("timing_s/gen", "timing_s/generate_sequences")
    (tmp_path / "v.jsonl").write_text(lines)
    assert "gen" not in load_run_log(tmp_path / "v.jsonl").phase_summary()
    log = load_run_log(tmp_path / "v.jsonl", columns={"gen": "timing_s/generate_sequences"})
    _check(log.phase_summary()["gen"], GEN)


def test_repeated_step_keeps_the_later_record(tmp_path):
    lines = (DATA / "verl_metrics.jsonl").read_text().splitlines()
    again = json.loads(lines[3])  # step 3
    again["data"]["timing_s/gen"] = 500.0
    (tmp_path / "resumed.jsonl").write_text("\n".join([*lines, json.dumps(again)]) + "\n")
    log = load_run_log(tmp_path / "resumed.jsonl")
    assert log.duplicates == 1 and len(log.steps) == 20
    assert next(s for s in log.steps if s.step == 3).phases_s["gen"] == 500.0


@pytest.mark.slow
def test_cli_prints_phases_and_writes_json(tmp_path):
    out = tmp_path / "phases.json"
    r = run_cli("import", "runlog", str(DATA / "verl_metrics.jsonl"), "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "timing_s/update_weights" in r.stdout and "59.500" in r.stdout
    assert "1 record(s) without phase times" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["phases"]["gen"]["median"] == 59.5 and len(doc["log"]["steps"]) == 20
    r = run_cli("import", "runlog", str(DATA / "runlog_renamed.csv"), "--column", "gen=rollout_seconds")
    assert r.returncode == 0, r.stderr
    assert "rollout_seconds" in r.stdout


def _verl_without_timing(t: Path) -> Path:
    lines = [json.loads(x) for x in (DATA / "verl_metrics.jsonl").read_text().splitlines()]
    for rec in lines:
        rec["data"] = {k: v for k, v in rec["data"].items() if not k.startswith("timing_s/")}
    path = t / "no_timing.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _write(t: Path, name: str, text: str) -> Path:
    (t / name).write_text(text)
    return t / name


BAD = {
    "no timing keys": (_verl_without_timing, (), ["no_timing.jsonl", "no timing keys", "timing_s/gen"]),
    "empty file": (lambda t: _write(t, "empty.jsonl", "\n"), (), ["empty.jsonl", "empty file"]),
    "another format": (lambda t: DATA / "vllm_serve_c8.json", (), ["vllm_serve_c8.json", "not a veRL"]),
    "trl without log_history": (lambda t: _write(t, "state.json", '{"global_step": 3}'), ("--format", "trl"),
                                ["state.json", "log_history"]),
    "trl without step_time": (lambda t: _write(t, "trainer_state.json", json.dumps(
        {"log_history": [{"step": 1, "loss": 0.3}, {"step": 2, "loss": 0.2}]})), (),
        ["trainer_state.json", "no timing keys", "step_time"]),
    "verl record without data": (
        lambda t: _write(t, "m.jsonl", '{"step": 1, "data": {"timing_s/gen": 1}}\n{"step": 2}\n'), (),
        ["m.jsonl record 2", "step and data"]),
    "csv without step": (lambda t: _write(t, "r.csv", "gen,step_time\n1,2\n"), (), ["r.csv", "no column step"]),
    "csv without phases": (lambda t: _write(t, "r.csv", "step,loss\n1,0.3\n"), (), ["r.csv", "no timing keys"]),
    "csv bad number": (lambda t: _write(t, "r.csv", "step,gen\n1,2.0\n2,slow\n"), (), ["r.csv line 3", "gen", "slow"]),
    "negative time": (lambda t: _write(t, "r.csv", "step,gen\n1,-2.0\n"), (), ["r.csv line 2", "negative"]),
    "unknown column name": (lambda t: DATA / "runlog.csv", ("--column", "rollout=gen"),
                            ["--column rollout=gen", "unknown name"]),
    "column not in the file": (lambda t: DATA / "runlog.csv", ("--column", "gen=rollout_seconds"),
                               ["--column gen=rollout_seconds", "runlog.csv"]),
    "missing file": (lambda t: t / "absent.jsonl", (), ["absent.jsonl", "no such file"]),
    "binary file": (lambda t: (t / "b.jsonl").write_bytes(b"\xff\xfe\x00\x01") and t / "b.jsonl", (),
                    ["b.jsonl", "not a text file"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD))
def test_bad_run_log_one_line_error(tmp_path, case):
    make, extra, fragments = BAD[case]
    assert_user_error(run_cli("import", "runlog", str(make(tmp_path)), *extra), *fragments)


def test_library_rejects_unknown_format():
    with pytest.raises(UserError, match="--format wandb"):
        load_run_log(DATA / "runlog.csv", fmt="wandb")
