"""The bench spec as a library: one set of defaults, layering, one-line errors, resume checks."""

import json
from pathlib import Path

import pytest

from throughputlab.bench import check_resumable, resume_base
from throughputlab.errors import UserError
from throughputlab.records.profile import Profile
from throughputlab.records.settings import DEFAULTS, BenchSpec, Measurement, SweepSettings
from throughputlab.spec import Layer, as_layer, differences, parse_set, read_spec_file, resolve, resume_differences

REPORTS = Path(__file__).resolve().parent.parent / "reports"
OLD = REPORTS / "cpu-amd-epyc-2026-11-29" / "demo-profile.json"  # written before the spec, without `rounds`


def test_one_set_of_defaults():
    d = DEFAULTS
    assert (d.model, d.generation.backend, d.training.backend) == ("demo", "hf", "torch")
    assert d.generation.concurrency == [1, 2, 4, 8, 16, 32, 64] and d.training.micro_batches == [1, 2, 4, 8]
    assert (d.generation.prompt_len, d.generation.output_len, d.training.seq_len) == (16, 8, 64)
    m = d.measurement
    assert (m.warmup, m.repeats, m.rounds, m.max_cv, m.max_remeasure, m.auto_cap) == (1, 1, 3, 0.10, 1, 1024)
    assert d.telemetry.enabled and d.telemetry.hz == 20.0
    assert Measurement() == d.measurement  # the sweep runner's hygiene is the spec's section
    s = SweepSettings(dtype="float32", device="cpu")
    assert (s.prompt_len, s.output_len, s.seq_len, s.warmup, s.repeats, s.max_cv) == (64, 32, 128, 1, 1, 0.10)
    assert s.rounds == 1  # what a profile without the key measured, not the spec's default


def test_layers_later_win_and_sections_merge():
    spec = resolve([Layer("--spec f", {"generation": {"prompt_len": 16, "output_len": 4}, "measurement": {"rounds": 2}}),
                    as_layer("options", {"generation.prompt_len": 12}),
                    parse_set("generation.prompt_len=8"), parse_set("generation.engine_args.enforce_eager=true")])
    assert spec.generation.prompt_len == 8 and spec.generation.output_len == 4 and spec.measurement.rounds == 2
    assert spec.generation.engine_args == {"enforce_eager": True}
    assert spec.generation.concurrency == DEFAULTS.generation.concurrency


@pytest.mark.parametrize("value,expected", [("auto", "auto"), ("4,1,2,2", [1, 2, 4]), ("[8, 1]", [1, 8]), ("3", [3])])
def test_sweep_lists_take_auto_lists_and_comma_text(value, expected):
    assert resolve([parse_set(f"generation.concurrency={value}")]).generation.concurrency == expected


