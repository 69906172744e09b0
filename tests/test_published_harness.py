"""The published-measurements harness (benchmarks/published.py): every data file parses with the
keys a case needs, every model and device resolves, and predict_case gives a figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from _harness import load_benchmark
from throughputlab.records.peaks import lookup

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "data" / "published"
FILES = sorted(DATA.glob("*.yaml"))


pub = load_benchmark("published")


@pytest.fixture(scope="module")
def cases_by_file():
    return {f.name: pub.load_file(f) for f in FILES}


def test_there_are_data_files():
    assert FILES, f"no data files under {DATA}"


def test_every_case_has_the_required_keys(cases_by_file):
    for name, cases in cases_by_file.items():
        assert cases, name
        for c in cases:
            for key in ("id", "kind", "model", "device", "metric", "published", "where"):
                assert c.get(key) not in (None, ""), f"{name}: {c.get('id')}: {key}"
            src = c["_source"]
            assert src.get("url") or (src.get("repo") and src.get("path")), f"{name}: no source url or repo path"
            assert c["published"] > 0, f"{name}: {c['id']}"


def test_ids_are_unique_within_each_file(cases_by_file):
    for name, cases in cases_by_file.items():
        ids = [c["id"] for c in cases]
        assert len(ids) == len(set(ids)), f"{name}: repeated ids {sorted({i for i in ids if ids.count(i) > 1})}"


def test_every_model_resolves(cases_by_file):
    models = {c["model"] for cases in cases_by_file.values() for c in cases}
    for m in sorted(models):
        assert pub.resolve_spec(m).params_total > 0, m


def test_every_device_has_a_datasheet_row(cases_by_file):
    devices = {c["device"] for cases in cases_by_file.values() for c in cases}
    assert [d for d in sorted(devices) if lookup(d) is None] == []


@pytest.mark.parametrize("file, case_id", [
    ("trtllm_perf_overview_v0.19.yaml", "llama3.1-8b/h200-fp8/tp1/128-2048"),  # offline, concurrency "max"
    ("vultr_cookbook_mi325x.yaml", "llama3.1-405b/mi325x/peak/2048-512"),  # total tokens/s, TP 8, 100 requests
    ("torchtitan_llama3_h100_202412.yaml", "llama3.1-8b/h100/128gpu/fsdp"),  # FSDP training over 16 nodes
])
def test_predict_case_gives_a_positive_figure(cases_by_file, file, case_id):
    case = next(c for c in cases_by_file[file] if c["id"] == case_id)
    result = pub.predict_case(case)
    assert isinstance(result, pub.Prediction), getattr(result, "reason", result)
    assert result.value > 0
    assert result.inputs["command"].startswith("throughputlab predict")


def test_a_case_it_cannot_predict_is_listed_with_its_reason(cases_by_file):
    case = {**cases_by_file["trtllm_perf_overview_v0.19.yaml"][0], "model": "no-such-model"}
    result = pub.predict_case(case)
    assert isinstance(result, pub.Skip) and "no-such-model" in result.reason


def test_a_malformed_file_exits_2_naming_the_file_and_the_key(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text(
        "source: {title: t, url: https://example.org}\n"
        "cases:\n- {id: a, kind: generation, model: llama3.1-8b, device: H100, metric: output_tokens_per_s,\n"
        "   where: here, prompt_len: 128, output_len: 128, concurrency: 1}\n")
    assert pub.main(["--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.yaml" in err and "'published'" in err


def _sweep_rows(cases_by_file, file, sweep):
    cases = [c for c in cases_by_file[file] if c.get("sweep") == sweep]
    return [pub.make_row(c, pub.predict_case(c)) for c in cases]


def test_a_sweep_still_rising_at_its_end_is_met_only_where_the_prediction_still_rises_too(cases_by_file):
    file = "mlenergy_v3_tp_h100_llama3.3-70b_405b-fp8_qwen3-32b-gpqa.yaml"
    rows = _sweep_rows(cases_by_file, file, "mlenergy/llama3.1-405b-fp8/h100/tp8")
    assert len(rows) >= 4 and all(r["predicted"] for r in rows)
    # the published curve: no plateau within the sweep (more than 5% up over its last 1.5x of concurrency)
    pts = [(r["concurrency"], r["published"]) for r in rows]
    assert pub._plateau_start(pts, max(pts)[1]) is None
    (g,) = pub.kv_groups(rows)
    assert g["published_start"] is None and g["met"], g
    assert "so does the predicted one" in g["start_note"]
    # the same sweep where the prediction flattened early (every point past the second at its value): not met
    flat = [dict(r) for r in sorted(rows, key=lambda r: r["concurrency"])]
    for r in flat[2:]:
        r["predicted"] = flat[1]["predicted"]
    (g,) = pub.kv_groups(flat)
    assert not g["met"] and "flattens from" in g["start_note"], g
