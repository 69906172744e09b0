"""One bench run's settings, a validated tree with one set of defaults
(:class:`~throughputlab.records.settings.BenchSpec`, in the records a profile stores), built
from its layers by the resolver every command shares (throughputlab.settings).

The tree is built in layers, later ones winning: the defaults < a spec file
(``--spec FILE``, YAML or JSON) < command-line flags < ``--set KEY=VALUE`` (dotted keys). With
``--resume`` the stored profile's spec takes the place of the defaults, so a bare
``bench --resume -o FILE`` continues exactly, on the ranks it ran on. Each layer is validated on
its own before it is merged, so an error names the file, the flag or the ``--set`` item it came
from, and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from throughputlab.models import check_local_model
from throughputlab.records.settings import INSTRUMENTS, BenchSpec
from throughputlab.settings.layers import Layer, Settings, as_layer, flatten, parse_set
from throughputlab.settings.layers import read_spec_file as _read

__all__ = ["Layer", "as_layer", "flatten", "parse_set", "read_spec_file", "resolve", "validate", "keys",
           "differences", "resume_differences", "BENCH"]

BENCH = Settings(BenchSpec, "bench")
# Where the ranks ran is checked by the launcher against the ranks' side file, not here: a resumed run
# of an older profile (no such section) takes its ranks from the points.
LAYOUT = ("distributed",)


def resolve(layers: list[Layer], base: Optional[dict[str, Any]] = None) -> BenchSpec:
    """The spec from ``base`` (default: the defaults) and ``layers``, later layers winning."""
    spec = BENCH.resolve(layers, base)
    # a model folder's config.json or a preset's name: checked now, before the run prints anything
    check_local_model(spec.model, random_weights=spec.random_weights, trust_remote_code=spec.trust_remote_code)
    return spec


def validate(layer: Layer) -> BenchSpec:
    return BENCH.validate(layer)


def read_spec_file(path: Path) -> Layer:
    """A YAML or JSON spec file (JSON by a .json suffix, else YAML), as a layer."""
    return _read(path, "bench")


def keys() -> list[str]:
    """Every dotted key of the tree (engine_args as one key: it takes any names)."""
    return BENCH.keys()


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
    diffs = differences(old, new, ignore=INSTRUMENTS + LAYOUT)
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
