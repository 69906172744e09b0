"""The fit: parameters recovered from synthetic profiles, hand-computed knee/memory/utilisation, LOO errors."""

from __future__ import annotations

import math

import pytest

from _synth import TRUE, make_profile
from throughputlab.errors import UserError
from throughputlab.fit import FitResult, fit_profile, knee_statement, load_model
from throughputlab.records.machine import DatasheetPeak
from throughputlab.records.profile import GenPoint, Profile
from throughputlab.roofline import Costs
from throughputlab.throughput import DecodeParams, ThroughputModel

CS = (1, 2, 4, 8, 16, 32, 64)


def _param(params, name):
    return next(e for e in params if e.name == name)


@pytest.fixture(scope="module")
def synthetic():
    prof = make_profile(concurrencies=CS, noise=0.01, seed=1)
    return prof, fit_profile(prof)


def test_recovers_decode_parameters_within_their_intervals(synthetic):
    prof, r = synthetic
    g = r.generation
    assert g.target == "decode_step_s"
    for name, true in (("bw_bytes_per_s", TRUE["bw"]), ("phi_flops_per_s", TRUE["phi"])):
        assert _param(g.params, name).value == pytest.approx(true, rel=0.03)
    phi = _param(g.params, "phi_flops_per_s")
    assert phi.identified and phi.lo <= TRUE["phi"] <= phi.hi
    # no overhead probe: BW and t0 are not identified apart, their sum t0 + W/BW is
    assert not _param(g.params, "bw_bytes_per_s").identified
    assert _param(g.params, "t0_s").value == pytest.approx(TRUE["t0"], rel=0.3)
    (comb,) = g.combinations
    assert comb.identified and comb.value == pytest.approx(
        TRUE["t0"] + Costs.from_spec(prof.model, 4).weight_bytes / TRUE["bw"], rel=0.02)


def test_prefill_and_training_recovered(synthetic):
    _, r = synthetic
    assert _param(r.prefill.params, "phi_flops_per_s").value == pytest.approx(TRUE["pre_phi"], rel=0.03)
    assert _param(r.training.params, "phi_train_flops_per_s").value == pytest.approx(TRUE["train_phi"], rel=0.05)
    mem = r.training.memory
    assert mem.mem_per_sample_bytes == pytest.approx(TRUE["mem_per"], rel=0.05)
    # largest micro-batch, by hand from the fitted line and the 8 GiB device
    assert mem.max_micro_batch == math.floor((8 * 2**30 - mem.mem0_bytes) / mem.mem_per_sample_bytes)
    assert r.model.max_micro_batch() == mem.max_micro_batch


def test_leave_one_out_errors_small_on_clean_data(synthetic):
    _, r = synthetic
    errs = [p.loo_rel_error for p in r.generation.points]
    assert len(errs) == len(CS) and all(e is not None for e in errs)
    assert max(abs(e) for e in errs) < 0.03
    assert r.training.loo_max_abs_error < 0.05
    # the hard max generated the data: the smooth form must not be preferred
    assert r.generation.form == "max"


def test_knee_matches_hand_formula(synthetic):
    prof, r = synthetic
    c = Costs.from_spec(prof.model, 4)
    s = prof.settings.prompt_len + prof.settings.output_len / 2
    d = r.model.decode
    by_hand = c.weight_bytes / ((c.flops_per_token + s * c.attn_flops_per_ctx_token) * d.bw_bytes_per_s / d.phi_flops_per_s
                                - s * c.kv_bytes_per_token)
    assert r.generation.knee_concurrency == pytest.approx(by_hand, rel=1e-9)
    true_knee = c.weight_bytes / ((c.flops_per_token + s * c.attn_flops_per_ctx_token) * TRUE["bw"] / TRUE["phi"]
                                  - s * c.kv_bytes_per_token)
    assert r.generation.knee_concurrency == pytest.approx(true_knee, rel=0.06)


def test_memory_bound_everywhere_is_stated():
    costs = Costs(bytes_per_param=2, weight_bytes=1e9, kv_bytes_per_token=1e6, flops_per_token=1e9,
                  attn_flops_per_ctx_token=1e3)
    m = ThroughputModel(source="analytic", costs=costs,
                        decode=DecodeParams(t0_s=0, bw_bytes_per_s=1e12, phi_flops_per_s=1e14))
    knee, note = knee_statement(m, 1000)
    assert knee is None and "memory-bound at every concurrency" in note


