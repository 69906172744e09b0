"""One layered resolver over any settings model (a pydantic tree): `bench`, `predict` and `decide`
build their settings the same way.

The tree is built in layers, later ones winning: the model's defaults (or a base: a resumed
profile's stored spec, an RL run's launch config) < a spec file (``--spec FILE``) < the flags
< ``--set KEY=VALUE`` (dotted keys). Each layer is validated on its own before it is merged,
so an error names the file, the flag or the ``--set`` item it came from, and the key. Every
command reads a spec file the same way: JSON by a ``.json`` suffix, else YAML.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Generic, NamedTuple, Optional, TypeVar, get_args

from pydantic import BaseModel, ValidationError

from throughputlab.errors import UserError
from throughputlab.files import read_settings

M = TypeVar("M", bound=BaseModel)


class Layer(NamedTuple):
    """Part of a settings tree as nested dicts, and where it came from (for the error messages)."""

    source: str  # "--spec FILE", "--set KEY=VALUE", "options"
    values: dict[str, Any]
    names: dict[str, str] = {}  # dotted key -> how the user wrote it (a flag name); default: the key
    drops: tuple[str, ...] = ()  # dotted keys this layer replaces whole: removed before it is merged


class Settings(Generic[M]):
    """The layered resolver of one command's settings model."""

    def __init__(self, model: type[M], command: str):
        self.model, self.command = model, command

    def resolve(self, layers: list[Layer], base: Optional[dict[str, Any]] = None) -> M:
        """The settings from ``base`` (default: the model's defaults) and ``layers``, later layers winning."""
        data: dict[str, Any] = dict(base or {})
        for layer in layers:
            self.validate(layer, partial=True)
            for key in layer.drops:
                data = drop(data, key)
            data = merge(data, layer.values)
        try:
            return self.model.model_validate(data)
        except ValidationError as e:  # named after the last layer that set the key (or its section)
            loc = [str(x) for x in e.errors()[0]["loc"] if not isinstance(x, int)]
            owner = next((layer for i in range(len(loc), 0, -1) for layer in reversed(layers)
                          if _sets(layer.values, loc[:i])), None)
            raise UserError(self.describe(e, owner or Layer("the settings", data))) from None

    def validate(self, layer: Layer, partial: bool = False) -> M:
        """One layer's settings; ``partial``: a part of the tree, so a key another layer may give
        (a required one) or a check across keys (a section's own validator) waits for the merge."""
        try:
            return self.model.model_validate(layer.values)
        except ValidationError as e:
            if partial and all(_needs_the_rest(err, layer.values) for err in e.errors()):
                return None  # type: ignore[return-value]
            raise UserError(self.describe(e, layer)) from None

    def read_file(self, path: Path) -> Layer:
        return read_spec_file(path, self.command)

    def keys(self) -> list[str]:
        """Every dotted key of the tree (a mapping of free names, such as engine_args, is one key)."""
        return list(leaf_keys(self.model))

    def describe(self, e: ValidationError, layer: Layer) -> str:
        """The first problem as one line: where it came from, the dotted key, what is wrong."""
        err = e.errors()[0]
        loc = [f"[{x}]" if isinstance(x, int) else str(x) for x in err["loc"]]  # list items: points[1]
        loc = [x for x in loc if not x.startswith("function-")]  # a validator's own step is no key
        key = ".".join(loc).replace(".[", "[")
        more = f" ({e.error_count() - 1} more problem(s))" if e.error_count() > 1 else ""
        if err["type"] == "extra_forbidden":
            known = self.keys()
            close = [k for k in known if k.split(".")[-1] == loc[-1]] or difflib.get_close_matches(key, known, n=1)
            hint = (f"; did you mean {' or '.join(close[:2])}?" if close
                    else f"; `throughputlab {self.command} --print-spec` shows every key")
            return f"{layer.source}: unknown key {key}{hint}{more}"
        head = f"{layer.source}: {key}"
        for i in range(len(loc), 0, -1):  # a flag or --set item names the key as the user wrote it
            named = ".".join(loc[:i])
            name = layer.names.get(named)
            if name is not None:
                rest = ".".join(loc[i:]).replace(".[", "[")
                head = name + (f": {rest}" if rest else "" if named in name else f": {named}")  # the flag, then the key
                break
        if head == f"{layer.source}: {key}" and key:  # a section's own check: the flags that set keys in it
            under = [n for k, n in layer.names.items() if k.startswith(key + ".")]
            head = f"{', '.join(under)}: {key}" if under else head
        msg = "must be a mapping of keys" if err["type"] in ("model_type", "dict_type") \
            else err["msg"].removeprefix("Value error, ")
        msg = msg[:1].lower() + msg[1:]
        shown = "input" in err and "got " not in msg and not (isinstance(err["input"], dict) and err["type"] != "model_type")
        got = f" (got {_short(err['input'])})" if shown else ""
        return f"{head}: {msg}{got}{more}"


