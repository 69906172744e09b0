"""One bench run's settings, a validated tree with one set of defaults
(:class:`~throughputlab.records.settings.BenchSpec`, in the records a profile stores), built
from its layers.

The tree is built in layers, later ones winning: the defaults < a spec file
(``--spec FILE``, YAML or JSON) < command-line flags < ``--set KEY=VALUE`` (dotted keys). With
``--resume`` the stored profile's spec takes the place of the defaults, so a bare
``bench --resume -o FILE`` continues exactly. Each layer is validated on its own before it is
merged, so an error names the file, the flag or the ``--set`` item it came from, and the key.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, NamedTuple, Optional, get_args

from pydantic import BaseModel, ValidationError

from throughputlab.errors import UserError
from throughputlab.files import read_settings
from throughputlab.models import check_local_model
from throughputlab.records.settings import INSTRUMENTS, BenchSpec

# ---------------------------------------------------------------- layers


class Layer(NamedTuple):
    """Part of a spec as nested dicts, and where it came from (for the error messages)."""

    source: str  # "--spec FILE", "--set KEY=VALUE", "options"
    values: dict[str, Any]
    names: dict[str, str] = {}  # dotted key -> how the user wrote it (a flag name); default: the key


def resolve(layers: list[Layer], base: Optional[dict[str, Any]] = None) -> BenchSpec:
    """The spec from ``base`` (default: the defaults) and ``layers``, later layers winning."""
    data: dict[str, Any] = dict(base or {})
    for layer in layers:
        validate(layer)
        data = merge(data, layer.values)
    spec = validate(Layer("the merged spec", data))
    # a model folder's config.json or a preset's name: checked now, before the run prints anything
    check_local_model(spec.model, random_weights=spec.random_weights, trust_remote_code=spec.trust_remote_code)
    return spec


def validate(layer: Layer) -> BenchSpec:
    try:
        return BenchSpec.model_validate(layer.values)
    except ValidationError as e:
        raise UserError(_describe(e, layer)) from None


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Sections merge key by key (engine_args too); lists and scalars are replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_spec_file(path: Path) -> Layer:
    """A YAML or JSON spec file (JSON by a .json suffix, else YAML), as a layer."""
    source, json_file = f"--spec {path}", Path(path).suffix.lower() == ".json"
    what = f"a {'JSON' if json_file else 'YAML'} spec file (`bench --print-spec` shows one)"
    return Layer(source, read_settings(path, what, source, yaml=not json_file))


def parse_set(item: str) -> Layer:
    """``--set generation.prompt_len=256``: a dotted key and a YAML value (scalar, list, mapping)."""
    import yaml

    source = f"--set {item}"
    key, sep, text = item.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not all(parts):
        raise UserError(f"--set expects KEY=VALUE with a dotted key such as generation.prompt_len=256, got {item!r}")
    try:
        value = yaml.safe_load(text) if text.strip() else None
    except yaml.YAMLError as e:
        raise UserError(f"{source}: the value is not valid YAML ({str(e).splitlines()[0]})") from None
    for p in reversed(parts):
        value = {p: value}
    return Layer(source, value, {key: source})


def as_layer(source: str, flat: dict[str, Any], names: Optional[dict[str, str]] = None) -> Layer:
    """A layer from dotted keys, e.g. the flags a user gave: ``{"generation.prompt_len": 8}``."""
    values: dict[str, Any] = {}
    for key, v in flat.items():
        *parents, last = key.split(".")
        d = values
        for p in parents:
            d = d.setdefault(p, {})
        d[last] = v
    return Layer(source, values, names or {})


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys to leaf values (lists are leaves)."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def differences(old: BenchSpec, new: BenchSpec, ignore: tuple[str, ...] = INSTRUMENTS) -> dict[str, tuple]:
    """Dotted key -> (old, new) where two specs differ, skipping the ``ignore`` sections."""
    a, b = flatten(old.model_dump(mode="json")), flatten(new.model_dump(mode="json"))
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and k.split(".")[0] not in ignore}


# The measured axes a resumed run may extend: dotted key -> the values the spec measures on it.
# The lengths count the single prompt or sequence length when no axis is given, so a profile of the
# default prompt extends to a context grid that keeps that prompt.
GRID_AXES = {
    "generation.concurrency": lambda s: s.generation.concurrency,
    "generation.contexts": lambda s: s.generation.prompt_lens,
    "training.micro_batches": lambda s: s.training.micro_batches,
    "training.seq_lens": lambda s: s.training.all_seq_lens,
}


def resume_differences(old: BenchSpec, new: BenchSpec) -> tuple[dict[str, tuple], dict[str, list[int]]]:
    """(what a resumed run may not change, the axes it extends). An axis is extended when the new
    list keeps every value the old one measured (``auto`` sweeps are not lists and never extend);
    the second dict maps its key to the added values, possibly none (a reordered list). More
    ``measurement.rounds`` extend too: every stored point gets the rounds it lacks."""
    diffs = differences(old, new)
    extended: dict[str, list[int]] = {}
    for key, values in GRID_AXES.items():
        if key not in diffs:
            continue
        a, b = values(old), values(new)
        if isinstance(a, list) and isinstance(b, list) and set(a) <= set(b):
            extended[key] = sorted(set(b) - set(a))
    if "measurement.rounds" in diffs and new.measurement.rounds > old.measurement.rounds:  # more samples a point
        extended["measurement.rounds"] = list(range(old.measurement.rounds + 1, new.measurement.rounds + 1))
    return {k: v for k, v in diffs.items() if k not in extended}, extended


def keys() -> list[str]:
    """Every dotted key of the tree (engine_args as one key: it takes any names)."""
    return list(_leaf_keys(BenchSpec))


def _leaf_keys(model: type[BaseModel], prefix: str = ""):
    for name, field in model.model_fields.items():
        sub = _section_class(field.annotation)
        if sub is not None:
            yield from _leaf_keys(sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def _section_class(annotation) -> Optional[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)), None)


def _describe(e: ValidationError, layer: Layer) -> str:
    """The first problem as one line: where it came from, the dotted key, what is wrong."""
    err = e.errors()[0]
    loc = [f"[{x}]" if isinstance(x, int) else str(x) for x in err["loc"]]  # list items: points[1]
    key = ".".join(loc).replace(".[", "[")
    more = f" ({e.error_count() - 1} more problem(s))" if e.error_count() > 1 else ""
    if err["type"] == "extra_forbidden":
        known = keys()
        close = [k for k in known if k.split(".")[-1] == loc[-1]] or difflib.get_close_matches(key, known, n=1)
        hint = f"; did you mean {close[0]}?" if close else "; `throughputlab bench --print-spec` shows every key"
        return f"{layer.source}: unknown key {key}{hint}{more}"
    head = f"{layer.source}: {key}"
    for i in range(len(loc), 0, -1):  # a flag or --set item names the key as the user wrote it
        name = layer.names.get(".".join(loc[:i]))
        if name is not None:
            head = name + (f": {'.'.join(loc[i:])}" if i < len(loc) else "")
            break
    msg = "must be a mapping of keys" if err["type"] == "model_type" else err["msg"].removeprefix("Value error, ")
    msg = msg[:1].lower() + msg[1:]
    got = f" (got {_short(err['input'])})" if "input" in err and "got " not in msg else ""
    return f"{head}: {msg}{got}{more}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