def test_utilisation_hand_computed(synthetic):
    prof, r = synthetic
    c = Costs.from_spec(prof.model, 4)
    p = next(g for g in prof.generation if g.concurrency == 8)
    s = p.prompt_len + p.output_len / 2
    bytes_ = c.weight_bytes + 8 * s * c.kv_bytes_per_token
    flops = 8 * (c.flops_per_token + s * c.attn_flops_per_ctx_token)
    u = next(u for u in r.utilisation if u.phase == "decode" and u.x == 8)
    assert u.mbu_microbench == pytest.approx(bytes_ / p.decode_step_s / 14e9, rel=1e-9)
    assert u.mfu_microbench == pytest.approx(flops / p.decode_step_s / 70e9, rel=1e-9)
    assert u.mbu_datasheet is None  # no datasheet on a CPU


@pytest.mark.slow
def test_smooth_form_chosen_only_when_held_out_error_drops():
    true = {**TRUE, "p": 1.5}
    r = fit_profile(make_profile(concurrencies=(1, 2, 4, 8, 12, 16, 24, 32, 64), true=true, noise=0.005, seed=3,
                                 micro_batches=()))
    errs = r.generation.form_loo_mean_abs_error
    assert r.generation.form == "smooth" and errs["smooth"] < 0.9 * errs["max"]
    assert r.model.decode.smooth_p == pytest.approx(1.5, rel=0.2)


def test_end_to_end_target_without_step_timings():
    prof = make_profile(concurrencies=CS, with_steps=False, micro_batches=(), seed=2, noise=0.005,
                        true={**TRUE, "pre_t0": TRUE["t0"], "pre_phi": TRUE["phi"]})
    r = fit_profile(prof)
    assert r.generation.target == "tokens_per_s" and r.prefill is None
    assert any("end-to-end" in w for w in r.warnings)
    assert r.generation.loo_max_abs_error < 0.03
    assert _param(r.generation.params, "bw_bytes_per_s").value == pytest.approx(TRUE["bw"], rel=0.05)


def test_never_above_datasheet_peak():
    ds = DatasheetPeak(device="Slow", memory_bandwidth_bytes_per_s=8e9, flops_per_s={"float32": 40e9}, source="test")
    r = fit_profile(make_profile(concurrencies=CS, datasheet=ds, micro_batches=(1, 2, 4)))
    assert r.model.decode.bw_bytes_per_s <= 8e9 * (1 + 1e-9)
    assert r.model.decode.phi_flops_per_s <= 40e9 * (1 + 1e-9)
    assert r.model.train.phi_flops_per_s <= 40e9 * (1 + 1e-9)
    assert _param(r.generation.params, "bw_bytes_per_s").note  # at the bound, and says so


def test_failed_points_left_out_and_oom_caps_micro_batch():
    prof = make_profile(concurrencies=CS, micro_batches=(1, 2, 4, 8), oom_at=16)
    prof.generation.append(GenPoint(backend="hf", concurrency=128, prompt_len=64, output_len=32, status="oom",
                                    error="out of memory"))
    r = fit_profile(prof)
    assert r.generation.n_points == len(CS)
    assert any("left out" in w for w in r.warnings)
    assert r.training.memory.max_micro_batch == 15 and "OOM" in r.training.memory.note


def test_no_ok_points_is_a_user_error():
    prof = make_profile(concurrencies=(), micro_batches=())
    with pytest.raises(UserError, match="no successful points"):
        fit_profile(prof)


def test_stored_fit_round_trips_and_load_model_uses_it(tmp_path, synthetic):
    prof, r = synthetic
    prof = prof.model_copy(deep=True)
    fresh = load_model(prof)  # no stored fit: fitted on the fly
    assert fresh.decode.bw_bytes_per_s == pytest.approx(r.model.decode.bw_bytes_per_s, rel=1e-6)
    prof.fit = r.model_dump(mode="json")
    prof.save(tmp_path / "p.json")
    back = Profile.load(tmp_path / "p.json")
    assert FitResult.model_validate(back.fit).generation.knee_concurrency == r.generation.knee_concurrency
    prof.fit["model"]["decode"]["bw_bytes_per_s"] = 1.0  # proves the stored fit is used, not a refit
    assert load_model(prof).decode.bw_bytes_per_s == 1.0


def test_bootstrap_intervals_contain_estimate():
    r = fit_profile(make_profile(concurrencies=CS, micro_batches=(1, 2, 4), noise=0.02), bootstrap=20, seed=0)
    assert r.bootstrap_samples == 20
    for e in r.generation.params:
        if e.identified:
            assert e.lo <= e.value * 1.05 and e.hi >= e.value * 0.95


