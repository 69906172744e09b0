"""One bench run's settings: a validated tree with one set of defaults (:class:`BenchSpec`).

The tree is built in layers, later ones winning: the defaults here < a spec file
(``--spec FILE``, YAML or JSON) < command-line flags < ``--set KEY=VALUE`` (dotted keys). With
``--resume`` the stored profile's spec takes the place of the defaults, so a bare
``bench --resume -o FILE`` continues exactly. Each layer is validated on its own before it is
merged, so an error names the file, the flag or the ``--set`` item it came from, and the key.

:class:`Measurement` is the sweep runner's hygiene; :class:`SweepSettings` is the resolved
part of the spec a profile records (dtype and device as resolved on the machine), the only
record of the settings in profiles written before the spec existed.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, Optional, TypeVar, Union, get_args

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from throughputlab.errors import UserError


def _x_values(value: Any) -> Any:
    """A concurrency or micro-batch list: ``auto``, a list, one integer, or ``"1,2,4"`` (a --set
    value YAML reads as text); sorted without duplicates. Checked here so that the error names
    the list, not one branch of the auto-or-list union."""
    if isinstance(value, str):
        if value.strip().lower() == "auto":
            return "auto"
        parts = [p.strip() for p in value.split(",")]
        if not all(p.isdigit() for p in parts):
            raise ValueError(f"takes auto or positive integers such as 1,2,4, got {value!r}")
        value = [int(p) for p in parts]
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ValueError(f"takes auto or a non-empty list of positive integers, got {value!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise ValueError(f"values must be positive integers, got {value!r}")
    return sorted(set(value))


def _device(value: str) -> str:
    if value in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", value):
        return value
    raise ValueError(f"must be auto, cpu, cuda or cuda:N, got {value!r}")


def _lengths(value):
    """A list of positive token counts (``128,512,2048`` on the command line), sorted, unique."""
    if value is None:
        return None
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if not all(p.isdigit() for p in parts):
            raise ValueError(f"takes positive integers such as 128,512,2048, got {value!r}")
        value = [int(p) for p in parts]
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value or \
            not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise ValueError(f"takes a non-empty list of positive integers, got {value!r}")
    return sorted(set(value))


XValues = Annotated[Union[list[int], str], BeforeValidator(_x_values)]  # a list, or "auto" (checked above)
Lengths = Annotated[Optional[list[int]], BeforeValidator(_lengths)]
PositiveInt = Annotated[int, Field(gt=0)]
Device = Annotated[str, AfterValidator(_device)]


class _Section(BaseModel):
    # strict: `prompt_len: "64"` or `rounds: true` in a file is a mistake to name, not to coerce
    model_config = ConfigDict(extra="forbid", strict=True)


class GenerationSpec(_Section):
    """The generation sweep: concurrency c is c sequences decoded together."""

    backend: Literal["hf", "vllm", "openai"] = "hf"
    concurrency: XValues = [1, 2, 4, 8, 16, 32, 64]
    # The default run's shape (README, "What the default run measures"): short prompts and 8 output
    # tokens keep it within two minutes on a slow 2-core CPU; 7 decode steps a run are each timed.
    prompt_len: PositiveInt = 16
    output_len: Annotated[int, Field(ge=2)] = 8  # one token from the prefill, at least one decode step
    engine_args: dict[str, Any] = {}
    tensor_parallel: PositiveInt = 1  # vllm: one engine over this many devices (tensor_parallel_size)
    data_parallel: PositiveInt = 1  # vllm: this many engine replicas on disjoint devices, measured together
    # the context axis: every concurrency at each of these prompt lengths (the KV context decode reads);
    # None: prompt_len alone
    contexts: Lengths = None

    @property
    def prompt_lens(self) -> list[int]:
        return list(self.contexts) if self.contexts else [self.prompt_len]
    url: Optional[str] = None  # openai backend
    served_model: Optional[str] = None  # openai backend: the name the server expects


class TrainingSpec(_Section):
    """The training sweep: a micro-batch of b sequences, forward, backward, AdamW."""

    backend: Literal["torch"] = "torch"
    micro_batches: XValues = [1, 2, 4, 8]
    seq_len: PositiveInt = 64
    seq_lens: Lengths = None  # every micro-batch at each of these sequence lengths; None: seq_len alone
    effective_lr: bool = False  # record ||dW||/||W|| per parameter group

    @property
    def all_seq_lens(self) -> list[int]:
        return list(self.seq_lens) if self.seq_lens else [self.seq_len]


class Measurement(_Section):
    """The sweep runner's hygiene: how each point is measured."""

    warmup: Annotated[int, Field(ge=0)] = 1  # untimed runs: first visit (training under glibc on the CPU: every visit)
    repeats: PositiveInt = 1  # timed runs per point and round
    rounds: PositiveInt = 2  # passes over the sweep, each adding `repeats` samples to every point
    max_cv: Annotated[float, Field(gt=0)] = 0.10  # tokens/s spread above which a point is measured again
    max_remeasure: Annotated[int, Field(ge=0)] = 1  # at most this many extra rounds (or re-measurements)
    auto_cap: PositiveInt = 1024  # largest value an `auto` sweep tries


