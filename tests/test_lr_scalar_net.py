"""Deep scalar linear networks: exact gradient flow, GD, per-depth learning rates, `lr depth`."""

import math

import numpy as np
import pytest

from throughputlab.cli import main
from throughputlab.errors import UserError
from throughputlab.lr import scalar as sn

DATA = sn.ScalarData(1.0, 2.0)


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("p0", [0.3, 5.0])
def test_implicit_solution_matches_closed_forms(depth, p0):
    t = np.linspace(0, 6, 61)
    closed = sn.gradient_flow_closed_form(depth, DATA, p0, t)
    implicit = sn.gradient_flow(depth, DATA, p0, t, method="implicit")
    assert np.max(np.abs(implicit - closed) / closed) < 1e-10


@pytest.mark.parametrize("depth", [3, 8, 64])
def test_exact_solution_matches_full_ode(depth):
    """The balanced reduction and its implicit solution agree with integrating all L weights."""
    t = np.linspace(0, 8, 81)
    exact = sn.gradient_flow(depth, DATA, 0.4, t)
    ode = sn.integrate_flow_ode(depth, DATA, 0.4 ** (1 / depth), t)
    assert np.max(np.abs(exact - ode) / ode) < 1e-8
    assert abs(exact[-1] - DATA.p_star) < abs(exact[0] - DATA.p_star)


@pytest.mark.parametrize("depth", [1, 2, 3, 8])
def test_exact_solution_matches_gradient_descent(depth):
    """Check 1. GD at step h is O(h) from the flow (~1e-4 here), so 1e-6 with plain GD needs ~1e7 steps.

    We assert: plain GD error halves with the step (first order, so GD -> the exact flow), and GD at
    h, 2h, 4h extrapolated to h -> 0 matches the exact solution to 1e-6 over the whole trajectory.
    """
    row = sn.exact_vs_gd(depth, DATA, 0.5, 8.0, lr=5e-4)
    assert row.extrapolated_max_rel_err < 1e-6
    assert row.gd_max_rel_err < 1e-3
    coarse = sn.exact_vs_gd(depth, DATA, 0.5, 8.0, lr=1e-3)
    assert coarse.gd_max_rel_err / row.gd_max_rel_err == pytest.approx(2.0, rel=0.05)


def test_sharpness_matches_numerical_hessian():
    depth, data = 4, sn.ScalarData(1.5, 3.0)
    w = np.full(depth, data.p_star ** (1 / depth))

    def loss(v):
        return 0.5 * (data.exx * np.prod(v) ** 2 - 2 * data.exy * np.prod(v))

    eps = 1e-4
    H = np.zeros((depth, depth))
    for i in range(depth):
        for j in range(depth):
            e_i, e_j = np.eye(depth)[i] * eps, np.eye(depth)[j] * eps
            H[i, j] = (loss(w + e_i + e_j) - loss(w + e_i - e_j) - loss(w - e_i + e_j) + loss(w - e_i - e_j)) / (4 * eps**2)
    assert np.max(np.linalg.eigvalsh(H)) == pytest.approx(sn.sharpness_at_optimum(depth, data), rel=1e-5)


def test_max_stable_lr_is_the_edge():
    depth, data = 3, sn.ScalarData(1.0, 2.0)
    lr_max = sn.max_stable_lr(depth, data)
    w_star = data.p_star ** (1 / depth)
    for factor, converges in ((0.95, True), (1.05, False)):
        tr = sn.simulate_gd(depth, data, factor * lr_max, 3000, w_star * 1.001)
        err = abs(tr.p[-1] - data.p_star) if not tr.diverged else math.inf
        assert (err < 1e-6) == converges


def test_unbalanced_start_is_simulated_and_converges():
    tr = sn.simulate_gd(3, DATA, 0.05, 4000, [0.5, 1.0, 1.5])
    assert tr.p[-1] == pytest.approx(DATA.p_star, rel=1e-8)
    assert len(set(np.round(tr.weights, 6))) == 3  # stays unbalanced: w_l^2 - w_k^2 is (nearly) conserved


@pytest.mark.parametrize("beta", [1.0, 0.25])
def test_residual_variant_matches_its_exact_solution(beta):
    depth, h, steps = 4, 1e-3, 3000
    tr = sn.simulate_gd(depth, DATA, h, steps, 0.0, residual=True, branch_scale=beta)
    t = np.arange(steps + 1) * h
    exact = sn.gradient_flow_residual(depth, DATA, 0.0, t, branch_scale=beta)
    assert np.max(np.abs(tr.p - exact) / exact) < 5e-3  # O(h) GD error
    assert tr.p[0] == 1.0


def test_data_rule_equalises_rates_and_one_over_depth_does_not():
    """Check 2."""
    depths = (1, 2, 4, 8, 16, 64)
    far = {"p*=0.25": sn.ScalarData(1.0, 0.25), "p*=3": sn.ScalarData(2.0, 6.0)}
    study = sn.depth_study(far, depths, step_rate=0.1, p0=1.0, max_steps=20000)
    for name in far:
        data_rates = [r.measured_rate for r in study.rows if r.dataset == name and r.rule == "data"]
        assert all(r is not None for r in data_rates)
        assert max(data_rates) / min(data_rates) < 1.05
        assert study.spread("1/depth", name) > 2.0
    # and the same rate across data sets
    assert study.spread("data") < 1.05
    # measured rates agree with the linearised prediction
    for r in study.rows:
        assert r.measured_rate == pytest.approx(r.predicted_rate, rel=1e-3)


def test_bad_inputs():
    with pytest.raises(UserError):
        sn.ScalarData(-1.0, 1.0)
    with pytest.raises(UserError):
        sn.gradient_flow(3, sn.ScalarData(1.0, -2.0), 0.5, [0.0, 1.0])
    with pytest.raises(UserError):
        sn.rate_equalising_lr(2, DATA, step_rate=3.0)


def test_cli_depth(capsys):
    with pytest.raises(SystemExit) as e:
        main(["lr", "depth", "--depths", "1,2,4,8,16,64", "--data", "1:0.25", "--data", "2:6",
              "--no-check-exact"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "rate (1/depth)" in out and "rate (data)" in out
    data_line = next(line for line in out.splitlines() if line.startswith("data-dependent lr"))
    spread = float(data_line.rsplit(" ", 1)[-1])
    assert spread < 1.05
    agnostic = next(line for line in out.splitlines() if line.startswith("lr proportional to 1/depth"))
    assert float(agnostic.rsplit(" ", 1)[-1]) > 2.0


def test_cli_depth_bad_data(capsys):
    with pytest.raises(SystemExit) as e:
        main(["lr", "depth", "--data", "1-2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--data" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("rate,target", [(1.0, "= inf"), (1.5, "= 0.6931"), (0.1, "= 0.1054")])
def test_cli_depth_states_the_target_rate_at_every_allowed_step_rate(capsys, rate, target):
    """The step rate is allowed in (0, 2): the error's factor per step is |1 - r|, so r = 1 has no
    finite rate and r > 1 overshoots; neither may end in a traceback."""
    with pytest.raises(SystemExit) as e:
        main(["lr", "depth", "--depths", "1,2,4", "--data", "1:0.25", "--no-check-exact", "--step-rate", str(rate)])
    out = capsys.readouterr().out
    assert e.value.code == 0 and f"target rate -log|1 - {rate:g}| {target}" in out
