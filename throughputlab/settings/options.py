"""The command-line side of the settings: ``--spec``, ``--set`` and ``--print-spec`` on every command,
and flags derived from the settings model (each takes its key's description as help and shows its
key and default from the model, so no default is typed twice)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

import click
from click.core import ParameterSource
from pydantic import BaseModel

from throughputlab.settings.layers import Layer, as_layer, dump_yaml, field_at, parse_set, read_spec_file


def layer_options(command: str, example: str) -> Callable:
    """``--spec FILE``, ``--set KEY=VALUE`` and ``--print-spec``, worded alike on every command."""

    def deco(f):
        f = click.option("--print-spec", is_flag=True,
                         help="Print the resolved settings as YAML and exit without running (a template for --spec: "
                              "fed back, it gives the same result).")(f)
        f = click.option("--set", "set_items", multiple=True, metavar="KEY=VALUE",
                         help=f"Set one settings key, dotted, with a YAML value: --set {example} (repeatable; wins "
                              "over --spec and the flags).")(f)
        return click.option("--spec", "spec_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
                             help="A spec file with any part of the settings tree (JSON by a .json suffix, else "
                                  f"YAML); the flags override it. `{command} --print-spec` writes one.")(f)

    return deco


def setting_option(model: type[BaseModel], key: str, *decls: str, help: Optional[str] = None,
                   shown: Optional[str] = None, **kw) -> Callable:
    """A flag for one settings key: no default of its own (None: not given), so a spec file or a
    resumed profile is not overridden by a flag the user did not type. The help is the key's
    description (or ``help``), then ``[key; default: ...]`` from the model."""
    return click.option(*decls, default=None, help=described(model, key, help, shown), **kw)


def described(model: type[BaseModel], key: str, help: Optional[str] = None, shown: Optional[str] = None,
              with_default: bool = True, shown_key: Optional[str] = None) -> str:
    """A flag's help from the model: the key's description (or ``help``), then ``[key; default: ...]``
    (``[key]`` alone without the default; ``shown_key`` names a key below the field, as
    ``samples.curves.path`` for the field ``samples.curves``)."""
    field, default = field_at(model, key)
    text = help or field.description or ""
    tail = f"; default: {shown or show(default)}" if with_default else ""
    return f"{text} [{shown_key or key}{tail}]"


def show(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "all"
    if isinstance(value, dict):
        return "none" if not value else ", ".join(f"{k}={v}" for k, v in value.items())
    return "none" if value is None else str(value)


def given(ctx: click.Context, flags: dict[str, Any]) -> dict[str, Any]:
    """The flags the user typed (not left at their default), by click parameter name."""
    return {name: value for name, value in flags.items()
            if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)}


def flag_names(ctx: click.Context) -> dict[str, str]:
    """Click parameter name -> the flag as the user knows it (``--prompt-len``)."""
    return {p.name: p.opts[0] for p in ctx.command.params}


def command_layers(ctx: click.Context, spec_file: Optional[Path], command: str, flags: dict[str, Any],
                   keys: dict[str, str], set_items: tuple[str, ...], drops: tuple[str, ...] = ()) -> list[Layer]:
    """The layers a command line gives: the spec file, the flags typed (``flags`` by click name,
    ``keys`` mapping each to its dotted key), the --set items."""
    names = flag_names(ctx)
    layers = [read_spec_file(spec_file, command)] if spec_file is not None else []
    layers.append(as_layer("options", {keys[n]: v for n, v in flags.items()}, {keys[n]: names[n] for n in flags},
                           drops))
    return layers + [parse_set(item) for item in set_items]


def print_spec(settings: BaseModel) -> None:
    click.echo(dump_yaml(settings), nl=False)
