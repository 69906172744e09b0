"""`throughputlab import vllm-bench` and `import guidellm`: the fixtures in tests/data/imports
(written by make_fixtures.py from a known roofline curve) become profiles that load, fit and
render; bad files are one-line errors with exit code 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import assert_user_error, run_cli
from throughputlab.errors import UserError
from throughputlab.fit.schema import load_fit
from throughputlab.imports.common import resolve_target
from throughputlab.imports.guidellm import load_guidellm
from throughputlab.imports.vllm_bench import load_vllm_bench
from throughputlab.records.profile import Profile

DATA = Path(__file__).parent / "data" / "imports"
SWEEP = DATA / "vllm_sweep"
COMB = "SERVE--max_num_seqs=256-BENCH--max_concurrency={}"
TARGET = ("--model", "qwen2.5-7b", "--gpu", "h100")


@pytest.fixture(scope="module")
def target():
    return resolve_target("qwen2.5-7b", "h100")


def _run(c: int, n: int = 0) -> dict:
    return json.loads((SWEEP / COMB.format(c) / f"run={n}.json").read_text())


# ---------------------------------------------------------------- vllm bench


def test_sweep_folder_one_sample_per_run_with_its_totals(target):
    prof = load_vllm_bench([SWEEP], target)
    assert prof.kind == "imported"
    assert [p.concurrency for p in prof.generation] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    by_c = {p.concurrency: p for p in prof.generation}
    assert len(by_c[4].samples) == 2 and len(by_c[64].samples) == 2 and len(by_c[8].samples) == 1
    run = _run(8)
    (s,) = by_c[8].samples
    assert s.total_s == run["duration"] and s.output_tokens == run["total_output_tokens"]
    assert by_c[8].tokens_per_s == pytest.approx(run["output_throughput"], rel=1e-4)
    assert (by_c[8].prompt_len, by_c[8].output_len) == (512, 256)
    assert sorted(x.total_s for x in by_c[4].samples) == sorted([_run(4, 0)["duration"], _run(4, 1)["duration"]])
    # nothing the source did not measure is filled in
    for p in prof.generation:
        for x in p.samples:
            assert x.prefill_s is None and x.decode_s is None and not x.decode_step_s and not x.ttft_s and not x.itl_s
        assert p.peak_mem_bytes is None and p.telemetry is None
    assert p.measured_at == "2026-01-05T10:15:00"
    notes = " | ".join(prof.notes)
    assert str(SWEEP) in notes and "not measured by vllm bench serve" in notes and "--save-detailed" in notes
    assert "c=128" in notes and "TTFT ms mean" in notes and "max_num_seqs=256" in notes
    assert prof.hardware.device_name == "H100 SXM" and prof.hardware.datasheet is not None


def test_summary_csv_alone_gives_the_same_points(target):
    runs = load_vllm_bench([SWEEP], target).generation
    rows = load_vllm_bench([DATA / "vllm_sweep_summary_only"], target).generation
    assert [(p.concurrency, len(p.samples), p.tokens_per_s) for p in rows] == \
        [(p.concurrency, len(p.samples), pytest.approx(p.tokens_per_s, rel=1e-9)) for p in runs]


def test_detailed_run_keeps_successful_requests_latencies(target):
    prof = load_vllm_bench([DATA / "vllm_serve_c4_detailed.json", DATA / "vllm_serve_c8.json"], target)
    p4 = prof.generation[0]
    raw = json.loads((DATA / "vllm_serve_c4_detailed.json").read_text())
    (s,) = p4.samples
    assert s.ttft_s == raw["ttfts"][:7]  # the 8th request failed
    assert len(s.itl_s) == 7 * 255 and s.itl_s[:3] == raw["itls"][0][:3]
    assert p4.ttft_percentiles_s["p50"] == pytest.approx(sorted(raw["ttfts"][:7])[3])
    assert s.output_tokens == 7 * 256
    assert any("1 of 8 requests failed" in n for n in prof.notes)
    assert not prof.generation[1].samples[0].ttft_s


def test_concurrency_without_max_concurrency(target, tmp_path):
    inf = {**_run(8), "max_concurrency": None, "num_prompts": 300}
    (tmp_path / "inf.json").write_text(json.dumps(inf))
    rate = {**_run(32), "max_concurrency": None, "request_rate": 20.0}
    (tmp_path / "rate.json").write_text(json.dumps(rate))
    prof = load_vllm_bench([tmp_path / "inf.json", tmp_path / "rate.json"], target)
    little = rate["completed"] * rate["mean_e2el_ms"] / 1e3 / rate["duration"]  # Little's law
    assert sorted(p.concurrency for p in prof.generation) == sorted([300, round(little)])
    notes = " ".join(prof.notes)
    assert "taken as num_prompts" in notes and "mean requests in flight" in notes


def test_append_result_lines_and_throughput_file(target, tmp_path):
    lines = tmp_path / "appended.json"
    lines.write_text(json.dumps(_run(1)) + "\n" + json.dumps(_run(2)) + "\n")
    assert [p.concurrency for p in load_vllm_bench([lines], target).generation] == [1, 2]
    prof = load_vllm_bench([DATA / "vllm_throughput.json"], target, output_len=256, max_num_seqs=256)
    raw = json.loads((DATA / "vllm_throughput.json").read_text())
    (p,) = prof.generation
    assert (p.backend, p.concurrency, p.prompt_len, p.output_len) == ("vllm-throughput", 256, 512, 256)
    assert p.tokens_per_s == pytest.approx(raw["num_requests"] * 256 / raw["elapsed_time"])
    assert prof.engine.max_num_seqs == 256
    uncapped = load_vllm_bench([DATA / "vllm_throughput.json"], target, output_len=256)
    assert uncapped.generation[0].concurrency == raw["num_requests"]


# ---------------------------------------------------------------- guidellm


def test_guidellm_concurrency_by_strategy(target):
    prof = load_guidellm([DATA / "guidellm_benchmarks.json"], target)
    raw = json.loads((DATA / "guidellm_benchmarks.json").read_text())["benchmarks"]
    # synchronous 1, concurrent streams 2/8/32/128; throughput, constant and poisson: measured mean, rounded
    assert [p.concurrency for p in prof.generation] == [1, 2, 8, 23, 32, 47, 128, 236]
    by_c = {p.concurrency: p for p in prof.generation}
    for b, c in zip(raw, [1, 2, 8, 32, 128, 236, 47, 23]):
        assert by_c[c].tokens_per_s == pytest.approx(b["metrics"]["output_tokens_per_second"]["successful"]["mean"])
        assert by_c[c].samples[0].output_tokens == b["metrics"]["output_token_count"]["successful"]["total_sum"]
    assert by_c[1].samples[0].ttft_s == [r["time_to_first_token_ms"] / 1e3 for r in raw[0]["requests"]["successful"]]
    notes = " ".join(prof.notes)
    assert "measured mean request_concurrency 236.40" in notes and "poisson at 6 requests/s" in notes
    assert "not measured by GuideLLM" in notes and prof.settings.gen_backend == "guidellm"


def test_guidellm_older_report_layout(target, tmp_path):
    """args.strategy (GuideLLM before config), metrics not split by status, no total_sum."""
    raw = json.loads((DATA / "guidellm_benchmarks.json").read_text())
    old = []
    for b in raw["benchmarks"][:3]:
        metrics = {k: {kk: vv for kk, vv in v["successful"].items() if kk != "total_sum"}
                   for k, v in b["metrics"].items() if isinstance(v.get("successful"), dict)}
        old.append({"type_": "generative_benchmark", "args": {"strategy": b["config"]["strategy"]},
                    "worker": {"backend_model": "Qwen/Qwen2.5-7B-Instruct"},
                    "run_stats": {"start_time": b["start_time"]}, "metrics": metrics})
    (tmp_path / "old.json").write_text(json.dumps({"benchmarks": old}))
    prof = load_guidellm([tmp_path / "old.json"], target)
    assert [p.concurrency for p in prof.generation] == [1, 2, 8]
    assert prof.generation[0].samples[0].output_tokens == 32 * 256


# ---------------------------------------------------------------- through the CLI: load, fit, report


@pytest.mark.slow
@pytest.mark.parametrize("cmd,source", [("vllm-bench", SWEEP), ("guidellm", DATA / "guidellm_benchmarks.json")])
def test_import_fit_report(tmp_path, cmd, source):
    out = tmp_path / "imported.json"
    r = run_cli("import", cmd, str(source), *TARGET, "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert f"wrote {out}" in r.stdout and "tokens/s" in r.stdout
    prof = Profile.load(out)
    assert len(prof.generation) >= 8
    r = run_cli("fit", str(out), "--bootstrap", "0")
    assert r.returncode == 0, r.stderr
    fit = load_fit(Profile.load(out))
    assert fit.generation.target == "tokens_per_s"
    # the fixture follows a roofline curve (2% noise): held out, every point is predicted within 10%
    assert fit.generation.loo_max_abs_error < 0.10
    assert all(abs(p.fitted_tokens_per_s / p.measured_tokens_per_s - 1) < 0.06 for p in fit.generation.points)
    html = tmp_path / "report.html"
    r = run_cli("report", str(out), "-o", str(html))
    assert r.returncode == 0, r.stderr
    text = html.read_text()
    assert "qwen2.5-7b" in text and "imported from" in text


@pytest.mark.slow
def test_import_refuses_to_overwrite(tmp_path):
    out = tmp_path / "p.json"
    out.write_text("{}")
    assert_user_error(run_cli("import", "vllm-bench", str(SWEEP), *TARGET, "-o", str(out)), str(out), "--force")
    r = run_cli("import", "vllm-bench", str(DATA / "vllm_serve_c8.json"), *TARGET, "-o", str(out), "--force")
    assert r.returncode == 0, r.stderr
    assert Profile.load(out).generation[0].concurrency == 8


# ---------------------------------------------------------------- bad files


def _write(tmp_path: Path, name: str, content) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def _drop(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


def _two_models(tmp_path: Path) -> Path:
    _write(tmp_path, "runs/a.json", _run(8))
    _write(tmp_path, "runs/b.json", {**_run(16), "model_id": "meta-llama/Llama-3.1-8B-Instruct"})
    return tmp_path / "runs"


def _two_servers(tmp_path: Path) -> Path:
    for name in ("SERVE--max_num_seqs=64-BENCH--max_concurrency=8", "SERVE--max_num_seqs=256-BENCH--max_concurrency=8"):
        _write(tmp_path, f"sweep/{name}/run=0.json", _run(8))
    return tmp_path / "sweep"


def _empty_sweep(tmp_path: Path) -> Path:
    header = (SWEEP / "summary.csv").read_text().splitlines()[0]
    _write(tmp_path, "sweep/summary.csv", header + "\n")
    return tmp_path / "sweep"


def _guidellm(tmp_path: Path, edit) -> Path:
    raw = json.loads((DATA / "guidellm_benchmarks.json").read_text())
    edit(raw["benchmarks"][0])
    return _write(tmp_path, "benchmarks.json", raw)


VLLM_BAD = {
    "guidellm report": (lambda t: DATA / "guidellm_benchmarks.json", (),
                        ["guidellm_benchmarks.json", "import guidellm"]),
    "not json": (lambda t: _write(t, "notes.json", "concurrency 8: fast\n"), (), ["notes.json", "not JSON"]),
    "empty file": (lambda t: _write(t, "empty.json", ""), (), ["empty.json", "empty file"]),
    "another json": (lambda t: _write(t, "other.json", {"loss": 1.0}), (), ["other.json", "not a vllm bench result"]),
    "missing field": (lambda t: _write(t, "run.json", _drop(_run(8), "total_output_tokens")), (),
                      ["run.json", "total_output_tokens"]),
    "bad number": (lambda t: _write(t, "run.json", {**_run(8), "duration": "fast"}), (), ["run.json", "duration"]),
    "no concurrency": (lambda t: _write(t, "run.json", _drop({**_run(8), "max_concurrency": None}, "num_prompts")), (),
                       ["run.json", "max_concurrency"]),
    "all failed": (lambda t: _write(t, "run.json", {**_run(8), "completed": 0, "failed": 64, "total_output_tokens": 0}),
                   (), ["run.json", "no run has successful requests"]),
    "empty sweep": (_empty_sweep, (), ["sweep", "empty sweep"]),
    "empty folder": (lambda t: (t / "nothing").mkdir() or t / "nothing", (), ["nothing", "empty sweep"]),
    "several models": (_two_models, (), ["several models", "model_id", "Llama-3.1-8B"]),
    "several servers": (_two_servers, (), ["concurrency 8", "several server settings", "max_num_seqs=64"]),
    "throughput without --output-len": (lambda t: DATA / "vllm_throughput.json", (),
                                        ["vllm_throughput.json", "total_output_tokens", "--output-len"]),
    "missing file": (lambda t: t / "absent.json", (), ["absent.json", "no such file"]),
    "unknown gpu": (lambda t: DATA / "vllm_serve_c8.json", ("--gpu", "tpu-v9"), ["--gpu tpu-v9", "H100"]),
    "unknown model": (lambda t: DATA / "vllm_serve_c8.json", ("--model", "qwen9-7b"), ["--model qwen9-7b"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(VLLM_BAD))
def test_vllm_bench_bad_input_one_line_error(tmp_path, case):
    make, extra, fragments = VLLM_BAD[case]
    path = make(tmp_path)
    args = dict(zip(TARGET[::2], TARGET[1::2]))
    args.update(dict(zip(extra[::2], extra[1::2])))
    flat = [x for kv in args.items() for x in kv]
    assert_user_error(run_cli("import", "vllm-bench", str(path), *flat, "-o", str(tmp_path / "out.json")), *fragments)
    assert not (tmp_path / "out.json").exists()


GUIDELLM_BAD = {
    "vllm result": (lambda t: DATA / "vllm_serve_c8.json", ["vllm_serve_c8.json", "import vllm-bench"]),
    "no benchmarks field": (lambda t: _write(t, "report.json", {"args": {}}), ["report.json", "benchmarks"]),
    "empty benchmarks": (lambda t: _write(t, "report.json", {"benchmarks": []}),
                         ["report.json", "benchmarks", "empty"]),
    "no strategy": (lambda t: _guidellm(t, lambda b: b["config"].pop("strategy")), ["benchmarks[0]", "strategy"]),
    "unknown strategy": (lambda t: _guidellm(t, lambda b: b["config"]["strategy"].update(type_="replay")),
                         ["benchmarks[0]", "type_", "replay"]),
    "no output rate": (lambda t: _guidellm(t, lambda b: b["metrics"].pop("output_tokens_per_second")),
                       ["benchmarks[0]", "output_tokens_per_second"]),
    "no streams": (lambda t: _guidellm(t, lambda b: b["config"].update(strategy={"type_": "concurrent"})),
                   ["benchmarks[0]", "streams"]),
    "yaml report": (lambda t: _write(t, "benchmarks.yaml", "benchmarks: []\n"), ["benchmarks.yaml", "JSON"]),
    "empty file": (lambda t: _write(t, "benchmarks.json", ""), ["benchmarks.json", "empty file"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(GUIDELLM_BAD))
def test_guidellm_bad_input_one_line_error(tmp_path, case):
    make, fragments = GUIDELLM_BAD[case]
    r = run_cli("import", "guidellm", str(make(tmp_path)), *TARGET, "-o", str(tmp_path / "out.json"))
    assert_user_error(r, *fragments)


def test_library_errors_are_user_errors(target, tmp_path):
    with pytest.raises(UserError, match="several models"):
        load_vllm_bench([_two_models(tmp_path)], target)
    with pytest.raises(UserError, match="--output-len must be a positive"):
        load_vllm_bench([DATA / "vllm_throughput.json"], target, output_len=0)
    shutil.rmtree(tmp_path / "runs")


def test_a_model_other_than_the_files_is_noted(target, caplog):
    """The GuideLLM file names Qwen/Qwen2.5-7B-Instruct: --model qwen2.5-7b matches it, llama3.1-8b
    does not, and the fit would charge that model's bytes and FLOPs."""
    same = load_guidellm([DATA / "guidellm_benchmarks.json"], target)
    assert not any("--model is" in n for n in same.notes)
    with caplog.at_level("WARNING"):
        other = load_guidellm([DATA / "guidellm_benchmarks.json"], resolve_target("llama3.1-8b", "h100"))
    said = "the files name the model Qwen/Qwen2.5-7B-Instruct, and --model is llama3.1-8b"
    assert any(said in n for n in other.notes) and said in caplog.text
