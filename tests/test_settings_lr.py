"""The settings system on `lr scale`, `lr fit` and `lr depth` (--spec, --set, --print-spec, flags
from the model), unknown --set keys on every command, and every flag's help written once: the
settings model's field description, with its key and default."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import cli_stdout, refused
from throughputlab.cli import cli
from throughputlab.settings.layers import field_at
from throughputlab.settings.options import show

SCALE = ("lr", "scale", "--lr", "1e-6", "--from-batch", "1024", "--to-batch", "8192", "--rule", "linear",
         "--beta2", "0.99")
DEPTH = ("lr", "depth", "--depths", "1,2", "--data", "1:0.25", "--data", "2:6", "--steps", "300", "--no-check-exact")


invoke = cli_stdout


@pytest.mark.parametrize("suffix", [".yaml", ".json", ""])
def test_lr_scale_print_spec_fed_back_gives_the_same_result(tmp_path, suffix):
    spec = yaml.safe_load(invoke(*SCALE, "--print-spec"))
    assert spec["lr"] == 1e-6 and spec["rule"] == "linear" and spec["beta2"] == 0.99 and spec["eps"] == 1e-8
    path = tmp_path / f"scale{suffix}"
    path.write_text(json.dumps(spec) if suffix == ".json" else invoke(*SCALE, "--print-spec"))
    assert invoke("lr", "scale", "--spec", str(path)) == invoke(*SCALE)
    assert "lr 1e-06 at batch 1024 -> 8e-06 at batch 8192 (rule linear, k = 8)" in invoke(*SCALE)


def test_lr_scale_layers_flags_over_the_file_and_set_over_the_flags(tmp_path):
    path = tmp_path / "scale.yaml"
    path.write_text("lr: 1.0e-3\nfrom_batch: 64\nto_batch: 256\nrule: none\n")
    assert "-> 0.001 at batch 256 (rule none" in invoke("lr", "scale", "--spec", str(path))
    assert "-> 0.002 at batch 256 (rule sqrt" in invoke("lr", "scale", "--spec", str(path), "--rule", "sqrt")
    out = invoke("lr", "scale", "--spec", str(path), "--rule", "sqrt", "--set", "rule=linear", "--set", "lr=1e-3")
    assert "-> 0.004 at batch 256 (rule linear" in out  # `1e-3` is text to YAML: read as the number


def test_lr_depth_and_fit_print_spec_fed_back(tmp_path):
    text = invoke(*DEPTH, "--print-spec")
    assert yaml.safe_load(text)["data"] == [[1.0, 0.25], [2.0, 6.0]]
    (tmp_path / "depth.yaml").write_text(text)
    assert invoke("lr", "depth", "--spec", str(tmp_path / "depth.yaml")) == invoke(*DEPTH)
    fit = ("lr", "fit", "sweep.csv", "--columns", "params=N,loss=eval_loss", "--window", "3")
    text = invoke(*fit, "--print-spec")
    assert yaml.safe_load(text) == {"sweep": "sweep.csv", "columns": {"params": "N", "loss": "eval_loss"},
                                    "window": 3, "alpha": 0.05}
    (tmp_path / "fit.yaml").write_text(text)
    assert invoke("lr", "fit", "--spec", str(tmp_path / "fit.yaml"), "--print-spec") == text


@pytest.mark.parametrize("args,close", [
    (("lr", "scale", "--set", "to_bach=8192"), "to_batch"),
    (("lr", "depth", "--set", "step_rat=0.2"), "step_rate"),
    (("lr", "fit", "s.csv", "--set", "colums.loss=x"), "columns"),
    (("bench", "--set", "measurement.round=1"), "measurement.rounds"),
    (("predict", "--model", "tiny", "--gpu", "h200", "--set", "layout.tpp=2"), "layout.tp"),
])
def test_set_of_an_unknown_key_is_one_line_naming_the_close_one(args, close):
    refused(*args, fragments=("unknown key", f"did you mean {close}"))


@pytest.mark.parametrize("args,fragments", [
    (("lr", "depth", "--data", "1-2"), ("--data", "EXX:EXY")),
    (("lr", "depth", "--set", "data=[1:0.25]"), ("--set data=[1:0.25]", "quoted")),
    (("lr", "depth", "--depths", "1,x"), ("--depths", "comma-separated")),
    (("lr", "depth", "--steps", "5"), ("--steps", "10")),
    (("lr", "scale", "--lr", "1e-6", "--from-batch", "1", "--to-batch", "2", "--beta1", "1"), ("--beta1", "less than 1")),
    (("lr", "scale", "--from-batch", "1", "--to-batch", "2"), ("--lr is required", "--set lr=")),
    (("lr", "fit"), ("SWEEP.csv is required",)),
    (("lr", "fit", "s.csv", "--columns", "foo=bar"), ("--columns", "unknown name 'foo'")),
])
def test_lr_bad_settings_are_one_line_errors(args, fragments):
    refused(*args, fragments=fragments)


def test_lr_spec_file_errors_name_the_file_and_key(tmp_path):
    path = tmp_path / "scale.yaml"
    path.write_text("lr: abc\n")
    refused("lr", "scale", "--spec", str(path), "--from-batch", "1", "--to-batch", "2",
            fragments=(f"--spec {path}", "lr", "valid number"))


def _flags_show_description_and_default(command: tuple[str, ...], model, flags: dict[str, str], shown=()):
    text = "".join(invoke(*command, "--help").split())  # click wraps (also at hyphens): compare without spaces
    params = {p.name: p for p in _command(command).params}
    for name, key in flags.items():
        field, default = field_at(model, key)
        assert field.description, f"{key} has no description"
        assert "".join(field.description.split()) in text, key
        assert f"[{key};default:" in text, key
        if name not in shown:
            assert "".join(f"[{key}; default: {show(default)}]".split()) in text, key
        assert params[name].help.startswith(field.description), key


def _command(path: tuple[str, ...]):
    import click

    ctx = click.Context(cli)
    cmd = cli
    for name in path:
        cmd = cmd.get_command(ctx, name)
    return cmd


def test_bench_help_shows_each_flags_description_and_default():
    from throughputlab.commands.bench import SPEC_FLAGS
    from throughputlab.records.settings import BenchSpec

    _flags_show_description_and_default(("bench",), BenchSpec, SPEC_FLAGS, shown=("only",))
    text = " ".join(invoke("bench", "--help").split())
    assert "Measure only generation or training. [only; default: both]" in text
    assert "Tokens per training sequence. [training.seq_len; default: 64]" in text


def test_lr_help_shows_each_flags_description_and_default():
    from throughputlab.lr.cli import DEPTH_FLAGS, FIT_FLAGS, SCALE_FLAGS
    from throughputlab.lr.settings import DepthSpec, FitSpec, ScaleSpec

    req = ("lr_value", "from_batch", "to_batch")
    _flags_show_description_and_default(("lr", "scale"), ScaleSpec, SCALE_FLAGS, shown=req + ("eps",))
    fit = {k: v for k, v in FIT_FLAGS.items() if k != "sweep"}  # SWEEP.csv is an argument: no help of its own
    _flags_show_description_and_default(("lr", "fit"), FitSpec, fit)
    _flags_show_description_and_default(("lr", "depth"), DepthSpec, DEPTH_FLAGS, shown=("data",))
    for sub in ("scale", "fit", "depth"):
        text = " ".join(invoke("lr", sub, "--help").split())
        assert "--print-spec" in text and "--set KEY=VALUE" in text and "--spec FILE" in text
