"""What the fit cannot pin down: t0 and BW without the overhead probe, a bandwidth above the
probe's micro-benchmarks, and the combination t0 + W/BW reported instead."""

from __future__ import annotations

import math

import numpy as np
import pytest

from _synth import TRUE, make_profile
from throughputlab import roofline as rf
from throughputlab.fit import FitResult, fit_profile, summary_lines
from throughputlab.fit.identify import CONSTANT_STEP
from throughputlab.fit.solver import jacobian_ci, log_combination_half_width, solve
from throughputlab.report.tables import fit_tables
from throughputlab.roofline import Costs

CS = (1, 2, 4, 8, 16, 32, 64)
PROBE = {"hidden_size": 64, "intermediate_size": 64}


def _param(params, name):
    return next(e for e in params if e.name == name)


@pytest.fixture(scope="module")
def bare():
    """No overhead probe (as from vLLM or an HTTP engine), a small bootstrap."""
    prof = make_profile(concurrencies=CS, micro_batches=(), noise=0.01, seed=1)
    return prof, fit_profile(prof, bootstrap=12, seed=0)


def test_without_the_probe_t0_and_bw_are_not_identified_but_their_sum_is(bare):
    prof, r = bare
    g = r.generation
    t0, bw, phi = (_param(g.params, n) for n in ("t0_s", "bw_bytes_per_s", "phi_flops_per_s"))
    for e in (t0, bw):
        assert not e.identified and e.lo is None and e.hi is None
        assert "without the overhead probe" in e.note
    assert phi.identified and phi.lo < TRUE["phi"] < phi.hi
    w = Costs.from_spec(prof.model, 4).weight_bytes
    (comb,) = g.combinations
    assert comb.name == CONSTANT_STEP and comb.identified and comb.unit == "s"
    d = r.model.decode  # the point estimates the model still predicts with
    assert comb.value == pytest.approx(d.t0_s + w / d.bw_bytes_per_s, rel=1e-9)
    assert math.isfinite(comb.lo) and math.isfinite(comb.hi) and comb.lo < comb.value < comb.hi
    assert comb.value == pytest.approx(TRUE["t0"] + w / TRUE["bw"], rel=0.02)
    assert comb.hi / comb.lo < 1.2  # narrow, unlike the parts


def test_the_sum_has_a_jacobian_interval_without_the_bootstrap():
    r = fit_profile(make_profile(concurrencies=CS, micro_batches=(), noise=0.01, seed=2), bootstrap=0)
    (comb,) = r.generation.combinations
    assert comb.identified and 0 < comb.lo < comb.value < comb.hi < 1.2 * comb.lo


def test_kv_reads_at_long_contexts_separate_t0_from_bw_without_the_probe():
    # at 2k tokens the bytes read grow 3x from c=1 to c=16: BW is seen apart from t0
    prof = make_profile(concurrencies=(1, 2, 4, 8, 16), prompt_len=2048, output_len=16, micro_batches=(), seed=2,
                        noise=0.005)
    g = fit_profile(prof).generation
    bw = _param(g.params, "bw_bytes_per_s")
    assert bw.identified and bw.lo <= TRUE["bw"] <= bw.hi and _param(g.params, "t0_s").identified
    assert g.combinations == []


def test_where_bw_is_not_identified_the_knee_is_a_range(bare):
    """The knee moves with BW: without the probe it is stated as the range BW's bounds give, from
    W over the whole t0 + W/BW (t0 = 0) to the memory's measured bandwidth, and the true knee lies in it."""
    prof, r = bare
    g, d = r.generation, r.model.decode
    costs = Costs.from_spec(prof.model, 4)
    (comb,) = g.combinations
    lo, hi = g.knee_range
    assert lo == pytest.approx(rf.knee(costs, g.context_len, 14e9, d.phi_flops_per_s), rel=1e-6)  # copy benchmark
    assert hi == pytest.approx(rf.knee(costs, g.context_len, costs.weight_bytes / comb.value, d.phi_flops_per_s),
                               rel=1e-6)
    assert lo < rf.knee(costs, g.context_len, TRUE["bw"], d.phi_flops_per_s) < hi
    assert g.knee_note.startswith("knee not identified, as BW is not: between concurrency "
                                  f"{lo:.3g} and {hi:.3g}")
    assert "not identified either" in g.generation_knee_note
    assert FitResult.model_validate(r.model_dump(mode="json")).generation.knee_range == (lo, hi)
    # without a micro-benchmark only the upper end is known
    bare_hw = prof.model_copy(deep=True)
    bare_hw.hardware.microbench = None
    g2 = fit_profile(bare_hw).generation
    assert g2.knee_range[0] is None and "or below" in g2.knee_note