class Telemetry(_Section):
    enabled: bool = True
    hz: Annotated[float, Field(gt=0)] = 20.0


class PySpy(_Section):
    """Flame graphs of the host processes: an instrument that may change between resumed runs."""

    enabled: bool = False
    points: list[PositiveInt] = []  # concurrencies/micro-batches to profile; empty: all


T = TypeVar("T")
# an empty section in YAML (`generation:` with every key commented out) reads as null
Section = Annotated[T, BeforeValidator(lambda v: {} if v is None else v)]


class BenchSpec(_Section):
    model: str = "demo"  # preset, model folder or hub id
    only: Optional[Literal["gen", "train"]] = None  # None: both sweeps
    dtype: Literal["auto", "bfloat16", "float16", "float32", "bf16", "fp16", "fp32"] = "auto"
    device: Device = "auto"
    seed: int = 0
    random_weights: bool = False  # for a model folder or hub id (presets always use random weights)
    trust_remote_code: bool = False
    generation: Section[GenerationSpec] = GenerationSpec()
    training: Section[TrainingSpec] = TrainingSpec()
    measurement: Section[Measurement] = Measurement()
    telemetry: Section[Telemetry] = Telemetry()
    py_spy: Section[PySpy] = PySpy()

    @property
    def run_gen(self) -> bool:
        return self.only in (None, "gen")

    @property
    def run_train(self) -> bool:
        return self.only in (None, "train")

    def check(self) -> None:
        """What one key cannot say alone."""
        if self.generation.backend == "openai" and not self.generation.url and self.run_gen:
            raise UserError("--backend openai needs --url (generation.url), e.g. --url http://127.0.0.1:8000/v1")
        if self.generation.tensor_parallel > 1 and self.generation.backend != "vllm" and self.run_gen:
            raise UserError(f"--tensor-parallel {self.generation.tensor_parallel} needs --backend vllm "
                            "(generation.tensor_parallel): the hf backend runs on one device")
        if self.generation.data_parallel > 1 and self.run_gen:
            if self.generation.backend != "vllm":
                raise UserError(f"--data-parallel {self.generation.data_parallel} needs --backend vllm "
                                "(generation.data_parallel): replicas are vLLM engines")
            if self.only != "gen":
                raise UserError("--data-parallel runs the generation sweep on engine replicas: add --only gen "
                                "(measure training in a run of its own)")


DEFAULTS = BenchSpec()
INSTRUMENTS = ("py_spy",)  # sections that do not change what is measured: may differ on --resume


class SweepSettings(BaseModel):
    """What a profile records of its settings: the spec's measured part, dtype and device as
    resolved on the machine. Profiles written before the spec existed have only this."""

    model_config = ConfigDict(extra="forbid")

    dtype: str
    device: str
    gen_backend: Optional[str] = None
    train_backend: Optional[str] = None
    # what a profile without the key measured (the defaults then), as `rounds` below
    prompt_len: int = 64
    output_len: int = 32
    seq_len: int = 128
    warmup: int = DEFAULTS.measurement.warmup
    repeats: int = DEFAULTS.measurement.repeats
    max_cv: float = DEFAULTS.measurement.max_cv
    max_remeasure: int = 2
    # Not the spec's default: profiles written before rounds existed lack this key, and they
    # measured every point in one pass.
    rounds: int = 1
    seed: int = DEFAULTS.seed

    @classmethod
    def from_spec(cls, spec: BenchSpec, dtype: str, device: str) -> "SweepSettings":
        m = spec.measurement
        return cls(dtype=dtype, device=device, gen_backend=spec.generation.backend if spec.run_gen else None,
                   train_backend=spec.training.backend if spec.run_train else None,
                   prompt_len=spec.generation.prompt_len, output_len=spec.generation.output_len,
                   seq_len=spec.training.seq_len, warmup=m.warmup, repeats=m.repeats, max_cv=m.max_cv,
                   max_remeasure=m.max_remeasure, rounds=m.rounds, seed=spec.seed)


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
    from throughputlab.models import check_local_model

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
    from throughputlab.files import read_settings

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
