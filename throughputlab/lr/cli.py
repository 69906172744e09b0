"""`throughputlab lr`: batch-size lr rules, lr-law fitting, and the deep scalar linear network study.

Each subcommand's settings are one tree (throughputlab.lr.settings), layered like every command's:
defaults < --spec FILE < flags < --set KEY=VALUE, with --print-spec. Flags are read as text and
checked by the settings model, so every bad value is one line and exit code 2.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import click

from throughputlab.errors import UserError
from throughputlab.lr.settings import DepthSpec, FitSpec, ScaleSpec
from throughputlab.settings.options import layer_options, setting_option

# flag (click parameter name) -> settings key, per subcommand; the models hold the defaults and the help
SCALE_FLAGS = {"lr_value": "lr", "from_batch": "from_batch", "to_batch": "to_batch", "rule": "rule",
               "beta1": "beta1", "beta2": "beta2", "eps": "eps"}
FIT_FLAGS = {"sweep": "sweep", "columns": "columns", "window": "window", "alpha_level": "alpha"}
DEPTH_FLAGS = {"depths": "depths", "data": "data", "step_rate": "step_rate", "p0": "p0", "steps": "steps",
               "check_exact": "check_exact"}


@click.group(name="lr")
def lr() -> None:
    """Learning-rate tools: scale lr with the batch, fit lr laws from sweeps, depth-wise lr for deep linear nets.

    \b
      throughputlab lr scale --lr 1e-6 --from-batch 1024 --to-batch 8192 --rule sqrt
      throughputlab lr fit sweep.csv --json fit.json --html fit.html
      throughputlab lr depth
    """


def _resolve(ctx: click.Context, model, command: str, keys: dict[str, str], spec_file: Optional[Path],
             set_items: tuple[str, ...], print_spec: bool, flags: dict[str, Any]):
    """The subcommand's settings from its layers; None after printing them (--print-spec)."""
    from throughputlab.settings import Settings
    from throughputlab.settings.options import command_layers, given
    from throughputlab.settings.options import print_spec as echo_spec

    layers = command_layers(ctx, spec_file, command, given(ctx, flags), keys, set_items)
    spec = Settings(model, command).resolve(layers)
    if print_spec:
        echo_spec(spec)
        return None
    return spec


def _require(value, option: str, key: str, command: str):
    if value is None:
        raise UserError(f"{option} is required ({key} in a --spec file or --set {key}=...; see "
                        f"`throughputlab {command} --help`)")
    return value


def _option(model, keys: dict[str, str]):
    def option(*decls: str, **kw):
        return setting_option(model, keys[decls[-1]], *decls, **kw)

    return option


scale_option = _option(ScaleSpec, SCALE_FLAGS)


@lr.command()
@layer_options("lr scale", "to_batch=8192, --set rule=linear")
@scale_option("--lr", "lr_value", metavar="LR", shown="required")
@scale_option("--from-batch", "from_batch", metavar="B0", shown="required")
@scale_option("--to-batch", "to_batch", metavar="B", shown="required")
@scale_option("--rule", "rule", metavar="sqrt|linear|none")
@scale_option("--beta1", "beta1")
@scale_option("--beta2", "beta2")
@scale_option("--eps", "eps", shown="1e-8")
@click.pass_context
def scale(ctx: click.Context, spec_file: Optional[Path], set_items: tuple[str, ...], print_spec: bool, **flags):
    """Learning rate for a new batch size, with Adam's full SDE scaling rule beside it.

    The SDE rule (Malladi et al. 2022) also moves Adam's betas and epsilon with k = B/B0:
    lr*sqrt(k), 1-beta multiplied by k, eps/sqrt(k).

    The settings are one tree (`--print-spec` shows it), built in this order, later winning:
    the defaults < --spec FILE < the flags below < --set KEY=VALUE.
    """
    from throughputlab.lr.rules import scale_adam_sde, scale_lr

    spec = _resolve(ctx, ScaleSpec, "lr scale", SCALE_FLAGS, spec_file, set_items, print_spec, flags)
    if spec is None:
        return
    lr_v = _require(spec.lr, "--lr", "lr", "lr scale")
    b0 = _require(spec.from_batch, "--from-batch", "from_batch", "lr scale")
    b1 = _require(spec.to_batch, "--to-batch", "to_batch", "lr scale")
    rule = spec.rule
    new_lr = scale_lr(lr_v, b0, b1, rule)
    sde = scale_adam_sde(lr_v, b0, b1, spec.beta1, spec.beta2, spec.eps)
    click.echo(f"lr {lr_v:.6g} at batch {b0:g} -> {new_lr:.6g} at batch {b1:g} (rule {rule}, k = {sde.k:g})")
    click.echo(f"Adam SDE rule: lr {sde.lr:.6g}, beta1 {sde.beta1:.6g}, beta2 {sde.beta2:.6g}, eps {sde.eps:.3g}")
    if sde.k > 1 and (sde.beta1 == 0.0 or sde.beta2 == 0.0):
        click.echo("note: k*(1-beta) reached 1, so a beta was clipped at 0: the SDE rule does not hold this far")


