"""The decision table and recommendation: the published-study ranking, parametric N*, the
CLI end to end (text, JSON, HTML) and its one-line errors."""

from __future__ import annotations

import json
import math
import types

import pytest

from _decide_curves import write_curves
from throughputlab.decide.calculator import DecideSpec, decide, rank
from throughputlab.decide.curves import CurvesSpec, load_curves
from throughputlab.decide.decision import Row
from throughputlab.errors import UserError
from throughputlab.models import resolve_model
from throughputlab.roofline import Costs
from throughputlab.throughput import DecodeParams, ThroughputModel, TrainParams

# GRPO on Qwen3-30B-A3B: 128 prompts/step 11.90 h to target; 1024 with sqrt-retuned lr 8.42 h
# (-29%); 2048 14.68 h; throughput up to 2.29x. The untuned 1024 run is slower than the baseline.
STUDY_HOURS = {"128": 11.90, "1024 sqrt": 8.42, "2048 sqrt": 14.68, "1024 untuned": 14.0}
STUDY_GAIN = {"128": 1.0, "1024 sqrt": 2.0, "2048 sqrt": 2.29, "1024 untuned": 2.0}
PROMPTS = {"128": 128, "1024 sqrt": 1024, "2048 sqrt": 2048, "1024 untuned": 1024}


def study_rows(q0: float = 40.0) -> list[Row]:
    rows = []
    for label, hours in STUDY_HOURS.items():
        q = q0 * STUDY_GAIN[label]
        rows.append(Row(label=label, prompts=PROMPTS[label], group=8, batch_samples=PROMPTS[label] * 8,
                        samples_per_s=q, nstar_samples=hours * 3600 * q))
    return rows


def test_published_study_ranking():
    rows, rec, _ = rank(study_rows(), baseline_index=0)
    by = {r.label: r for r in rows}
    order = sorted((r for r in rows if r.time_to_target_s), key=lambda r: r.time_to_target_s)
    assert [r.label for r in order] == sorted(STUDY_HOURS, key=STUDY_HOURS.get)
    assert rec.label == "1024 sqrt"
    assert rec.time_ratio == pytest.approx(8.42 / 11.90)  # the 29% cut
    assert by["1024 sqrt"].beats_baseline is True
    assert by["2048 sqrt"].beats_baseline is False  # higher throughput, but a larger samples penalty
    assert by["1024 untuned"].beats_baseline is False
    assert by["1024 untuned"].throughput_gain > 1  # slower despite the higher throughput
    assert by["2048 sqrt"].throughput_gain == pytest.approx(2.29)
    assert rec.margin == pytest.approx(11.90 / 8.42 - 1)
    assert rec.runner_up == "128"
    assert any("overtake" in w for w in rec.what_would_change)


def test_published_study_through_learning_curves(tmp_path):
    q0 = 40.0
    q = {128 * 8: q0, 1024 * 8: 2.0 * q0, 2048 * 8: 2.29 * q0}
    # N* = T * q, in responses; the untuned 1024 run used the baseline's lr
    configs = [(128 * 8, 1e-6, 11.90 * 3600 * q[1024]), (1024 * 8, math.sqrt(8) * 1e-6, 8.42 * 3600 * q[8192]),
               (2048 * 8, 4e-6, 14.68 * 3600 * q[16384]), (1024 * 8, 1e-6, 14.0 * 3600 * q[8192])]
    p = write_curves(tmp_path / "study.csv", configs, until=3 * max(c[2] for c in configs))
    curves = load_curves(CurvesSpec(path=str(p), smoothing=0.0), 0.7, "max", baseline_batch=1024)
    rows = []
    for c in curves.configs:
        rows.append(Row(label=c.label, prompts=int(c.batch / 8), group=8, batch_samples=c.batch,
                        samples_per_s=q[c.batch], nstar_samples=c.nstar_samples))
    rows, rec, _ = rank(rows, 0)
    ranked = sorted(rows, key=lambda r: r.time_to_target_s)
    assert [(r.prompts, r.label.endswith("2.83e-06")) for r in ranked][:2] == [(1024, True), (128, False)]
    assert ranked[-1].prompts == 2048
    untuned = next(r for r in rows if r.prompts == 1024 and "1e-06" in r.label)
    assert untuned.beats_baseline is False and untuned.throughput_gain > 1
    assert rec.time_ratio == pytest.approx(8.42 / 11.90, rel=0.01)


# ---------------------------------------------------------------- from a throughput model


def model() -> ThroughputModel:
    return ThroughputModel(
        source="analytic", costs=Costs.from_spec(resolve_model("demo").spec, 4),
        decode=DecodeParams(t0_s=2e-3, bw_bytes_per_s=10e9, phi_flops_per_s=80e9),
        train=TrainParams(t0_s=0.01, phi_flops_per_s=50e9, optimizer_step_s=0.2, mem0_bytes=2e9,
                          mem_per_sample_bytes=0.25e9, device_memory_bytes=8e9),
        max_num_seqs=64)