def test_with_the_probe_t0_and_bw_stay_identified():
    true = {**TRUE, "t0": 10e-3, "t_seq": 1e-3}
    r = fit_profile(make_profile(concurrencies=CS, true=true, noise=0.005, seed=5, micro_batches=(), probe=PROBE))
    g = r.generation
    for name in ("t0_s", "bw_bytes_per_s", "phi_flops_per_s", "t_seq_s"):
        e = _param(g.params, name)
        assert e.identified and e.lo is not None and e.note is None, name
    assert g.combinations == []
    assert g.knee_range is None and g.knee_note.startswith("knee at concurrency")


@pytest.mark.slow
def test_bandwidth_above_the_microbenchmarks_is_not_identified():
    # true BW 12 GB/s; the probe measured 6 GB/s (copy) and 5 GB/s (matrix-vector)
    true = {**TRUE, "t0": 10e-3, "t_seq": 1e-3}
    prof = make_profile(concurrencies=CS, true=true, noise=0.005, seed=5, micro_batches=(), probe=PROBE,
                        microbench=(6e9, 70e9))
    prof.hardware.microbench.gemv_bandwidth_bytes_per_s = 5e9
    r = fit_profile(prof)
    g = r.generation
    bw = _param(g.params, "bw_bytes_per_s")
    assert bw.value > 6e9 and not bw.identified and bw.lo is None
    assert "above what the probe measured the memory can do: 6 GB/s copy, 5 GB/s matrix-vector" in bw.note
    assert _param(g.params, "t0_s").identified  # the probe still separates t0
    (comb,) = g.combinations
    assert comb.value == pytest.approx(r.model.decode.t0_s + Costs.from_spec(prof.model, 4).weight_bytes
                                       / r.model.decode.bw_bytes_per_s, rel=1e-9)
    # a FLOP rate above the matmul benchmark is stated, its interval kept
    prof.hardware.microbench.matmul_flops_per_s = 30e9
    phi = _param(fit_profile(prof).generation.params, "phi_flops_per_s")
    assert phi.identified and "above the probe's matmul benchmark, 30 GFLOP/s" in phi.note


def test_summary_report_table_and_stored_fit(bare, tmp_path):
    prof, r = bare
    lines = summary_lines(r)
    assert any(x.lstrip().startswith("t0_s") and "[not identified]" in x for x in lines)
    comb_line = next(x for x in lines if x.lstrip().startswith(CONSTANT_STEP))
    assert "ms [" in comb_line and "the constant part of the decode step" in comb_line
    _, tables = fit_tables(prof, r)
    df = next(t for name, t in tables if "fit" in name.lower() or "parameter" in t.columns)
    row = df[df["parameter"] == CONSTANT_STEP].iloc[0]
    assert row["part"] == "decode" and row["identified"] == "yes" and row["95% low"]
    assert df[df["parameter"] == "bw_bytes_per_s"].iloc[0]["identified"] == "no"
    # stored and read back; a fit stored before the field existed still loads
    back = FitResult.model_validate(r.model_dump(mode="json"))
    assert back.generation.combinations == r.generation.combinations
    old = r.model_dump(mode="json")
    del old["generation"]["combinations"]
    assert FitResult.model_validate(old).generation.combinations == []


def test_combination_interval_of_a_degenerate_problem():
    # y depends on a + b only: neither part is identified, their sum is
    rng = np.random.default_rng(0)
    y = 3.0 + 0.01 * rng.standard_normal(12)
    sol = solve(lambda x: np.full(12, x[0] + x[1]) - y, [np.array([1.0, 1.0])], np.array([-10.0, -10.0]),
                np.array([10.0, 10.0]))
    assert [ok for _, _, ok in jacobian_ci(sol)] == [False, False]
    half = log_combination_half_width(sol, np.array([1.0, 1.0]))
    assert half is not None and half == pytest.approx(2.2 * 0.01 / math.sqrt(12), rel=0.5)
    assert log_combination_half_width(sol, np.array([1.0, 0.0])) is None
