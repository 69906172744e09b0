"""What every importer shares: the model and GPU the numbers are for, reading source files and
their fields with one-line errors that name the file and the field, and the Profile that
imported points go into.

An imported profile has no probe, no micro-benchmarks and no environment of its own: the
hardware is the datasheet row of ``--gpu``, the environment says where the numbers came from.
Its ``kind`` is "imported"; ``notes`` name the source
files and what the source did not measure.
"""

from __future__ import annotations

import json
import logging
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from throughputlab.errors import UserError
from throughputlab.models.spec import ModelSpec, dtype_bytes
from throughputlab.records.machine import DatasheetPeak, Environment, Hardware
from throughputlab.records.profile import EngineInfo, GenPoint, Profile
from throughputlab.records.settings import SweepSettings

log = logging.getLogger(__name__)

# Said in every imported profile: the fit reads these points as static batches of c requests.
POINT_MODEL_NOTE = ("each point is read as c requests of the mean prompt and output length, its tokens/s over the "
                    "source run's whole duration (prefill included); there are no decode-step, prefill or "
                    "overhead-probe timings, so `throughputlab fit` fits end-to-end tokens/s")


@dataclass(frozen=True)
class Target:
    """The model and device the imported numbers were measured on (the source files rarely say)."""

    spec: ModelSpec
    datasheet: DatasheetPeak
    dtype: str = "bfloat16"
    tp: int = 1  # devices of one engine (tensor parallel); the fit treats the engine as one device times tp


def resolve_gpu(gpu: str) -> DatasheetPeak:
    """``--gpu``: a device with a datasheet row; an unknown name is an error, never a guessed peak."""
    from throughputlab.records.peaks import device_names, lookup

    ds = lookup(gpu or "")
    if ds is None:
        raise UserError(f"--gpu {gpu}: no datasheet row for it; known devices are {', '.join(device_names())}")
    return ds


