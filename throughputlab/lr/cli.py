"""`throughputlab lr`: batch-size lr rules, lr-law fitting, and the deep scalar linear network study.

Options are read as text and checked by the library, so every bad value is one line and exit code 2.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import click

from throughputlab.errors import UserError


@click.group(name="lr")
def lr() -> None:
    """Learning-rate tools: scale lr with the batch, fit lr laws from sweeps, depth-wise lr for deep linear nets.

    \b
      throughputlab lr scale --lr 1e-6 --from-batch 1024 --to-batch 8192 --rule sqrt
      throughputlab lr fit sweep.csv --json fit.json --html fit.html
      throughputlab lr depth
    """


def _require(value, option: str):
    if value is None:
        raise UserError(f"{option} is required (see `throughputlab lr --help`)")
    return value


def _number(value: str, option: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{option} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise UserError(f"{option} must be a finite number, got {value!r}")
    return v


@lr.command()
@click.option("--lr", "lr_value", metavar="LR", help="Learning rate tuned at --from-batch.")
@click.option("--from-batch", metavar="B0", help="Batch size (sequences or tokens) the lr was tuned at.")
@click.option("--to-batch", metavar="B", help="Batch size to run at (same unit as --from-batch).")
@click.option("--rule", default="sqrt", show_default=True, metavar="sqrt|linear|none",
              help="sqrt: lr*sqrt(B/B0), for Adam-family optimizers; linear: lr*B/B0, for SGD; none: keep lr.")
@click.option("--beta1", default="0.9", show_default=True, help="Adam beta1, for the SDE rule shown beside.")
@click.option("--beta2", default="0.999", show_default=True, help="Adam beta2, for the SDE rule shown beside.")
@click.option("--eps", default="1e-8", show_default=True, help="Adam epsilon, for the SDE rule shown beside.")
def scale(lr_value, from_batch, to_batch, rule, beta1, beta2, eps):
    """Learning rate for a new batch size, with Adam's full SDE scaling rule beside it.

    The SDE rule (Malladi et al. 2022) also moves Adam's betas and epsilon with k = B/B0:
    lr*sqrt(k), 1-beta multiplied by k, eps/sqrt(k).
    """
    from throughputlab.lr.rules import scale_adam_sde, scale_lr

    lr_v = _require(lr_value, "--lr")
    b0 = _require(from_batch, "--from-batch")
    b1 = _require(to_batch, "--to-batch")
    new_lr = scale_lr(lr_v, b0, b1, rule)
    sde = scale_adam_sde(lr_v, b0, b1, _number(beta1, "--beta1"), _number(beta2, "--beta2"), _number(eps, "--eps"))
    click.echo(f"lr {float(lr_v):.6g} at batch {float(b0):g} -> {new_lr:.6g} at batch {float(b1):g} "
               f"(rule {rule}, k = {sde.k:g})")
    click.echo(f"Adam SDE rule: lr {sde.lr:.6g}, beta1 {sde.beta1:.6g}, beta2 {sde.beta2:.6g}, eps {sde.eps:.3g}")
    if sde.k > 1 and (sde.beta1 == 0.0 or sde.beta2 == 0.0):
        click.echo("note: k*(1-beta) reached 1, so a beta was clipped at 0: the SDE rule does not hold this far")


@lr.command()
@click.argument("sweep", metavar="SWEEP.csv")
@click.option("--columns", metavar="NAME=CSVCOL,...",
              help="Map CSV columns onto params,tokens,lr,loss[,weight_norm,update_norm | effective_lr], "
                   "e.g. params=N,tokens=D,loss=eval_loss. Unmapped names are read as they are.")
@click.option("--window", default="2", show_default=True,
              help="Points on each side of the lowest loss used in the quadratic fit in log lr.")
@click.option("--alpha", "alpha_level", default="0.05", show_default=True,
              help="Significance level of the curvature test.")
@click.option("--json", "json_out", metavar="OUT", help="Write the full result as JSON.")
@click.option("--html", "html_out", metavar="OUT", help="Write an offline HTML page with the figures.")
def fit(sweep, columns, window, alpha_level, json_out, html_out):
    """Fit log lr* = c0 + alpha log N + beta log D from an lr sweep, and test it for curvature.

    \b
    SWEEP.csv: one row per run with columns
      params        model parameters N
      tokens        training tokens D
      lr            learning rate
      loss          final loss (NaN/inf: diverged, left out)
      weight_norm, update_norm   optional: ||W|| and per-step ||dW||, or
      effective_lr               optional: ||dW||/||W|| directly
    With norms the same law is fitted on the effective learning rate, which says whether the
    curvature in lr* goes away there.
    """
    from throughputlab.lr.law import fit_sweep, load_sweep, parse_column_map

    try:
        w = int(window)
    except ValueError:
        raise UserError(f"--window must be a positive integer, got {window!r}") from None
    df = load_sweep(sweep, parse_column_map(columns))
    rep = fit_sweep(df, window=w, alpha_level=_number(alpha_level, "--alpha"), source=sweep)
    for line in rep.summary:
        click.echo(line)
    if json_out:
        _write(json_out, rep.model_dump_json(indent=2))
        click.echo(f"wrote {json_out}")
    if html_out:
        from throughputlab.lr.report import lr_fit_section
        from throughputlab.report.page import render_html

        _write(html_out, render_html(f"Learning-rate law: {Path(sweep).name}", [lr_fit_section(rep)],
                                     subtitle=f"{rep.n_runs} runs"))
        click.echo(f"wrote {html_out}")


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise UserError(f"cannot write {path!r}: {e.strerror}") from None


DEFAULT_DATA = ("1:0.25", "1:1.5", "2:6")


def _parse_data(values) -> dict:
    from throughputlab.lr.scalar import ScalarData

    out = {}
    for v in values:
        parts = v.split(":")
        if len(parts) != 2:
            raise UserError(f"--data takes EXX:EXY (E[x^2]:E[xy]), got {v!r}")
        d = ScalarData(_number(parts[0], "--data E[x^2]"), _number(parts[1], "--data E[xy]"))
        out[f"E[x2]={d.exx:g},E[xy]={d.exy:g} (p*={d.p_star:.3g})"] = d
    return out


def _parse_depths(text: str) -> list[int]:
    try:
        depths = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--depths takes comma-separated positive integers, got {text!r}") from None
    if not depths or any(d < 1 for d in depths):
        raise UserError(f"--depths takes comma-separated positive integers, got {text!r}")
    return depths


def _fmt(v, spec=".4f"):
    return "diverged" if v is None else format(v, spec)


@lr.command()
@click.option("--depths", default="1,2,4,8,16,32,64,128", show_default=True, help="Depths L to simulate.")
@click.option("--data", "data", multiple=True, metavar="EXX:EXY",
              help=f"Data second moments E[x^2]:E[xy]; repeat for several. Default: {' '.join(DEFAULT_DATA)}.")
@click.option("--step-rate", default="0.1", show_default=True,
              help="Target per-step contraction 1 - r of |p - p*| for the data-dependent rule.")
@click.option("--p0", default="1.0", show_default=True, help="Start product (balanced layers; 1 = identity).")
@click.option("--steps", default="20000", show_default=True, help="Most gradient-descent steps per run.")
@click.option("--check-exact/--no-check-exact", default=True, show_default=True,
              help="Also compare the exact gradient-flow solution with simulated GD at depths 1, 2, 3, 8.")
@click.option("--json", "json_out", metavar="OUT", help="Write the rows as JSON.")
def depth(depths, data, step_rate, p0, steps, check_exact, json_out):
    """Deep scalar linear nets f(x) = w_L...w_1 x: which per-depth lr gives the same convergence rate?

    Gradient descent is run at every depth with two rules: lr = lr_1 / L (data-agnostic, lr_1
    the depth-1 rate-r step) and lr_L = r / (L E[x^2] p*^(2-2/L)), p* = E[xy]/E[x^2] (data-
    dependent). Rates are per step, -d log|p - p*| / dk, measured on the simulated runs.
    """
    from throughputlab.lr import scalar as sn

    datasets = _parse_data(data or DEFAULT_DATA)
    d_list = _parse_depths(depths)
    try:
        n_steps = int(steps)
    except ValueError:
        raise UserError(f"--steps must be a positive integer, got {steps!r}") from None
    if n_steps < 10:
        raise UserError(f"--steps must be at least 10, got {n_steps}")
    p0_v = _number(p0, "--p0")
    for name, d in datasets.items():
        if d.p_star == p0_v:
            raise UserError(f"--p0 {p0_v:g} is already the optimum of data {name}: pick another --p0 or --data")
    study = sn.depth_study(datasets, d_list, _number(step_rate, "--step-rate"), p0_v, n_steps)

    left = abs(1 - study.step_rate)  # the error's factor per step near p*: 1 - r, overshooting past r = 1
    target = f"{-math.log(left):.4f}" if left > 0 else "inf (one step reaches p* near it)"
    click.echo(f"Linear convergence rate per GD step (-d log|p - p*|/dk), start p0 = {p0_v:g}, "
               f"target rate -log|1 - {study.step_rate:g}| = {target}")
    for name in datasets:
        rows = [r for r in study.rows if r.dataset == name]
        click.echo(f"\ndata {name}")
        click.echo(f"{'depth':>6} {'lr (1/depth)':>13} {'rate (1/depth)':>15} {'lr (data)':>11} {'rate (data)':>12}")
        for dd in d_list:
            a = next(r for r in rows if r.depth == dd and r.rule == "1/depth")
            b = next(r for r in rows if r.depth == dd and r.rule == "data")
            click.echo(f"{dd:>6} {a.lr:>13.4g} {_fmt(a.measured_rate):>15} {b.lr:>11.4g} {_fmt(b.measured_rate):>12}")
    click.echo("")
    for rule, label in (("data", "data-dependent lr"), ("1/depth", "lr proportional to 1/depth")):
        per = []
        for name in datasets:
            s = study.spread(rule, name)
            per.append(f"{'diverged/stalled' if s is None else format(s, '.3f')}")
        spread = study.spread(rule)
        click.echo(f"{label}: max/min rate over depths, per data set: {', '.join(per)}; over all: "
                   + ("some runs diverged or did not converge" if spread is None else f"{spread:.3f}"))
    exact_rows = []
    if check_exact:
        ref = next(iter(datasets.values()))
        p_start = p0_v if p0_v != ref.p_star else 0.5 * ref.p_star
        click.echo(f"\nExact gradient flow vs simulated GD (data {next(iter(datasets))}, p0 = {p_start:g}, t in [0, 8]):")
        click.echo(f"{'depth':>6} {'GD steps':>9} {'GD step':>8} {'max rel err GD':>15} "
                   f"{'GD extrapolated':>16} {'ODE solver':>11}")
        for dd in (1, 2, 3, 8):
            r = sn.exact_vs_gd(dd, ref, p_start, 8.0)
            exact_rows.append(r)
            click.echo(f"{dd:>6} {r.steps:>9} {r.lr:>8.1e} {r.gd_max_rel_err:>15.2e} "
                       f"{r.extrapolated_max_rel_err:>16.2e} {r.ode_max_rel_err:>11.2e}")
        click.echo("(GD at step h is within O(h) of the flow; 'extrapolated' combines GD at h, 2h, 4h "
                   "to cancel the O(h) and O(h^2) terms)")
    if json_out:
        _write(json_out, json.dumps({"step_rate": study.step_rate, "p0": study.p0,
                                     "rows": [asdict(r) for r in study.rows],
                                     "exact_check": [asdict(r) for r in exact_rows]}, indent=2))
        click.echo(f"wrote {json_out}")