def test_end_to_end_knee_balances_memory_and_compute():


    costs = Costs(bytes_per_param=2, weight_bytes=1e10, kv_bytes_per_token=0.0, flops_per_token=1e10,
                  attn_flops_per_ctx_token=0.0)
    m = ThroughputModel(source="analytic", costs=costs,
                        decode=DecodeParams(t0_s=0.0, bw_bytes_per_s=1e12, phi_flops_per_s=1e14))
    # no KV, no attention: decode knee W*PHI/(F*BW) = 100
    assert m.knee(0) == pytest.approx(100.0)
    # whole requests, by hand: (o-1)*W/BW + W/BW (prefill reads weights once) = c*((o-1)+p)*F/PHI
    p, o = 300, 101
    by_hand = o * 1e10 / 1e12 / ((o - 1 + p) * 1e10 / 1e14)
    assert m.generation_knee(p, o) == pytest.approx(by_hand, rel=1e-6)
    assert m.generation_knee(p, o) < m.knee(0)  # prefill compute moves the bend earlier


PROBE = {"hidden_size": 64, "intermediate_size": 64}


@pytest.mark.slow
def test_overhead_probe_separates_fixed_and_per_sequence_costs_from_the_roofline():
    true = {**TRUE, "t0": 10e-3, "t_seq": 1e-3}
    prof = make_profile(concurrencies=CS, true=true, noise=0.005, seed=5, micro_batches=(), probe=PROBE)
    g = fit_profile(prof).generation
    assert [p.name for p in g.params][:4] == ["t0_s", "bw_bytes_per_s", "phi_flops_per_s", "t_seq_s"]
    for name, want in (("t0_s", true["t0"]), ("t_seq_s", true["t_seq"]), ("bw_bytes_per_s", true["bw"]),
                       ("phi_flops_per_s", true["phi"])):
        e = _param(g.params, name)
        assert e.value == pytest.approx(want, rel=0.05), name
        assert e.identified and e.lo <= want <= e.hi, name
    assert len(g.probe_points) == len(CS) and g.probe_weight_bytes < 0.05 * Costs.from_spec(prof.model, 4).weight_bytes
    assert all(p.fitted_s == pytest.approx(p.measured_s, rel=0.03) for p in g.probe_points)
    assert g.loo_max_abs_error < 0.03

    # The same model points without the probe: the per-sequence cost is read as arithmetic,
    # so PHI comes out well below the truth.
    bare = prof.model_copy(update={"engine": None})
    phi_bare = _param(fit_profile(bare).generation.params, "phi_flops_per_s").value
    assert phi_bare < 0.85 * true["phi"]


def test_sum_form_is_a_valid_smooth_form():
    true = {**TRUE, "t0": 5e-3, "t_seq": 2e-4, "p": 1.0}
    prof = make_profile(concurrencies=CS, true=true, noise=0.003, seed=6, micro_batches=(), probe=PROBE)
    r = fit_profile(prof)
    assert r.generation.form == "smooth"
    assert r.model.decode.smooth_p == pytest.approx(1.0, abs=0.05)
    assert _param(r.generation.params, "bw_bytes_per_s").value == pytest.approx(true["bw"], rel=0.05)
    assert r.model.decode.t_seq_s == pytest.approx(true["t_seq"], rel=0.1)


def test_tensor_parallel_engine_is_searched_up_to_tp_times_one_device_peak():
    from throughputlab.fit.generation import ceilings
    from throughputlab.fit.schema import engine_devices, peaks_of
    from throughputlab.records.profile import EngineInfo

    prof = make_profile(concurrencies=(1, 2, 4, 8, 16), micro_batches=(1, 2, 4))
    one = ceilings(peaks_of(prof))
    prof.engine = EngineInfo(name="vllm", engine_args={"tensor_parallel_size": 2})
    assert engine_devices(prof) == 2
    assert ceilings(peaks_of(prof), engine_devices(prof)) == (2 * one[0], 2 * one[1])
    r = fit_profile(prof)
    assert any("engine of 2 devices" in w for w in r.warnings)


def test_concurrency_past_knee_doubles_the_top_to_twice_the_knee():
    from throughputlab.fit.knees import concurrency_past_knee

    assert concurrency_past_knee([1, 2, 4, 8, 16, 32, 64], 82.4) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert concurrency_past_knee([4, 1, 2], 5.5) == [1, 2, 4, 8, 16]  # 8 < 11, 16 >= 11
    assert concurrency_past_knee([1, 2, 4, 8], 8.0) is None  # at the top: measured, not extrapolated
    assert concurrency_past_knee([1, 2, 4, 8], None) is None
    assert concurrency_past_knee([], 3.0) is None