fit_option = _option(FitSpec, FIT_FLAGS)


@lr.command()
@click.argument("sweep", metavar="SWEEP.csv", required=False)
@layer_options("lr fit", "window=3, --set columns.loss=eval_loss")
@fit_option("--columns", "columns", metavar="NAME=CSVCOL,...")
@fit_option("--window", "window")
@fit_option("--alpha", "alpha_level")
@click.option("--json", "json_out", metavar="OUT", help="Write the full result as JSON.")
@click.option("--html", "html_out", metavar="OUT", help="Write an offline HTML page with the figures.")
@click.pass_context
def fit(ctx: click.Context, spec_file: Optional[Path], set_items: tuple[str, ...], print_spec: bool,
        json_out: Optional[str], html_out: Optional[str], **flags):
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

    The settings are one tree (`--print-spec` shows it; its key sweep is SWEEP.csv), built in
    this order, later winning: the defaults < --spec FILE < the flags below < --set KEY=VALUE.
    """
    from throughputlab.lr.law import fit_sweep, load_sweep

    spec = _resolve(ctx, FitSpec, "lr fit", FIT_FLAGS, spec_file, set_items, print_spec, flags)
    if spec is None:
        return
    sweep = _require(spec.sweep, "SWEEP.csv", "sweep", "lr fit")
    df = load_sweep(sweep, spec.columns)
    rep = fit_sweep(df, window=spec.window, alpha_level=spec.alpha, source=sweep)
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


def _datasets(pairs) -> dict:
    from throughputlab.lr.scalar import ScalarData

    out = {}
    for exx, exy in pairs:
        d = ScalarData(exx, exy)
        out[f"E[x2]={d.exx:g},E[xy]={d.exy:g} (p*={d.p_star:.3g})"] = d
    return out


def _fmt(v, spec=".4f"):
    return "diverged" if v is None else format(v, spec)


depth_option = _option(DepthSpec, DEPTH_FLAGS)


@lr.command()
@layer_options("lr depth", "depths=[1,2,4], --set data=[[1,0.25]]")
@depth_option("--depths", "depths", metavar="LIST")
@depth_option("--data", "data", multiple=True, metavar="EXX:EXY", shown="1:0.25 1:1.5 2:6")
@depth_option("--step-rate", "step_rate")
@depth_option("--p0", "p0")
@depth_option("--steps", "steps")
@depth_option("--check-exact/--no-check-exact", "check_exact")
@click.option("--json", "json_out", metavar="OUT", help="Write the rows as JSON.")
@click.pass_context
def depth(ctx: click.Context, spec_file: Optional[Path], set_items: tuple[str, ...], print_spec: bool,
          json_out: Optional[str], **flags):
    """Deep scalar linear nets f(x) = w_L...w_1 x: which per-depth lr gives the same convergence rate?

    Gradient descent is run at every depth with two rules: lr = lr_1 / L (data-agnostic, lr_1
    the depth-1 rate-r step) and lr_L = r / (L E[x^2] p*^(2-2/L)), p* = E[xy]/E[x^2] (data-
    dependent). Rates are per step, -d log|p - p*| / dk, measured on the simulated runs.

    The settings are one tree (`--print-spec` shows it), built in this order, later winning: the
    defaults < --spec FILE < the flags below < --set KEY=VALUE.
    """
    from throughputlab.lr import scalar as sn

    spec = _resolve(ctx, DepthSpec, "lr depth", DEPTH_FLAGS, spec_file, set_items, print_spec, flags)
    if spec is None:
        return
    datasets = _datasets(spec.data)
    d_list, n_steps, p0_v, check_exact = spec.depths, spec.steps, spec.p0, spec.check_exact
    for name, d in datasets.items():
        if d.p_star == p0_v:
            raise UserError(f"--p0 {p0_v:g} is already the optimum of data {name}: pick another --p0 or --data")
    study = sn.depth_study(datasets, d_list, spec.step_rate, p0_v, n_steps)

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