SHAPE = {"prompt_len": 64, "response": {"dist": "lognormal:mean=64,sigma=0.6,max=256"}}


def test_flat_nstar_lets_throughput_decide():
    spec = DecideSpec.model_validate({"prompts": [2, 4, 8, 16], "group": 4, "shape": SHAPE,
                                      "samples": {"nstar": "flat"}, "lr": {"ref": 1e-6}})
    d = decide(spec, model())
    q = {r.prompts: r.samples_per_s for r in d.rows}
    assert d.recommendation.prompts == max(q, key=q.get)
    assert all(r.time_to_target_s is None for r in d.rows)  # flat without N: only ratios are known
    assert all(r.samples_penalty == 1.0 for r in d.rows)
    assert any("flat" in w for w in d.recommendation.what_would_change)
    lr = {r.prompts: r.lr for r in d.rows}
    assert lr[8] == pytest.approx(2 * lr[2])  # sqrt rule, from the baseline (smallest) batch


def test_mcandlish_penalty_can_reverse_the_throughput_gain():
    base = {"prompts": [2, 4, 8, 16], "group": 4, "shape": SHAPE}
    gentle = decide(DecideSpec.model_validate({**base, "samples": {"nstar": "mcandlish:N_min=1e5,B_noise=1e6"}}), model())
    steep = decide(DecideSpec.model_validate({**base, "samples": {"nstar": "mcandlish:N_min=1e5,B_noise=2"}}), model())
    assert gentle.recommendation.prompts > steep.recommendation.prompts
    for r in steep.rows:
        if r.samples_penalty is not None and not r.is_baseline:
            assert r.beats_baseline == (r.throughput_gain > r.samples_penalty)
            assert r.time_ratio == pytest.approx(r.samples_penalty / r.throughput_gain)


def test_no_samples_source_is_a_user_error():
    spec = DecideSpec.model_validate({"prompts": [2], "shape": SHAPE, "samples": {}})
    with pytest.raises(UserError, match="no source"):
        decide(spec, model())


# ---------------------------------------------------------------- CLI


@pytest.fixture
def fake_profile(monkeypatch, tmp_path):
    import throughputlab.fit.load
    import throughputlab.records.profile

    monkeypatch.setattr(throughputlab.records.profile.Profile, "load",
                        classmethod(lambda cls, p: types.SimpleNamespace(
                            engine=None, bytes_per_param=4, model=resolve_model("demo").spec, fit=None,
                            kind="predicted", hardware=types.SimpleNamespace(device_type="cpu"))))
    monkeypatch.setattr(throughputlab.fit.load, "load_or_fit",
                        lambda prof: types.SimpleNamespace(model=model(), generation=None))
    return tmp_path / "prof.json"


def run_cli(args, capsys):
    from throughputlab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["decide", *map(str, args)])
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


@pytest.mark.slow
def test_cli_end_to_end_with_spec_file(fake_profile, tmp_path, capsys):
    curves = write_curves(tmp_path / "c.csv", [(16, 1e-6, 3e4), (32, 1.41e-6, 3e4), (64, 1e-6, 9e4)])
    spec = tmp_path / "shape.yaml"
    spec.write_text("group: 4\nsample_unit: responses\nshape:\n  prompt_len: 64\n  algo: ppo\n"
                    "  train: {epochs: 2, mini_batches: 2}\n")
    code, out, err = run_cli(["--spec", spec, "--profile", fake_profile, "--response-dist",
                              "lognormal:mean=64,sigma=0.6,max=256", "--curves", curves, "--target", 0.7,
                              "--json", tmp_path / "d.json", "--html", tmp_path / "d.html"], capsys)
    assert code == 0, err
    assert "Recommendation:" in out
    data = json.loads((tmp_path / "d.json").read_text())
    assert {r["prompts"] for r in data["rows"]} == {4, 8, 16}
    assert all(r["step"]["critic_s"] > 0 for r in data["rows"])
    html = (tmp_path / "d.html").read_text()
    assert "Throughput gain against samples penalty" in html and "Learning curves" in html


