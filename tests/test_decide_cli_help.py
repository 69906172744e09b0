"""`decide`'s flags take their help from the settings model: each settings flag shows its key's
description, the key and its default; the newer spec fields have flags that round-trip through
--print-spec."""

from __future__ import annotations

import click
import pytest
import yaml
from click.testing import CliRunner

from throughputlab.cli import cli
from throughputlab.decide.calculator import DecideSpec
from throughputlab.decide.cli import DECIDE_FLAGS, SHAPED_FLAGS, decide
from throughputlab.settings.layers import field_at

# the section flags' keys (they set a section in their own way), and which show a default
SECTION_KEYS = {"response_lengths": ("shape.response.file", False), "response_dist": ("shape.response.dist", True),
                "curves": ("samples.curves.path", False), "columns": ("samples.curves.columns", False),
                "nstar": ("samples.nstar", True)}


def params() -> dict[str, click.Option]:
    return {p.name: p for p in decide.params if isinstance(p, click.Option)}


@pytest.mark.parametrize("name", sorted(DECIDE_FLAGS))
def test_every_settings_flag_shows_its_description_key_and_default(name):
    key = DECIDE_FLAGS[name]
    field, _ = field_at(DecideSpec, key)
    assert field.description, f"{key} has no description"
    text = params()[name].help
    assert text.startswith(field.description), (name, text)
    assert f"[{key}; default: " in text and text.endswith("]"), (name, text)


@pytest.mark.parametrize("name", SHAPED_FLAGS)
def test_every_section_flag_shows_its_description_and_key(name):
    key, with_default = SECTION_KEYS[name]
    field, _ = field_at(DecideSpec, key)
    assert field.description, f"{key} has no description"
    text = params()[name].help
    assert text.startswith(field.description) and f"[{key}" in text, (name, text)
    assert ("; default: " in text) == with_default, (name, text)


def test_the_rendered_help_names_every_key():
    r = CliRunner().invoke(cli, ["decide", "--help"], terminal_width=100)
    assert r.exit_code == 0, r.output
    for key in [*DECIDE_FLAGS.values(), *(k for k, _ in SECTION_KEYS.values())]:
        assert f"[{key}" in r.output, key
    flat = " ".join(r.output.split())
    assert "[shape.response.dist; default: lognormal:mean=512,sigma=0.6,max=2048]" in flat
    assert "[shape.off_policy_steps; default: 1]" in flat


def test_the_newer_spec_fields_round_trip_through_print_spec(tmp_path):
    args = ["decide", "--profile", "p.json", "--train-backend", "megatron", "--train-tp", "2", "--train-pp", "4",
            "--train-ep", "8", "--off-policy-steps", "3"]
    r = CliRunner().invoke(cli, [*args, "--print-spec"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    spec = yaml.safe_load(r.stdout)
    assert spec["shape"]["train"]["backend"] == "megatron"
    assert (spec["shape"]["train"]["tp"], spec["shape"]["train"]["pp"], spec["shape"]["train"]["ep"]) == (2, 4, 8)
    assert spec["shape"]["off_policy_steps"] == 3
    (tmp_path / "d.yaml").write_text(r.stdout)
    again = CliRunner().invoke(cli, ["decide", "--spec", str(tmp_path / "d.yaml"), "--print-spec"],
                               catch_exceptions=False)
    assert again.stdout == r.stdout
    # the flags win over the file, --set over the flags
    over = CliRunner().invoke(cli, ["decide", "--spec", str(tmp_path / "d.yaml"), "--train-backend", "fsdp",
                                    "--set", "shape.train.tp=1", "--print-spec"], catch_exceptions=False)
    train = yaml.safe_load(over.stdout)["shape"]["train"]
    assert (train["backend"], train["tp"], train["pp"]) == ("fsdp", 1, 4)
