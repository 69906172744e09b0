"""Learning curves to samples-to-target: crossings, seeds, invariance, parametric N*, bad files."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from _decide_curves import write_curves
from throughputlab.decide.curves import (
    CurveColumns,
    CurvesSpec,
    default_smoothing_samples,
    ema_samples,
    first_crossing,
    load_curves,
    parse_nstar,
)
from throughputlab.errors import UserError


def test_first_crossing_is_interpolated_between_logged_points():
    x = np.array([0.0, 10.0, 20.0, 30.0])
    y = np.array([0.1, 0.5, 0.9, 1.0])
    assert first_crossing(x, y, 0.7, "max") == pytest.approx(15.0)
    assert first_crossing(x, 1 - y, 0.3, "min") == pytest.approx(15.0)
    assert first_crossing(x, y, 1.5, "max") is None
    assert first_crossing(x, y, 0.05, "max") == 0.0


def test_sample_axis_smoothing_lags_a_trend_by_the_same_samples_at_any_logging_interval():
    y_const = np.full(5, 3.0)
    assert np.allclose(ema_samples(np.arange(5.0), y_const, 10.0), 3.0)  # starts at the first point, no bias
    assert np.allclose(ema_samples(np.arange(5.0), y_const * np.arange(5), 0.0), y_const * np.arange(5))
    tau, m = 500.0, 1e-3
    for step in (64.0, 1024.0):  # a linear trend, logged every 64 or every 1,024 samples
        x = np.arange(0.0, 40000.0, step)
        s = ema_samples(x, m * x, tau)
        late = x > 10 * tau
        assert np.allclose(s[late], m * (x[late] - tau), rtol=0, atol=1e-3 * m * tau)
    assert default_smoothing_samples(0.6, 64) == pytest.approx(96.0)


def test_identical_curves_on_the_sample_axis_cross_together_whatever_the_batch(tmp_path):
    """The same learning curve on the sample axis, logged once per step at 64 and at 1,024
    samples per step: smoothing over logged steps put the large batch's crossing 4-5% later."""
    rows = []
    n0 = 1.5e4  # per-step smoothing crossed 4.5% later at 1,024 than at 64 (7% at 1e4, 3.4% at 2e4)
    for batch in (64, 1024):
        for step in range(1, int(20 * n0 / batch)):
            samples = step * batch
            rows.append({"run": f"b{batch}", "batch_size": batch, "lr": 1e-6, "samples": samples,
                         "metric": 1 - math.exp(-samples / n0)})
    path = tmp_path / "same.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    res = load_curves(CurvesSpec(path=str(path)), 0.9, "max")
    small, large = res.configs
    assert res.smoothing_samples == pytest.approx(0.6 / 0.4 * 64)
    assert large.nstar_samples / small.nstar_samples == pytest.approx(1.0, abs=0.002)
    assert large.invariant is True


def test_seeds_aggregate_to_median_and_range(tmp_path):
    p = write_curves(tmp_path / "c.csv", [(128, 1e-6, 1e6), (1024, 2.8e-6, 1.2e6)])
    res = load_curves(CurvesSpec(path=str(p), smoothing=0.0), 0.7, "max")
    small, large = res.configs
    assert small.batch == 128 and large.batch == 1024
    assert small.reached == 3
    assert small.nstar_samples == pytest.approx(1e6, rel=0.01)
    assert large.nstar_samples == pytest.approx(1.2e6, rel=0.01)
    assert small.nstar_low < small.nstar_samples < small.nstar_high
    assert small.nstar_high / small.nstar_low == pytest.approx(1.03 / 0.97, rel=0.01)


def test_invariance_at_equal_samples(tmp_path):
    p = write_curves(tmp_path / "c.csv", [(128, 1e-6, 1e6), (512, 2e-6, 1.02e6), (512, 1e-6, 2e6)])
    res = load_curves(CurvesSpec(path=str(p)), 0.7, "max", baseline_batch=128)
    by = {(c.batch, c.lr): c for c in res.configs}
    assert by[(512, 2e-6)].invariant is True
    assert by[(512, 1e-6)].invariant is False
    assert by[(512, 1e-6)].gap_to_baseline > by[(512, 2e-6)].gap_to_baseline


def test_step_column_and_renamed_columns(tmp_path):
    p = write_curves(tmp_path / "c.csv", [(128, 1e-6, 1e6), (256, 1.4e-6, 1e6)], step_only=True,
                     columns={"run": "Name", "metric": "reward/mean"})
    cols = CurveColumns(run="Name", metric="reward/mean")
    res = load_curves(CurvesSpec(path=str(p), columns=cols, smoothing=0.0), 0.7, "max")
    assert res.configs[1].nstar_samples == pytest.approx(1e6, rel=0.01)


def test_a_configuration_that_never_reaches_is_reported_as_such(tmp_path):
    p = write_curves(tmp_path / "c.csv", [(128, 1e-6, 1e6), (2048, 1e-6, 1e8)], until=4e6)
    res = load_curves(CurvesSpec(path=str(p)), 0.7, "max")
    slow = res.for_batch(2048)[0]
    assert slow.nstar_samples is None and slow.reached == 0
    assert slow.status == "not reached"


@pytest.mark.parametrize("case,msg", [
    ("missing", "lacks column(s) metric"),
    ("never", "never reached by any run"),
    ("one_run", "one run only"),
    ("empty", "empty"),
    ("mixed_batch", "several batch sizes"),
])
def test_malformed_curves_give_one_line(tmp_path, case, msg):
    p = tmp_path / "c.csv"
    if case == "missing":
        write_curves(p, [(128, 1e-6, 1e6), (256, 1e-6, 1e6)], columns={"metric": "reward"})
    elif case == "never":
        write_curves(p, [(128, 1e-6, 1e6), (256, 1e-6, 1e6)])
    elif case == "one_run":
        write_curves(p, [(128, 1e-6, 1e6)], seeds=1)
    elif case == "empty":
        p.write_text("")
    else:
        p.write_text("run,batch_size,samples,metric\na,1,1,0.1\na,2,2,0.8\nb,1,1,0.9\n")
    target = 5.0 if case == "never" else 0.7
    with pytest.raises(UserError, match=re.escape(msg)) as e:
        load_curves(CurvesSpec(path=str(p)), target, "max")
    assert "\n" not in str(e.value)


def test_parametric_nstar():
    m = parse_nstar("mcandlish:N_min=1e6,B_noise=1000")
    assert m.nstar(1000)[0] == pytest.approx(2e6)
    assert m.nstar(0.0)[0] == pytest.approx(1e6)
    f = parse_nstar("flat:lo=100,hi=1000")
    assert f.nstar(500) == (1.0, "flat")
    assert f.nstar(2000)[0] is None
    assert parse_nstar("flat:N=5e5").nstar(1e9)[0] == 5e5
    for bad, msg in [("mcandlish:N_min=1", "both"), ("flat:x=1", "unknown key"), ("cubic", "use flat"),
                     ("flat:N=-3", "positive"), ("flat:lo=5,hi=1", "hi must")]:
        with pytest.raises(UserError, match=msg):
            parse_nstar(bad)