@pytest.mark.parametrize("layer,fragment", [
    (lambda: parse_set("measurement.round=1"), "--set measurement.round=1: unknown key measurement.round; did you mean "
                                                "measurement.rounds?"),
    (lambda: parse_set("generation.output_len=1"), "--set generation.output_len=1: input should be greater than or "
                                                   "equal to 2 (got 1)"),
    (lambda: parse_set("training.effective_lr=maybe"), "training.effective_lr=maybe: input should be a valid boolean"),
    (lambda: parse_set("device=gpu"), "must be auto, cpu, cuda or cuda:N"),
    (lambda: as_layer("options", {"measurement.rounds": 0}, {"measurement.rounds": "--rounds"}),
     "--rounds: measurement.rounds: input should be greater than 0 (got 0)"),
    (lambda: Layer("--spec f.yaml", {"measurement": {"max_cv": "high"}}), "--spec f.yaml: measurement.max_cv: "),
    (lambda: Layer("--spec f.yaml", {"py_spy": {"points": [1, 0]}}), "--spec f.yaml: py_spy.points[1]: input should "
                                                                      "be greater than 0"),
])
def test_errors_name_the_source_and_key(layer, fragment):
    with pytest.raises(UserError) as e:
        resolve([layer()])
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_spec_file_errors(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        read_spec_file(tmp_path / "none.yaml")
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "tiny",\n "only": }')
    with pytest.raises(UserError, match="not valid JSON at line 2"):
        read_spec_file(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing set\ngeneration:\n")  # an empty section is no section
    assert resolve([read_spec_file(empty)]) == DEFAULTS


def test_differences_skip_the_instruments():
    a = resolve([parse_set("py_spy.enabled=true")])
    b = resolve([parse_set("generation.prompt_len=8"), parse_set("py_spy.points=[4]")])
    assert differences(a, b) == {"generation.prompt_len": (16, 8)}


def test_resume_may_grow_the_measured_axes_only():
    base = resolve([parse_set("generation.concurrency=[1,4]"), parse_set("training.micro_batches=[1,2]")])

    def grown(*items):
        return resume_differences(base, resolve([parse_set(i) for i in items]))

    # more values on each axis: allowed, with what is added; the default prompt counts as measured
    assert grown("generation.concurrency=[1,4,16]", "generation.contexts=[16,2048]",
                 "training.micro_batches=[1,2,8]", "training.seq_lens=[64,1024]") == (
        {}, {"generation.concurrency": [16], "generation.contexts": [2048], "training.micro_batches": [8],
             "training.seq_lens": [1024]})
    assert grown("generation.concurrency=[4,1]", "training.micro_batches=[1,2]") == ({}, {})  # the same sweep
    # a dropped value, a grid without the stored prompt, an auto sweep or another length: refused
    for items, key in ((["generation.concurrency=[4,16]", "training.micro_batches=[1,2]"], "generation.concurrency"),
                       (["generation.concurrency=[1,4]", "training.micro_batches=[1,2]",
                         "generation.contexts=[128,2048]"], "generation.contexts"),
                       (["generation.concurrency=auto", "training.micro_batches=[1,2]"], "generation.concurrency"),
                       (["generation.concurrency=[1,4]", "training.micro_batches=[1,2]",
                         "generation.prompt_len=128"], "generation.prompt_len")):
        refused, extended = grown(*items)
        assert key in refused and key not in extended
    # more rounds add samples to every stored point; fewer are refused
    same = ["generation.concurrency=[1,4]", "training.micro_batches=[1,2]"]
    assert grown(*same, "measurement.rounds=5") == ({}, {"measurement.rounds": [4, 5]})
    refused, extended = grown(*same, "measurement.rounds=1")
    assert "measurement.rounds" in refused and not extended


def test_every_profile_under_reports_still_loads():
    paths = [p for p in sorted(REPORTS.rglob("*.json")) if "schema_version" in json.loads(p.read_text())]
    assert len(paths) >= 10
    for p in paths:
        raw = json.loads(p.read_text())
        # written before the spec existed: no spec; later ones keep theirs
        assert (Profile.load(p).spec is None) == (raw.get("spec") is None), p


def test_old_profile_resume_base_and_check():
    base = resume_base(OLD)
    assert base["model"] == "demo" and base["generation"]["prompt_len"] == 64
    assert base["measurement"]["rounds"] == 1  # no `rounds` in the file: it measured in one pass
    old = Profile.load(OLD)
    same = resolve([], base=base)
    check_resumable(old, same, "demo", old.settings.dtype, old.settings.device)
    longer = resolve([parse_set("generation.prompt_len=256")], base=base)
    with pytest.raises(UserError, match="prompt_len=64.*prompt_len=256"):
        check_resumable(old, longer, "demo", old.settings.dtype, old.settings.device)
    with pytest.raises(UserError, match="dtype"):
        check_resumable(old, same, "demo", "float16", old.settings.device)


def test_stored_spec_round_trips_in_the_profile(tmp_path):
    p = Profile.load(OLD)
    p.spec = resolve([parse_set("model=tiny"), parse_set("generation.concurrency=auto")])
    p.save(tmp_path / "p.json")
    q = Profile.load(tmp_path / "p.json")
    assert q.spec == p.spec and isinstance(q.spec, BenchSpec) and q.spec.generation.concurrency == "auto"
    raw = json.loads((tmp_path / "p.json").read_text())
    raw["spec"]["measurement"]["rounds"] = "three"
    (tmp_path / "p.json").write_text(json.dumps(raw))
    with pytest.raises(UserError, match="malformed at spec.measurement.rounds"):
        Profile.load(tmp_path / "p.json")
