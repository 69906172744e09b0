"""The HTML report: sections and figures present, overlays, offline, everything from profiles escaped."""

from __future__ import annotations

import json
import re

import pytest

from _synth import make_profile
from throughputlab.cli import main
from throughputlab.fit import fit_profile
from throughputlab.models import resolve_model
from throughputlab.predict import predict_analytic
from throughputlab.report.profile_report import build_sections, render_report, write_report

EVIL = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


@pytest.fixture(scope="module")
def measured():
    p = make_profile(concurrencies=(1, 2, 4, 8, 16, 32), micro_batches=(1, 2, 4), noise=0.01)
    p.fit = fit_profile(p).model_dump(mode="json")
    return p


def _figure_json(html: str) -> list[dict]:
    """The JSON literals plotly writes into Plotly.newPlot(id, data, layout, config)."""
    return re.findall(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*(\[.*?\]),\s*(\{.*?\}),\s*\{", html, re.S)


def test_sections_and_figures(measured):
    names = [s.title for s in build_sections([measured])]
    assert names == ["Summary", "Generation", "Attention share of the decode step", "Training", "Points", "Fit",
                     "Environment"]
    html = render_report([measured])
    assert html.count("Plotly.newPlot") == 4
    assert "held-out error" in html and "MBU microbench" in html
    # no overhead probe: BW, and so the knee, is not identified; the text and the figure give its range
    assert "knee not identified, as BW is not: between concurrency" in html
    assert "decode knee not identified, lowest it can be" in html and "decode knee c*=" not in html
    assert "1 round(s) x 3 (warm-up 1" in html  # how the points were measured
    assert "matrix-vector read bandwidth" in html  # both bandwidth micro-benchmarks are listed
    # offline: plotly.js inlined, nothing fetched from the network
    assert not re.search(r"<script[^>]*\ssrc=", html) and not re.search(r"<link[^>]*href=\"http", html)


def test_overlay_of_measured_and_predicted(measured):
    pred = predict_analytic(resolve_model("demo").spec, "l4", dtype="bfloat16", concurrency=(1, 4, 16))
    html = render_report([measured, pred])
    assert "(predicted)" in html and "Test CPU" in html and "L4" in html
    data = json.loads(_figure_json(html)[0][0])
    colors = {t.get("marker", {}).get("color") for t in data if t.get("mode") == "markers"}
    assert len(colors) == 2  # one color per profile


@pytest.mark.slow
def test_profile_text_is_escaped_everywhere():
    p = make_profile(concurrencies=(1, 2, 4, 8), micro_batches=(1, 2, 4), name=EVIL)
    p.notes.append("</table><script>alert(1)</script>")
    html = render_report([p])
    assert "<script>window.__pwned" not in html and "<img src=x" not in html
    assert "<script>alert" not in html
    # the only script tags are plotly's library and its figure calls
    assert all(tag.strip() in ('<script type="text/javascript">', "<script>")
               for tag in re.findall(r"<script[^>]*>", html))
    for data, _layout in _figure_json(html):
        for t in json.loads(data):
            assert "<script" not in t.get("name", "") and "<img" not in t.get("name", "")


def test_write_report_and_cli(tmp_path, measured, capsys):
    write_report([measured], tmp_path / "a" / "r.html")
    assert (tmp_path / "a" / "r.html").read_text().startswith("<!DOCTYPE html>")
    measured.save(tmp_path / "p.json")
    with pytest.raises(SystemExit) as e:
        main(["report", str(tmp_path / "p.json"), str(tmp_path / "p.json"), "-o", str(tmp_path / "r2.html")])
    assert e.value.code == 0 and (tmp_path / "r2.html").exists()
    with pytest.raises(SystemExit) as e:
        main(["report", str(tmp_path / "missing.json"), "-o", str(tmp_path / "r3.html")])
    assert e.value.code == 2 and "does not exist" in capsys.readouterr().err


def test_cli_fit_stores_and_prints(tmp_path, measured, capsys):
    p = measured.model_copy(deep=True)
    p.fit = None
    p.save(tmp_path / "p.json")
    with pytest.raises(SystemExit) as e:
        main(["fit", str(tmp_path / "p.json"), "--bootstrap", "0"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "knee not identified, as BW is not" in out and "held-out tokens/s error" in out and "fit stored" in out
    assert json.loads((tmp_path / "p.json").read_text())["fit"]["method"] == "fit"


def test_overhead_probe_is_drawn_and_lowers_the_compute_ceiling():
    from throughputlab.report.profile_report import generation_figure, step_figure

    true = {"t0": 5e-3, "bw": 12e9, "phi": 60e9, "pre_t0": 4e-3, "pre_phi": 90e9, "train_t0": 0.05,
            "train_phi": 40e9, "mem0": 1.6e9, "mem_per": 0.25e9, "t_seq": 1e-3}
    p = make_profile(concurrencies=(1, 2, 4, 8, 16, 32, 64), micro_batches=(), noise=0.005, true=true,
                     probe={"hidden_size": 64, "intermediate_size": 64})
    fit = fit_profile(p)
    steps = step_figure([(p, fit, "#000")])
    probe = [t for t in steps.data if "overhead probe step" in t.name]
    assert len(probe) == 2 and list(probe[0].x) == [1, 2, 4, 8, 16, 32, 64]
    gen = generation_figure([(p, fit, "#000")])
    ceiling = next(t for t in gen.data if "compute ceiling" in t.name)
    m, s = fit.model, fit.generation.context_len
    per_seq = (m.costs.flops_per_token + s * m.costs.attn_flops_per_ctx_token) / m.decode.phi_flops_per_s
    assert ceiling.y[0] == pytest.approx(1 / (per_seq + m.decode.t_seq_s), rel=1e-9)
    assert "t_seq" in ceiling.name
    # the measured tokens/s stay below the ceiling that includes the per-sequence cost
    assert max(g.tokens_per_s for g in p.generation) < ceiling.y[0]


def test_points_table_shows_a_few_telemetry_figures_not_the_raw_dump():
    from throughputlab.records.profile import TelemetrySummary
    from throughputlab.report.tables import points_tables

    p = make_profile(concurrencies=(1, 2, 4, 8), micro_batches=(1, 2, 4))
    p.generation[0].telemetry = TelemetrySummary(
        source="host", hz=20, n_samples=40,
        mean={"proc_cpu_pct": 187.4, "proc_rss_gib": 1.2, "proc_count": 3.0, "host_cpu_pct": 95.0,
              "proc_minor_faults_per_s": 51234.0},
        max={"proc_cpu_pct": 199.0, "proc_rss_gib": 1.31, "proc_count": 3.0, "host_cpu_pct": 99.0,
             "proc_minor_faults_per_s": 90000.0})
    cell = points_tables(p, None)[0][1]["telemetry"].iloc[0]
    assert cell == "CPU 187%; RSS 1.31 GiB; page faults 51,234/s"
    p.generation[0].telemetry.throttled, p.generation[0].telemetry.throttle_reasons = True, ["sw_thermal_slowdown"]
    assert points_tables(p, None)[0][1]["telemetry"].iloc[0].endswith("throttled: sw_thermal_slowdown")


@pytest.mark.slow
def test_report_without_a_stored_fit_fits_with_the_fit_commands_defaults_and_says_so(monkeypatch):
    import throughputlab.fit.run as run
    from throughputlab.fit.schema import DEFAULT_BOOTSTRAP

    calls = []
    real = run.fit_profile
    monkeypatch.setattr(run, "fit_profile", lambda p, **kw: calls.append(kw) or real(p, **{**kw, "bootstrap": 0}))
    p = make_profile(concurrencies=(1, 2, 4, 8), micro_batches=(1, 2, 4))
    html = render_report([p])
    assert calls == [{"bootstrap": DEFAULT_BOOTSTRAP, "seed": 0}]
    assert "no stored fit; fitted now with `throughputlab fit`&#x27;s defaults" in html


@pytest.mark.slow
def test_summary_fit_and_report_state_one_largest_micro_batch(measured):
    from throughputlab.fit import load_fit, summary_lines
    from throughputlab.fit.schema import micro_batch_statement

    p = make_profile(concurrencies=(1, 2, 4, 8), micro_batches=(1, 2, 4, 8), oom_at=16)
    p.fit = fit_profile(p).model_dump(mode="json")
    statement = micro_batch_statement(load_fit(p))
    assert statement.startswith("largest micro-batch that fits: 15 (memory line") and "smallest OOM 16" in statement
    assert f"  {statement}" in summary_lines(load_fit(p))
    html = render_report([p])
    assert html.count(statement.replace("'", "&#x27;")) >= 2  # summary and fit sections


def test_the_environment_table_leaves_out_engine_figures_the_engine_does_not_have():
    from throughputlab.records.profile import EngineInfo
    from throughputlab.report.tables import environment_table

    p = make_profile(concurrencies=(1, 2), micro_batches=())
    p.engine = EngineInfo(name="hf", version="5.0")
    row = environment_table(p).set_index(environment_table(p).columns[0]).loc["engine"].iloc[0]
    assert row == "hf 5.0" and "None" not in row
    p.engine = EngineInfo(name="vllm", version="0.32", kv_cache_tokens=4096, max_num_seqs=64)
    row = environment_table(p).set_index(environment_table(p).columns[0]).loc["engine"].iloc[0]
    assert row == "vllm 0.32; KV cache tokens 4096; max_num_seqs 64"


@pytest.mark.slow
def test_profiles_of_one_label_are_told_apart_by_their_files(tmp_path):
    from throughputlab.report.labels import profile_label
    from throughputlab.report.profile_report import tell_apart

    a, b = make_profile(concurrencies=(1, 2, 4), micro_batches=()), make_profile(concurrencies=(1, 4, 8), micro_batches=())
    other = make_profile(concurrencies=(1, 2), micro_batches=(), model="tiny")
    for p in (a, b):
        p.fit = fit_profile(p, bootstrap=0).model_dump(mode="json")
    same = [profile_label(p) for p in (a, b)]
    assert same[0] == same[1]
    told = tell_apart([a, b, other], [tmp_path / "monday.json", tmp_path / "tuesday.json", tmp_path / "t.json"])
    labels = [profile_label(p) for p in told]
    assert "[monday]" in labels[0] and "[tuesday]" in labels[1] and labels[2] == profile_label(other)
    html = render_report(told[:2])
    assert "demo [monday]" in html and "demo [tuesday]" in html


def test_a_predicted_profile_is_not_described_as_measured():
    from throughputlab.report.attention import attention_table
    from throughputlab.report.tables import environment_table

    pred = predict_analytic(resolve_model("qwen2.5-7b").spec, "h200", concurrency=(1, 8, 64))
    env = dict(environment_table(pred).itertuples(index=False, name=None))
    assert "predicted" in env and "measured" not in env and "repeats" not in env
    from throughputlab.fit import load_fit

    _, table = attention_table(pred, load_fit(pred))
    assert set(table["context"]) == {"predicted"}
