"""The report of a profile measured at several prompt lengths: one curve per context in the
generation figures, the attention's share of the decode step, the fit's attention note, and the
prompt length in the points table; a one-context profile keeps its look."""

from __future__ import annotations

import json
import re

import pytest

from _synth import TRUE, make_profile
from throughputlab import roofline as rf
from throughputlab.fit import fit_profile, load_fit
from throughputlab.report.attention import attention_figure
from throughputlab.report.figures import generation_figure, step_figure
from throughputlab.report.page import esc
from throughputlab.report.profile_report import render_report
from throughputlab.report.tables import _n, points_tables

EVIL = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
CONTEXTS = (64, 256, 1024)


def _contexts(true, contexts=CONTEXTS, concurrencies=(1, 2, 4, 8, 16, 32)):
    profiles = [make_profile(model="demo", true=true, prompt_len=ctx, concurrencies=concurrencies,
                             micro_batches=(), noise=0.005, seed=i) for i, ctx in enumerate(contexts)]
    prof = profiles[0]
    prof.generation = [p for q in profiles for p in q.generation]
    return prof


@pytest.fixture(scope="module")
def several():
    p = _contexts({**TRUE, "bw_attn": 3e9})
    p.fit = fit_profile(p, bootstrap=0).model_dump(mode="json")
    return p


@pytest.fixture(scope="module")
def one():
    p = make_profile(concurrencies=(1, 2, 4, 8, 16), micro_batches=(), noise=0.005)
    p.fit = fit_profile(p, bootstrap=0).model_dump(mode="json")
    return p


def _section(html: str, anchor: str) -> str:
    start = html.index(f'<section id="{anchor}">')
    return html[start:html.index("</section>", start)]


def _figures(html: str) -> list[list[dict]]:
    return [json.loads(d) for d in re.findall(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*(\[.*?\]),\s*\{", html, re.S)]


@pytest.mark.slow
def test_one_measured_and_one_fitted_curve_per_context(several):
    fit = load_fit(several)
    fig = generation_figure([(several, fit, "#1f77b4")])
    for ctx in CONTEXTS:
        mine = [t for t in fig.data if f", prompt {ctx}:" in t.name]
        assert sorted(t.mode for t in mine) == ["lines", "markers"], [t.name for t in mine]
        markers = next(t for t in mine if t.mode == "markers")
        assert list(markers.x) == [1, 2, 4, 8, 16, 32]
        line = next(t for t in mine if t.mode == "lines")  # the model at this context, not a formula of the report
        assert line.y[-1] == pytest.approx(fit.model.generation_tokens_per_s(line.x[-1], ctx, 32), rel=1e-9)
    assert len({t.marker.color for t in fig.data if t.mode == "markers"}) == len(CONTEXTS)  # shades of one hue
    assert not any("roofline" in t.name or "knee" in t.name for t in fig.data)  # asymptotes: one context only
    steps = step_figure([(several, fit, "#1f77b4")])
    assert sum(t.name.endswith("decode step (fit)") for t in steps.data) == len(CONTEXTS)
    # the page carries the same traces in its plotly JSON
    names = [t["name"] for t in _figures(render_report([several]))[0]]
    assert sum("prompt" in n and n.endswith("measured median") for n in names) == len(CONTEXTS)


def test_attention_share_per_context_with_longer_ones_predicted_and_the_fits_note(several):
    fit = load_fit(several)
    fig = attention_figure([(several, fit, "#1f77b4")])
    names = [t.name for t in fig.data]
    assert [n.split(", ")[-1] for n in names] == ["prompt 64", "prompt 256", "prompt 1024", "prompt 2048 (predicted)"]
    for t in fig.data:
        assert all(0 < y < 1 for y in t.y)
    # the share grows with the context: the KV reads grow with it, the weights do not
    assert [t.y[0] for t in fig.data] == sorted(t.y[0] for t in fig.data)
    t2k = fig.data[-1]
    assert t2k.y[0] == pytest.approx(fit.model.attention_share(t2k.x[0], rf.mean_context(2048, 32)), rel=1e-9)
    section = _section(render_report([several]), "attention")
    assert "per-kernel form" in section and esc(fit.generation.attention_note) in section
    assert "not predicted at prompt 8192: past the model&#x27;s 4096 positions" in section  # demo's 4096 positions
    cells = re.findall(r"<td>(\d+\.\d)%</td>", section)
    assert len(cells) == 4 * 6 and all(0 < float(c) < 100 for c in cells)


def test_points_table_lists_the_prompt_length_and_matches_each_points_own_errors(several):
    fit = load_fit(several)
    df = points_tables(several, fit)[0][1]
    assert list(df.columns[:2]) == ["prompt len", "concurrency"] and len(df) == 3 * 6
    assert list(df["prompt len"]) == sorted(df["prompt len"])
    assert df["held-out error"].notna().all() and df["MBU microbench"].notna().all()
    # each row carries its own context's fitted figure, not another context's at the same concurrency
    fitted = {(pt.x, pt.context_len): pt.fitted_tokens_per_s for pt in fit.generation.points}
    row = df[(df["prompt len"] == 1024) & (df["concurrency"] == 16)].iloc[0]
    assert row["fitted tokens/s"] == _n(fitted[(16, 1040.0)])


def test_one_context_keeps_its_look_and_says_the_attention_is_not_identified(one):
    fit = load_fit(one)
    fig = generation_figure([(one, fit, "#1f77b4")])
    assert not any("prompt" in t.name for t in fig.data)
    assert any("memory roofline" in t.name for t in fig.data) and any("decode knee" in t.name for t in fig.data)
    assert "prompt len" not in points_tables(one, fit)[0][1].columns
    html = render_report([one])
    section = _section(html, "attention")
    assert "not identified" in section and "BW stands in for the KV reads" in section
    assert "prompt 2048 (predicted)" in section  # the share is still predicted, from what stands in
    assert "several prompt lengths" not in _section(html, "generation")


def test_the_attention_note_is_escaped(one):
    p = one.model_copy(deep=True)
    p.fit["generation"]["attention_note"] = EVIL
    html = render_report([p])
    assert "<script>window.__pwned" not in html and "<img src=x" not in html
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in _section(html, "attention")