@pytest.mark.slow
def test_fit_prints_the_resume_that_measures_past_an_extrapolated_knee(tmp_path):
    """A sweep that stops below its knee gets the exact `bench --resume` to run (the path quoted
    for a shell). A sweep that reaches the knee, or one whose knee is a range (BW not identified),
    gets none."""
    from conftest import run_cli

    short = tmp_path / "short profile.json"
    make_profile(concurrencies=(1, 2, 4), probe=PROBE, noise=0.005, micro_batches=()).save(short)
    r = run_cli("fit", str(short), "--bootstrap", "0", "--no-save")
    assert r.returncode == 0, r.stderr
    knee = float(r.stdout.split("knee at concurrency ")[1].split()[0])
    # PHI at its floor puts the knee at the sweep's last point, as a lower bound; the suggestion reaches 2 x knee
    assert 4 <= knee < 8
    line = next(x for x in r.stdout.splitlines() if x.startswith("to measure the compute-bound side"))
    cmd = line.split(": ", 1)[1]
    assert cmd.startswith(f"throughputlab bench --resume -o '{short}' -c 1,2,4,")
    grown = [int(c) for c in cmd.rsplit(" ", 1)[1].split(",")]
    assert grown[:3] == [1, 2, 4] and all(b == 2 * a for a, b in zip(grown[2:], grown[3:]))
    assert grown[-1] >= 2 * knee and grown[-2] < 2 * knee * (1 + 1e-6)  # the last doubling reaches 2 x knee

    full = tmp_path / "full.json"
    make_profile(concurrencies=CS, probe=PROBE, noise=0.005, micro_batches=()).save(full)
    r = run_cli("fit", str(full), "--bootstrap", "0", "--no-save")
    assert r.returncode == 0 and "knee at concurrency" in r.stdout and "--resume" not in r.stdout

    no_probe = tmp_path / "no_probe.json"  # BW not identified: more concurrency would not pin the knee
    make_profile(concurrencies=(1, 2, 4), noise=0.005, micro_batches=()).save(no_probe)
    r = run_cli("fit", str(no_probe), "--bootstrap", "0", "--no-save")
    assert r.returncode == 0 and "knee not identified" in r.stdout and "--resume" not in r.stdout


def test_a_stored_fit_older_than_the_points_is_not_used(caplog):
    """A `bench --resume` that adds points after `fit` leaves an out-of-date fit in the profile:
    predict, report and decide must refit, and say so, rather than use it."""
    from throughputlab.fit import load_fit

    short = make_profile(concurrencies=(1, 2, 4), probe=PROBE, noise=0.005)
    fit = fit_profile(short, bootstrap=0)
    grown = make_profile(concurrencies=(1, 2, 4, 8, 16), probe=PROBE, noise=0.005)
    grown.fit = short.fit = fit.model_dump(mode="json")
    assert load_fit(short) is not None  # its own points: used
    with caplog.at_level("WARNING"):
        assert load_fit(grown) is None
    assert "out of date" in caplog.text and "3 generation and 4 training points; the profile now has 5 and 4" \
        in caplog.text
    assert load_model(grown).decode.bw_bytes_per_s != fit.model.decode.bw_bytes_per_s  # fitted again

    # the same point count, one point re-measured after the fit
    later = short.model_copy(deep=True)
    later.generation[0].measured_at = "2999-01-01T00:00:00+00:00"
    assert load_fit(later) is None


@pytest.mark.slow
def test_single_sample_points_get_jacobian_intervals_not_a_zero_width_bootstrap():
    prof = make_profile(repeats=1, probe=PROBE, noise=0.02)
    r = fit_profile(prof, bootstrap=50)
    assert any("generation: a point has a single sample" in w for w in r.warnings)
    assert any("training: a point has a single sample" in w for w in r.warnings)
    jac = fit_profile(prof, bootstrap=0)
    for got, want in ((r.generation.params, jac.generation.params), (r.training.params, jac.training.params)):
        for e, j in zip(got, want):
            if e.identified:
                assert e.hi > e.lo and (e.lo, e.hi) == pytest.approx((j.lo, j.hi), rel=1e-9), e.name
    two = fit_profile(make_profile(repeats=2, probe=PROBE, noise=0.02), bootstrap=50)
    assert not any("single sample" in w for w in two.warnings)


def test_a_knee_from_memory_bound_points_only_is_a_lower_bound():
    """Where every point is memory-bound PHI is only bounded from below, and the knee grows with
    PHI: the fit says 'or above', and the knee the full sweep finds is indeed above it."""
    full = fit_profile(make_profile(concurrencies=CS, probe=PROBE, noise=0.005, micro_batches=()), bootstrap=0)
    true_knee = full.generation.knee_concurrency
    assert "or above" not in full.generation.knee_note and "compute-bound above" in full.generation.knee_note
    for cs in ((1, 2, 4), (1, 2, 4, 8)):
        g = fit_profile(make_profile(concurrencies=cs, probe=PROBE, noise=0.005, micro_batches=()), bootstrap=0).generation
        phi = _param(g.params, "phi_flops_per_s")
        assert not phi.identified and "only bounded from below" in phi.note
        assert f"knee at concurrency {g.knee_concurrency:.3g} or above" in g.knee_note
        assert max(cs) <= g.knee_concurrency <= true_knee