def _sets(values: dict[str, Any], loc: list[str]) -> bool:
    """Whether a layer sets the key at ``loc`` or a part of it."""
    d: Any = values
    for part in loc:
        if not isinstance(d, dict) or part not in d:
            return False
        d = d[part]
    return True


def _needs_the_rest(err: dict, values: dict[str, Any]) -> bool:
    """A missing key, or a section's own check (its location is the section, not a key it holds)."""
    if err["type"] == "missing":
        return True
    loc = [str(x) for x in err["loc"] if not isinstance(x, int)]
    d: Any = values
    for part in loc:
        d = d.get(part) if isinstance(d, dict) else None
    return isinstance(d, dict) and err["type"] == "value_error"


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Sections merge key by key (engine_args too); lists and scalars are replaced."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def drop(data: dict[str, Any], key: str) -> dict[str, Any]:
    """``data`` without the dotted ``key`` (a section, or one leaf)."""
    head, _, rest = key.partition(".")
    if head not in data:
        return data
    out = dict(data)
    if not rest:
        del out[head]
    elif isinstance(out[head], dict):
        out[head] = drop(out[head], rest)
    return out


def read_spec_file(path: Path, command: str) -> Layer:
    """A spec file as a layer: JSON by a .json suffix, else YAML (any suffix, or none), for every command."""
    source, json_file = f"--spec {path}", Path(path).suffix.lower() == ".json"
    what = f"a {'JSON' if json_file else 'YAML'} spec file (`throughputlab {command} --print-spec` shows one)"
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


def as_layer(source: str, flat: dict[str, Any], names: Optional[dict[str, str]] = None,
             drops: tuple[str, ...] = ()) -> Layer:
    """A layer from dotted keys, e.g. the flags a user gave: ``{"generation.prompt_len": 8}``."""
    values: dict[str, Any] = {}
    for key, v in flat.items():
        *parents, last = key.split(".")
        d = values
        for p in parents:
            d = d.setdefault(p, {})
        d[last] = v
    return Layer(source, values, names or {}, drops)


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys to leaf values (lists are leaves)."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def dump_yaml(settings: BaseModel) -> str:
    """The resolved settings as a spec file (`--print-spec`): every key, None as null; one key a
    line (a section's keys indented under it), a list of scalars on its key's line."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(dict, lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data, flow_style=False))
    return yaml.dump(settings.model_dump(mode="json"), Dumper=Dumper, sort_keys=False, default_flow_style=None)


def leaf_keys(model: type[BaseModel], prefix: str = ""):
    for name, field in model.model_fields.items():
        sub = section_class(field.annotation)
        if sub is not None:
            yield from leaf_keys(sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}"


def section_class(annotation) -> Optional[type[BaseModel]]:
    """The settings class of a section field (``Optional[...]`` and ``Annotated[...]`` unwrapped)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for a in get_args(annotation):
        found = section_class(a)
        if found is not None:
            return found
    return None


def field_at(model: type[BaseModel], key: str):
    """The pydantic field of a dotted key, and its default (walking the model's default sections)."""
    parts = key.split(".")
    value: Any = model()
    cls = model
    for i, part in enumerate(parts):
        field = cls.model_fields[part]
        value = getattr(value, part) if value is not None else field.get_default(call_default_factory=True)
        if i < len(parts) - 1:
            cls = section_class(field.annotation)
    return field, value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