def resolve_target(model: str, gpu: str, dtype: str = "bfloat16", tp: int = 1) -> Target:
    """``--model`` (preset, config folder or hub id; weights are never loaded) and ``--gpu``."""
    from throughputlab.models import resolve_model

    dtype_bytes(dtype)  # an unknown dtype is a one-line error here, not in the fit
    if tp < 1:
        raise UserError(f"--tp must be a positive integer, got {tp}")
    from throughputlab.predict_engine import MAX_GPUS_PER_NODE, SXM_GPUS_PER_NODE, check_parts

    spec = resolve_model(model, random_weights=True).spec
    ds = resolve_gpu(gpu)
    if ds is not None:  # a TP size the heads allow (an engine may span nodes)
        check_parts(spec, ds, tp, -(-tp // MAX_GPUS_PER_NODE.get(ds.device, SXM_GPUS_PER_NODE)), tp)
    return Target(spec=spec, datasheet=ds, dtype=dtype, tp=tp)


# ---------------------------------------------------------------- reading


def read_text(path: Path, expected: str) -> str:
    """A source file's text; a missing, unreadable, binary or empty file is a one-line error."""
    from throughputlab import files

    return files.read_text(path, expected)


def read_json(path: Path, expected: str) -> Any:
    """One JSON document, or JSON lines (one document per line) returned as a list."""
    text = read_text(path, expected)
    try:
        return json.loads(text)
    except ValueError as first:
        docs = []
        for line in text.splitlines():
            if not line.strip():
                continue
            try:
                docs.append(json.loads(line))
            except ValueError:
                raise UserError(f"{path}: not JSON ({first.msg} at line {first.lineno}), expected {expected}") from None
        return docs


def number(record: dict, key: str, where: str, *, required: bool = True) -> Optional[float]:
    """A numeric field: missing or null gives None (an error when required); a bool, a non-numeric
    string, NaN or infinity is always an error naming the field."""
    value = record.get(key)
    if value is None or value == "":
        if required:
            raise UserError(f"{where}: field {key} is missing")
        return None
    if isinstance(value, str):  # summary.csv and other text sources
        try:
            value = float(value)
        except ValueError:
            raise UserError(f"{where}: field {key} is not a number (got {value!r})") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{where}: field {key} is not a finite number (got {value!r})")
    return float(value)


def count(record: dict, key: str, where: str, *, required: bool = True) -> Optional[int]:
    """A non-negative whole-number field (token and request counts)."""
    x = number(record, key, where, required=required)
    if x is None:
        return None
    if x < 0 or x != int(x):
        raise UserError(f"{where}: field {key} must be a non-negative whole number, got {x:g}")
    return int(x)


def model_mismatch(target: Target, named: Optional[str]) -> Optional[str]:
    """A note where the files' model (``org/Name-Instruct``) is not ``--model``'s (lower case,
    letters and digits compared, the organisation and any suffix allowed): the fit would charge
    the wrong bytes and FLOPs."""
    if not named:
        return None
    key = lambda x: re.sub(r"[^a-z0-9]", "", x.lower())  # noqa: E731
    ours, theirs = key(target.spec.name.split("/")[-1]), key(named.split("/")[-1])
    if ours and (ours in theirs or theirs in ours):
        return None
    note = (f"the files name the model {named}, and --model is {target.spec.name}: the fit charges "
            f"{target.spec.name}'s bytes and FLOPs, so check --model")
    log.warning(note)
    return note


def one_model(models: dict[str, list[str]], field: str) -> Optional[str]:
    """The one model the sources name ({model: [sources]}); several are an error naming them."""
    named = {m: s for m, s in models.items() if m}
    if len(named) > 1:
        parts = "; ".join(f"{m} in {', '.join(s[:2])}{' ...' if len(s) > 2 else ''}" for m, s in sorted(named.items()))
        raise UserError(f"the files name several models (field {field}): {parts}; import one model at a time")
    return next(iter(named), None)


# ---------------------------------------------------------------- the profile


def by_concurrency(notes: list[str]) -> list[str]:
    """Per-point notes ("c=N (...): ...") in order of concurrency, source order within one."""
    def key(note: str) -> int:
        m = re.match(r"c=(\d+)", note)
        return int(m.group(1)) if m else -1

    return sorted(notes, key=key)


def merge_points(points: Iterable[GenPoint]) -> list[GenPoint]:
    """Points with the same key (backend, concurrency, lengths) become one point holding every
    run's sample, in source order; the result is sorted by concurrency."""
    merged: dict[tuple, GenPoint] = {}
    for p in points:
        have = merged.get(p.key)
        if have is None:
            merged[p.key] = p.model_copy(deep=True)
            continue
        have.samples.extend(p.samples)
        if have.status != "ok" and p.status == "ok":
            have.status, have.error = "ok", None
    return sorted(merged.values(), key=lambda p: (p.concurrency, p.prompt_len, p.output_len))


def imported_profile(target: Target, points: list[GenPoint], *, backend: str, source: str, notes: list[str],
                     engine: Optional[EngineInfo] = None, command_line: Optional[list[str]] = None) -> Profile:
    """A Profile of imported generation points. ``backend`` names the source tool in the settings,
    ``source`` says where the numbers came from (the environment's host field)."""
    ok = [p for p in points if p.status == "ok"]
    if not ok:
        raise UserError(f"{source}: no run has successful requests: nothing to import")
    ds = target.datasheet
    if engine is None and target.tp > 1:
        engine = EngineInfo(name="unknown (imported)", engine_args={"tensor_parallel_size": target.tp})
    settings = SweepSettings(
        dtype=target.dtype, device="cuda", gen_backend=backend,
        prompt_len=round(statistics.median(p.prompt_len for p in ok)),
        output_len=round(statistics.median(p.output_len for p in ok)),
        warmup=0, repeats=max(len(p.samples) for p in ok), rounds=1,
    )
    return Profile(
        kind="imported",
        model=target.spec,
        hardware=Hardware(device_type="cuda", device_name=ds.device, datasheet=ds, memory_total_bytes=ds.memory_bytes),
        environment=Environment(python="", platform="", hostname=source, command_line=command_line or []),
        settings=settings, engine=engine, generation=points, notes=[*notes, POINT_MODEL_NOTE],
    )
