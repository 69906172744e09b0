"""LR-law fitting on synthetic sweeps with a known law, and `throughputlab lr fit`."""

import json
import math

import pytest

from throughputlab.cli import main
from throughputlab.errors import UserError
from throughputlab.lr.law import find_optima, fit_sweep, prepare_sweep, synthetic_sweep

NS = [1e7, 3e7, 1e8, 3e8, 1e9]
DS = [1e9, 3e9, 1e10, 3e10]
TRUE = dict(c0=-2.0, alpha=-0.3, beta=-0.1)


def sweep(seed, gamma=0.0, noise=0.002, **kw):
    return prepare_sweep(synthetic_sweep(NS, DS, gamma_n=gamma, gamma_d=gamma, noise=noise, seed=seed, **kw, **TRUE))


def test_optimum_of_a_parabola_is_found():
    df = prepare_sweep(synthetic_sweep([1e8], [1e10], noise=0.0, **TRUE))
    (o,) = find_optima(df)
    assert math.log(o.lr_opt) == pytest.approx(TRUE["c0"] + TRUE["alpha"] * math.log(1e8)
                                               + TRUE["beta"] * math.log(1e10), abs=1e-8)


@pytest.mark.parametrize("seed", range(4))
def test_recovers_exponents_within_intervals(seed):
    rep = fit_sweep(sweep(seed))
    for name in ("alpha", "beta"):
        c = rep.lr.law.coef(name)
        assert c.lo <= TRUE[name] <= c.hi, (name, c)
        assert c.hi - c.lo < 0.1  # informative, not just wide
    assert not rep.lr.curvature.detected


def test_interval_coverage_is_honest():
    """Over many noisy sweeps the 95% interval of alpha should cover the truth most of the time."""
    hits = sum(rep.lr.law.coef("alpha").lo <= TRUE["alpha"] <= rep.lr.law.coef("alpha").hi
               for rep in (fit_sweep(sweep(100 + s, noise=0.01)) for s in range(20)))
    assert hits >= 16


@pytest.mark.parametrize("seed", range(3))
def test_flags_upward_curvature_and_it_goes_away_in_effective_lr(seed):
    rep = fit_sweep(sweep(seed, gamma=0.04))
    c = rep.lr.curvature
    assert c.detected and c.direction == "upward"
    assert all(k.value > 0 for k in c.coefs)
    # the linear law extrapolates worse than the fit's own scatter suggests
    assert max(h.max_abs_z for h in rep.lr.holdouts) > 2
    eff = rep.effective
    assert not eff.curvature.detected
    assert eff.law.coef("alpha").lo <= TRUE["alpha"] <= eff.law.coef("alpha").hi
    assert any("goes away" in s for s in rep.summary)


def test_extrapolation_in_n_and_d_are_compared():
    rep = fit_sweep(sweep(0, gamma=0.04))
    axes = {h.axis for h in rep.lr.holdouts}
    assert axes == {"N", "D"}
    assert rep.lr.preferred_extrapolation in ("N", "D")
    best = min(rep.lr.holdouts, key=lambda h: h.mean_abs_log_error)
    assert best.axis == rep.lr.preferred_extrapolation


def test_edge_optimum_and_diverged_runs_are_reported():
    raw = synthetic_sweep([1e8, 1e9], [1e10], seed=0, noise=0.0, **TRUE)
    # cut the grid of the first group below its optimum: lowest loss at the largest lr
    g = raw[raw.params == 1e8]
    opt = g.loc[g.loss.idxmin(), "lr"]
    raw = raw[~((raw.params == 1e8) & (raw.lr >= opt))].copy()
    raw.loc[raw.index[-1], "loss"] = float("nan")
    ops = {o.params: o for o in find_optima(prepare_sweep(raw))}
    assert ops[1e8].lr_opt is None and "extend the sweep" in ops[1e8].note
    assert ops[1e9].n_diverged == 1 and ops[1e9].lr_opt is not None


def test_missing_column_is_a_user_error():
    df = synthetic_sweep([1e8], [1e10], norms=False).drop(columns=["tokens"])
    with pytest.raises(UserError, match="tokens"):
        prepare_sweep(df)


def test_column_map():
    df = synthetic_sweep(NS[:3], DS[:3], norms=False, noise=0.0, **TRUE).rename(columns={"params": "N", "loss": "eval"})
    rep = fit_sweep(prepare_sweep(df, {"params": "N", "loss": "eval"}))
    assert rep.lr.law.coef("alpha").value == pytest.approx(TRUE["alpha"], abs=1e-6)
    assert rep.effective is None


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


@pytest.mark.slow
def test_cli_fit_writes_json_and_html(tmp_path, capsys):
    csv = tmp_path / "sweep.csv"
    synthetic_sweep(NS, DS, gamma_n=0.04, gamma_d=0.04, seed=0, **TRUE).to_csv(csv, index=False)
    code, out, err = run_cli(["lr", "fit", str(csv), "--json", str(tmp_path / "f.json"),
                              "--html", str(tmp_path / "f.html")], capsys)
    assert code == 0, err
    assert "curvature detected" in out and "goes away" in out
    data = json.loads((tmp_path / "f.json").read_text())
    assert data["schema_version"] == 1 and data["lr"]["curvature"]["detected"] is True
    html = (tmp_path / "f.html").read_text()
    assert "Learning-rate law" in html and "plotly" in html.lower()


@pytest.mark.slow
def test_cli_fit_missing_columns_exit_2(tmp_path, capsys):
    csv = tmp_path / "bad.csv"
    csv.write_text("params,lr,loss\n1e8,1e-3,2.5\n")
    code, out, err = run_cli(["lr", "fit", str(csv)], capsys)
    assert code == 2
    assert "tokens" in err and "--columns" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_fit_missing_file_exit_2(tmp_path, capsys):
    code, _, err = run_cli(["lr", "fit", str(tmp_path / "nope.csv")], capsys)
    assert code == 2 and "not found" in err


@pytest.mark.slow
def test_cli_fit_bad_values_exit_2(tmp_path, capsys):
    csv = tmp_path / "neg.csv"
    csv.write_text("params,tokens,lr,loss\n1e8,1e9,-1e-3,2.5\n")
    code, _, err = run_cli(["lr", "fit", str(csv)], capsys)
    assert code == 2 and "'lr'" in err and "row 2" in err
