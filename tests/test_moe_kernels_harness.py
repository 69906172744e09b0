"""The fused-MoE kernel harness (benchmarks/moe_kernels.py): the roofline's MoE layer against published kernel
timings, by hand at one point, the H100 series within 10% (the term's own calibration), and one line with exit 2
for a series without its source or a filter that matches nothing."""

from __future__ import annotations

import statistics

import yaml

from _harness import load_benchmark
from throughputlab import roofline as rf

h = load_benchmark("moe_kernels")


def test_one_point_by_hand():
    s = next(s for s in h.load(h.DATA) if s["id"] == "qwen3-30b-a3b/h100/tp1/fp8")
    # 8 tokens, top 8 of 128: 128 (1 - (120/128)^8) = 51.6 experts of 3 x 2048 x 768 one-byte weights, read at 80% of
    # 3.35 TB/s, over the fused path's floor (two 4 us GEMM floors and 20 us more)
    touched = 128 * (1 - (120 / 128) ** 8)
    by_hand = 1e6 * (2 * rf.GEMM_FLOOR_S + rf.MOE_LAYER_FLOOR_S) + touched * 3 * 2048 * 768 / (0.80 * 3.35e12) * 1e6
    assert abs(h.predict_us(s, 8) - by_hand) < 0.01 * by_hand


def test_the_h100_series_holds_and_every_row_is_printed(capsys):
    assert h.main([]) == 0
    out = capsys.readouterr().out
    series = h.load(h.DATA)
    table = h.rows(series)
    assert len(table) == sum(len(s["tokens_us"]) for s in series)
    h100 = [r["ratio"] for r in table if r["series"] == "qwen3-30b-a3b/h100/tp1/fp8"]
    assert abs(statistics.median(h100) - 1) <= 0.10, h100
    for s in series:
        assert s["id"] in out and s["source"].split(" ")[0] in out


def test_a_series_without_its_source_is_refused(tmp_path, capsys):
    doc = yaml.safe_load(h.DATA.read_text())
    del doc["series"][1]["source"]
    bad = tmp_path / "moe.yaml"
    bad.write_text(yaml.safe_dump(doc))
    assert h.main(["--data", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and doc["series"][1]["id"] in err and "source" in err


def test_a_filter_that_matches_nothing_is_refused(capsys):
    assert h.main(["--series", "no-such-series"]) == 2
    assert "no-such-series" in capsys.readouterr().err
