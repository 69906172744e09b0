"""Profile: round trip, derived medians, pandas views, and one-line errors for bad files."""

import json

import pytest

from throughputlab.errors import UserError
from throughputlab.models import resolve_model
from throughputlab.records.machine import Environment, Hardware
from throughputlab.records.profile import GenPoint, GenSample, Profile, TrainPoint, TrainSample
from throughputlab.records.settings import SweepSettings


def make_profile() -> Profile:
    p = Profile(model=resolve_model("tiny").spec, hardware=Hardware(device_type="cpu", device_name="test cpu"),
                environment=Environment(python="3", platform="x", hostname="h"),
                settings=SweepSettings(dtype="float32", device="cpu"))
    p.add_point(GenPoint(backend="hf", concurrency=4, prompt_len=8, output_len=5, status="ok", samples=[
        GenSample(total_s=2.0, output_tokens=20, prefill_s=0.4, decode_s=1.6, decode_step_s=[0.4, 0.4, 0.4, 0.4]),
        GenSample(total_s=1.0, output_tokens=20, prefill_s=0.2, decode_s=0.8, decode_step_s=[0.2, 0.2, 0.2, 0.2]),
        GenSample(total_s=4.0, output_tokens=20, prefill_s=0.8, decode_s=3.2, decode_step_s=[0.8, 0.8, 0.8, 0.8]),
    ]))
    p.add_point(TrainPoint(backend="torch", micro_batch=2, seq_len=10, status="ok",
                           samples=[TrainSample(step_s=0.5), TrainSample(step_s=1.0)]))
    p.add_point(TrainPoint(backend="torch", micro_batch=64, seq_len=10, status="oom", error="RuntimeError: x"))
    return p


def test_derived_values_are_medians_of_raw_samples():
    p = make_profile()
    g = p.generation[0]
    assert g.tokens_per_s == pytest.approx(10.0)  # median of 10, 20, 5
    assert g.decode_step_s == pytest.approx(0.4)
    assert g.decode_tokens_per_s == pytest.approx(10.0)
    assert p.training[0].tokens_per_s == pytest.approx((40 + 20) / 2)


def test_round_trip_and_dataframes(tmp_path):
    p = make_profile()
    path = tmp_path / "p.json"
    p.save(path)
    q = Profile.load(path)
    assert q.model_dump() == p.model_dump()
    gdf, tdf = q.generation_df(), q.training_df()
    assert list(gdf.concurrency) == [4] and gdf.decode_step_ms.iloc[0] == pytest.approx(400)
    assert list(tdf.status) == ["ok", "oom"]
    assert len(q.samples_df()) == 5


def test_add_point_replaces_same_key():
    p = make_profile()
    p.add_point(TrainPoint(backend="torch", micro_batch=2, seq_len=10, status="error", error="x"))
    assert [t.status for t in p.training] == ["error", "oom"]


@pytest.mark.parametrize("mutate,fragment", [
    (lambda text: text[: len(text) // 2], "not valid JSON"),
    (lambda text: text.replace('"schema_version": 1', '"schema_version": 99'), "schema_version 99"),
    (lambda text: json.dumps({**json.loads(text), "surprise": 1}), "malformed at surprise"),
    (lambda text: text.replace('"concurrency": 4', '"concurrency": "four"'), "malformed at generation.0.concurrency"),
    (lambda text: "[1, 2]", "not a throughputlab profile"),
])
def test_bad_files_give_one_line_errors(tmp_path, mutate, fragment):
    path = tmp_path / "p.json"
    make_profile().save(path)
    path.write_text(mutate(path.read_text()))
    with pytest.raises(UserError) as e:
        Profile.load(path)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_save_is_atomic_no_temp_files_left(tmp_path):
    p = make_profile()
    for _ in range(3):
        p.save(tmp_path / "p.json")
    assert [f.name for f in tmp_path.iterdir()] == ["p.json"]