@pytest.mark.slow
@pytest.mark.parametrize("case,needle", [
    ("missing", "lacks column(s)"),
    ("never", "never reached"),
    ("one_run", "one run only"),
])
def test_cli_malformed_curves_one_line_exit_2(fake_profile, tmp_path, capsys, case, needle):
    p = tmp_path / "c.csv"
    if case == "missing":
        write_curves(p, [(16, 1e-6, 1e4), (32, 1e-6, 1e4)], columns={"samples": "tokens", "step": "x"})
    elif case == "one_run":
        write_curves(p, [(16, 1e-6, 1e4)], seeds=1)
    else:
        write_curves(p, [(16, 1e-6, 1e4), (32, 1e-6, 1e4)])
    target = 2.0 if case == "never" else 0.7
    code, out, err = run_cli(["--profile", fake_profile, "--prompts", "4,8", "--group", 4, "--prompt-len", 64,
                              "--response-dist", "fixed:len=16", "--curves", p, "--target", target], capsys)
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_target_not_reached_by_one_configuration_is_not_a_number(fake_profile, tmp_path, capsys):
    p = write_curves(tmp_path / "c.csv", [(16, 1e-6, 1e4), (32, 1e-6, 1e7)], until=4e4)
    code, out, err = run_cli(["--profile", fake_profile, "--prompts", "4,8", "--group", 4, "--prompt-len", 64,
                              "--response-dist", "fixed:len=16", "--curves", p, "--target", 0.7,
                              "--json", tmp_path / "d.json"], capsys)
    assert code == 0, err
    assert "not reached" in out
    row = [r for r in json.loads((tmp_path / "d.json").read_text())["rows"] if r["prompts"] == 8][0]
    assert row["nstar_samples"] is None and row["time_to_target_s"] is None
    assert row["nstar_status"] == "not reached"


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (["--prompts", "4,x"], "--prompts"),
    (["--response-dist", "fixed:len=16", "--response-lengths", "f.txt"], "not both"),
    (["--nstar", "cubic"], "--nstar"),
])
def test_cli_bad_flags(fake_profile, capsys, args, needle):
    code, out, err = run_cli(["--profile", fake_profile, "--prompt-len", 64, *args], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_note_says_when_rollouts_read_far_more_cached_tokens_than_were_measured():
    from throughputlab.decide.notes import cached_tokens_read

    spec = DecideSpec.model_validate({"prompts": [2, 32], "group": 4, "shape": SHAPE, "samples": {"nstar": "flat"}})
    fitted = model().model_copy(update={"source": "fit"})
    # measured up to 64 sequences at context 72 (the default bench's largest point): 64 sequences
    # at prompt 64 + up to 256 tokens read several times that
    measured = 64 * 72.0
    fitted.decode = fitted.decode.model_copy(update={"measured_cached_tokens": measured})
    d = decide(spec, fitted)
    read = max(cached_tokens_read(r) for r in d.rows)
    assert read > 2 * measured
    note = next(n for n in d.notes if n.startswith("context:"))
    assert f"{read / measured:.0f}x" in note and "--contexts" in note
    # a profile measured at those contexts, a prediction, or a fit stored before the field: no note
    wide = fitted.model_copy(update={"decode": fitted.decode.model_copy(update={"measured_cached_tokens": read})})
    older = fitted.model_copy(update={"decode": fitted.decode.model_copy(update={"measured_cached_tokens": None})})
    for m in (wide, older, model()):
        assert not any(n.startswith("context:") for n in decide(spec, m).notes)


@pytest.mark.slow
def test_fit_records_the_most_cached_tokens_a_measured_step_read():
    from pathlib import Path

    from throughputlab.fit import fit_profile
    from throughputlab.records.profile import Profile

    prof = Profile.load(Path(__file__).resolve().parent.parent / "reports" / "cpu-intel-xeon-2026-12-01"
                        / "context_holdout_vllm.json")
    r = fit_profile(prof, bootstrap=0)
    ok = [p for p in prof.generation if p.status == "ok"]
    assert r.model.decode.measured_cached_tokens == pytest.approx(
        max(p.concurrency * (p.prompt_len + p.output_len / 2) for p in ok))


@pytest.mark.slow
def test_a_profile_whose_compute_rate_is_a_floor_is_said_to_favour_small_batches(tmp_path):
    from _synth import make_profile
    from throughputlab.decide.calculator import decide_from_spec

    probe = {"hidden_size": 64, "intermediate_size": 64}  # the overhead probe: BW identified, PHI a floor

    def notes(concurrencies):
        path = tmp_path / f"p{len(concurrencies)}.json"
        make_profile(concurrencies=concurrencies, probe=probe, noise=0.005).save(path)
        spec = DecideSpec.model_validate({"profile": str(path), "prompts": [2, 8], "group": 2, "shape": {
            "prompt_len": 64, "response": {"dist": "fixed:len=32"}}, "samples": {"nstar": "flat"}, "lr": {"ref": 1e-6}})
        return " ".join(decide_from_spec(spec)[0].notes)

    assert "(up to 4) was memory-bound, so its compute rate is only a floor" in notes((1, 2, 4))
    assert "only a floor" not in notes((1, 2, 4, 8, 16, 32, 64))


@pytest.mark.slow
def test_a_generation_only_profile_asks_for_a_training_profile(tmp_path):
    from _synth import make_profile
    from throughputlab.decide.calculator import decide_from_spec

    path = tmp_path / "gen.json"
    make_profile(concurrencies=(1, 2, 4, 8), micro_batches=()).save(path)
    spec = DecideSpec.model_validate({"profile": str(path), "prompts": [2, 8], "group": 2})
    with pytest.raises(UserError, match="has no training part .* name one as train_profile in the --spec file"):
        decide_from_spec(spec)
