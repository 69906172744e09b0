"""Prediction intervals: the conformal band, the published spread by kind, the fitted spread, and
their place in predict's tables and JSON."""

from __future__ import annotations

import json
import math

import pytest

from tests._synth import make_profile
from throughputlab import spread
from throughputlab.fit.run import fit_profile
from throughputlab.models import resolve_model
from throughputlab.predict import generation_table, predict_analytic, predict_from_profile, training_table


def test_the_conformal_band_takes_the_kth_order_statistics():
    # n = 19: k = floor(0.1 * 20) = 2, so the 2nd smallest and the 2nd largest
    ratios = [float(x) for x in range(1, 20)]
    assert spread.conformal_band(ratios, 0.8) == (2.0, 18.0)
    # n = 9: k = 1, the extremes; n = 8: too few for a two-sided 80% band
    assert spread.conformal_band([float(x) for x in range(1, 10)]) == (1.0, 9.0)
    assert spread.conformal_band([float(x) for x in range(1, 9)]) is None
    # non-finite and non-positive ratios are not evidence
    assert spread.conformal_band([math.nan, -1.0, *map(float, range(1, 10))]) == (1.0, 9.0)


def test_a_band_bounds_a_rate_and_the_inverse_time():
    sp = spread.Spread(lo=0.5, hi=2.0, basis="b")
    assert sp.rate(100.0) == (50.0, 200.0)
    assert sp.time(10.0) == (5.0, 20.0)
    with pytest.raises(ValueError, match="80%"):
        sp.rate(1.0, level=0.9)


def test_a_kind_with_too_few_points_falls_back_to_a_coarser_one(monkeypatch):
    from throughputlab import spread_data

    table = {("generation", "NVIDIA Ada", "tp1"): [1.0] * 3,  # too few alone
             ("generation", "NVIDIA Hopper", "tp1"): [0.5] + [1.0] * 8 + [2.0]}
    monkeypatch.setattr(spread_data, "PUBLISHED", table)
    ada = spread.published_spread("generation", "NVIDIA Ada", 1)
    assert "generation tp1" in ada.basis and "13 published" in ada.basis  # both families' tp1 points
    hopper = spread.published_spread("generation", "NVIDIA Hopper", 1)
    assert "NVIDIA Hopper" in hopper.basis
    assert (hopper.lo, hopper.hi) == (0.5, 2.0)  # measured/predicted: 1/2 and 1/0.5
    assert spread.published_spread("training", "NVIDIA Hopper", 1) is None
    # leaving a ratio out leaves nine points: still a band, now from the extremes of the rest
    assert spread.published_spread("generation", "NVIDIA Hopper", 1, leave_out=0.5).hi == 1.0


def test_the_fitted_band_adds_leave_one_out_and_run_to_run_in_quadrature():
    sp = spread.fitted_spread([0.03, -0.04], 0.0, "generation")
    sd = math.sqrt((0.03**2 + 0.04**2) / 2)
    assert sp.hi == pytest.approx(math.exp(1.2815515655 * sd))
    assert sp.lo == pytest.approx(1 / sp.hi)
    wider = spread.fitted_spread([0.03, -0.04], 0.05, "generation")
    assert wider.hi == pytest.approx(math.exp(1.2815515655 * math.hypot(sd, 0.05)))
    assert spread.fitted_spread([0.03], 0.05, "generation") is None  # one held-out error says nothing of spread


def test_an_analytic_prediction_prints_and_stores_its_interval():
    spec = resolve_model("llama3.1-8b").spec
    pred = predict_analytic(spec, "h100", concurrency=(1, 64), micro_batches=(1,))
    fit = json.loads(pred.model_dump_json())["fit"]
    gen_sp, train_sp = fit["model"]["gen_spread"], fit["model"]["train_spread"]
    assert gen_sp["lo"] < 1 < gen_sp["hi"] and "Hopper" in gen_sp["basis"]
    assert train_sp is not None
    for p in pred.generation:
        lo, hi = p.predicted.total_s_interval
        assert lo < p.predicted.total_s < hi
    from throughputlab.fit.schema import load_fit

    m = load_fit(pred).model
    g = generation_table(m, (1, 64), 512, 512)
    assert (g.tokens_per_s_lo < g.tokens_per_s).all() and (g.tokens_per_s < g.tokens_per_s_hi).all()
    t = training_table(m, (1,), 2048)
    assert (t.tokens_per_s_lo < t.tokens_per_s).all() and (t.tokens_per_s < t.tokens_per_s_hi).all()
    assert any("tokens_per_s_lo/hi" in a and "published" in a for a in load_fit(pred).assumptions)


def test_a_calibrated_prediction_does_not_borrow_the_published_spread():
    spec = resolve_model("llama3.1-8b").spec
    cal = make_profile(noise=0.02, seed=3)
    pred = predict_analytic(spec, "h100", calibrate=cal, concurrency=(1,), micro_batches=(1,))
    from throughputlab.fit.schema import load_fit

    assert load_fit(pred).model.gen_spread is None


@pytest.mark.slow
def test_a_fitted_band_widens_with_the_noise_of_the_points():
    quiet = fit_profile(make_profile(noise=0.005, seed=1)).model
    noisy = fit_profile(make_profile(noise=0.08, seed=1)).model
    assert quiet.gen_spread.hi < noisy.gen_spread.hi
    assert quiet.train_spread.hi < noisy.train_spread.hi
    # the predicted points of a fitted profile carry the band
    pred = predict_from_profile(make_profile(noise=0.05, seed=2), concurrency=(3,), micro_batches=(3,))
    lo, hi = pred.generation[0].predicted.total_s_interval
    assert lo < pred.generation[0].predicted.total_s < hi
    lo, hi = pred.training[0].predicted.step_s_interval
    assert lo < pred.training[0].predicted.step_s < hi


def test_the_rl_step_band_takes_the_framework_and_placement_else_the_placement():
    from throughputlab.spread import rl_step_spread

    table = {("verl", "colocated"): [0.5 + 0.05 * i for i in range(12)],  # 0.50 .. 1.05
             ("trl", "colocated"): [2.0, 2.1, 2.2], ("nemo-rl", "split"): [0.9] * 10}
    s = rl_step_spread("verl", "colocated", table=table)
    assert (s.lo, s.hi) == (0.5, 1.05) and "12 published verl colocated runs" in s.basis
    assert s.time(100.0) == pytest.approx((100 / 1.05, 200.0))  # predicted/published time: a slow model lands above
    s = rl_step_spread("trl", "colocated", table=table)  # three runs are too few: every colocated run
    assert "15 published colocated runs" in s.basis and s.hi == 2.2  # k = floor(0.1 x 16) = 1: the extremes
    assert "nemo-rl split" in rl_step_spread("nemo-rl", "split", table=table).basis
    assert "10 published split runs" in rl_step_spread(None, "split", table=table).basis
    with pytest.raises(ValueError):
        rl_step_spread("verl", "one-step-off", table=table)
