"""Published throughput measurements against `throughputlab predict`'s analytic model.

Reads every ``benchmarks/data/published/*.yaml`` (format: that folder's README.md) and predicts
each case as a new user would: ``throughputlab predict -m MODEL --gpu GPU`` with predict's
defaults (stated efficiencies, no calibration) plus the case's own settings: device, dtype, TP,
GPUs, nodes, engine settings, prompt and output lengths, concurrency, training sequence length,
micro-batch and activation checkpointing. Prints predicted/published per case, summaries by
check kind (1-6), device family, engine and TP (ambiguous cases included and excluded), and the
six targets of the check as met / not met with their figures.

    python3 benchmarks/published.py [--kind N] [--file GLOB] [--case SUBSTR] [-v] [--json FILE]

One function, ``predict_case``, turns a case into predict's inputs; every figure comes from the
library's public functions (``predict_analytic``, the ThroughputModel's methods), never from a
cost formula written here. Engine settings predict does not take yet are passed once its
signature names them (``_library_inputs``, the one place to simplify later) and are otherwise
listed per case as not used. A case that cannot be predicted is listed with its reason.
Exit 0; exit 2 with one line naming the file and the key on a malformed data file.
"""

from __future__ import annotations

import argparse
import fnmatch
import inspect
import json
import math
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import yaml
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(ROOT))  # the working tree's library, not another installed copy

import throughputlab  # noqa: E402
from throughputlab import __version__  # noqa: E402
from throughputlab.errors import UserError  # noqa: E402
from throughputlab.fit.schema import load_fit  # noqa: E402
from throughputlab.models import preset_names, resolve_model  # noqa: E402
from throughputlab.models.spec import ModelSpec, spec_from_config  # noqa: E402
from throughputlab.predict import Layout, predict_analytic  # noqa: E402
from throughputlab.records.peaks import lookup  # noqa: E402
from throughputlab.spread import device_family, kind_keys, published_spread  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = ROOT / "benchmarks" / "data" / "published"

KINDS = {
    1: "one dense model on one GPU, decode-heavy",
    2: "tensor parallel (TP 2-8)",
    3: "KV-bound (sweeps and offline runs)",
    4: "large models whose weights nearly fill memory",
    5: "training, FSDP",
    6: "80% intervals",
}
REQUIRED_KEYS = ("id", "kind", "model", "device", "metric", "published", "where")
GENERATION_METRICS = {"output_tokens_per_s": "out tok/s", "total_tokens_per_s": "all tok/s",
                      "output_tokens_per_s_per_gpu": "out/GPU", "tpot_ms": "TPOT ms"}
TRAINING_METRICS = {"tokens_per_s_per_gpu": "tok/s/GPU", "mfu": "MFU"}
CHECKPOINTING = ("none", "selective", "full")
# datasheet row (throughputlab.records.peaks) -> family, for the summaries; first matching prefix


# ---------------------------------------------------------------- data files


class DataError(Exception):
    """A malformed data file: the file, the key and what is wrong, as one line."""

    def __init__(self, path: Path, key: str, problem: str):
        super().__init__(f"{_rel(path)}: {key}: {problem}")


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_file(path: Path) -> list[dict]:
    """The cases of one data file, each with its file's defaults merged in (a case's own keys win;
    ``settings`` merge key by key), its file name under ``_file`` and its source under ``_source``."""
    path = Path(path)
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_LOADER)
    except OSError as e:
        raise DataError(path, "file", f"cannot be read ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise DataError(path, "YAML" + (f" line {mark.line + 1}" if mark else ""), f"not valid YAML ({what})") from None
    if not isinstance(doc, dict):
        raise DataError(path, "top level", "must be a mapping with source, defaults and cases")
    src = doc.get("source")
    if not isinstance(src, dict):
        raise DataError(path, "source", "missing or not a mapping")
    if not (isinstance(src.get("url"), str) and src["url"].strip()) and not (src.get("repo") and src.get("path")):
        raise DataError(path, "source.url", "missing: give the page's url (or repo and path)")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise DataError(path, "defaults", "must be a mapping")
    if defaults.get("settings") is not None and not isinstance(defaults["settings"], dict):
        raise DataError(path, "defaults.settings", "must be a mapping")
    raw_cases = doc.get("cases")
    if not isinstance(raw_cases, list) or not raw_cases:
        raise DataError(path, "cases", "missing or not a non-empty list")
    out, seen = [], set()
    for i, raw in enumerate(raw_cases):
        if not isinstance(raw, dict):
            raise DataError(path, f"cases[{i}]", "not a mapping")
        case = {**defaults, **raw}
        if raw.get("settings") is not None and not isinstance(raw["settings"], dict):
            raise DataError(path, f"case {raw.get('id', i)!r} key 'settings'", "must be a mapping")
        if defaults.get("settings") or raw.get("settings"):
            case["settings"] = {**(defaults.get("settings") or {}), **(raw.get("settings") or {})}
        _check_case(path, i, case, seen)
        seen.add(case["id"])
        case["_file"] = path.name
        case["_source"] = src
        out.append(case)
    return out


def _check_case(path: Path, i: int, c: dict, seen: set) -> None:
    label = f"case {c['id']!r}" if isinstance(c.get("id"), str) else f"cases[{i}]"

    def bad(key: str, problem: str):
        raise DataError(path, f"{label} key '{key}'", problem)

    for k in REQUIRED_KEYS:
        if c.get(k) is None or c.get(k) == "":
            bad(k, "missing")
    for k in ("id", "model", "device", "metric", "where"):
        if not isinstance(c[k], str):
            bad(k, f"must be a string, got {c[k]!r}")
    if c["id"] in seen:
        bad("id", "the same id twice in this file")
    if c["kind"] not in ("generation", "training"):
        bad("kind", f"must be generation or training, got {c['kind']!r}")
    if not _is_num(c["published"]) or c["published"] <= 0:
        bad("published", f"must be a positive number, got {c['published']!r}")
    checks = c.get("checks", [])
    if not isinstance(checks, list) or any(not _is_int(x) or not 1 <= x <= 6 for x in checks):
        bad("checks", f"must be a list of check kinds 1-6, got {checks!r}")
    for k in ("gpus", "tp", "nodes", "pp", "num_prompts", "micro_batch", "seq_len", "global_batch"):
        if c.get(k) is not None and (not _is_int(c[k]) or c[k] < 1):
            bad(k, f"must be a positive integer, got {c[k]!r}")
    for k in ("dtype", "kv_dtype", "engine", "sweep", "note", "parallel", "framework"):
        if c.get(k) is not None and not isinstance(c[k], str):
            bad(k, f"must be a string, got {c[k]!r}")
    if "ambiguous" in c and not isinstance(c["ambiguous"], bool):
        bad("ambiguous", f"must be true or false, got {c['ambiguous']!r}")
    obs = c.get("observed_avg_batch")
    if obs is not None and (not _is_num(obs) or obs <= 0):
        bad("observed_avg_batch", f"must be a positive number, got {c['observed_avg_batch']!r}")
    if c["kind"] == "generation":
        conc = c.get("concurrency")
        if conc != "max" and (not _is_int(conc) or conc < 1):
            bad("concurrency", f"must be a positive integer or \"max\", got {conc!r}")
        if "prompt_len" not in c:
            bad("prompt_len", "missing (write prompt_len: null where the source does not publish it)")
        if c["prompt_len"] is not None and (not _is_int(c["prompt_len"]) or c["prompt_len"] < 1):
            bad("prompt_len", f"must be a positive integer or null, got {c['prompt_len']!r}")
        if not _is_num(c.get("output_len")) or c["output_len"] < 1:
            bad("output_len", f"must be a positive number, got {c.get('output_len')!r}")
    else:
        for k in ("seq_len", "micro_batch"):
            if c.get(k) is None:
                bad(k, "missing (training cases need seq_len and micro_batch)")
        if c.get("activation_checkpointing") is not None and c["activation_checkpointing"] not in CHECKPOINTING:
            bad("activation_checkpointing", f"must be one of {', '.join(CHECKPOINTING)}, got "
                                            f"{c['activation_checkpointing']!r}")


def load_cases(data_dir: Path = DATA_DIR, file_glob: Optional[str] = None) -> list[dict]:
    files = sorted(Path(data_dir).glob("*.yaml"))
    if file_glob:
        files = [f for f in files if fnmatch.fnmatch(f.name, file_glob) or fnmatch.fnmatch(str(f), file_glob)]
    return [c for f in files for c in load_file(f)]


@cache
def resolve_spec(name: str, models_dir: Path = DATA_DIR / "models") -> ModelSpec:
    """A preset, as `predict -m NAME` resolves it, else the config.json copy under models/NAME.json
    read by the library's own config parser."""
    if name.lower() in preset_names():
        return resolve_model(name).spec
    path = Path(models_dir) / f"{name}.json"
    if not path.is_file():
        raise UserError(f"unknown model {name!r}: not a preset and no {_rel(path)}")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"model {name!r}: {_rel(path)} is not readable JSON ({e})") from None
    return spec_from_config(cfg, name, "folder")


# ---------------------------------------------------------------- case -> predict's inputs


@dataclass
class Prediction:
    value: float
    inputs: dict  # what predict was given, and its command line
    not_used: list[str] = field(default_factory=list)  # the case's settings the library did not take
    notes: list[str] = field(default_factory=list)
    interval: Optional[tuple[float, float]] = None  # the library's 80% interval, where it gives one
    admits: Optional[int] = None  # generation: the most requests predict's engine runs at once, if it says


@dataclass
class Skip:
    reason: str
    inputs: dict = field(default_factory=dict)


# --- what the library takes: the one place that adapts to predict.py. A setting goes to
# predict_analytic as its own keyword, as a field of an options object one of its keywords takes
# (a pydantic model as the default, e.g. ``engine: EngineOptions``), or as a Layout field, when
# the signature names it; otherwise it is listed as not used. The figure is the engine's served
# tokens/s where the model has admission (``served_tokens_per_s``, ``admitted``), else the static
# batch of generation_tokens_per_s. Once predict takes every setting, this shrinks to a pass-through.
_CALL_INPUTS = {"spec", "gpu", "dtype", "calibrate", "concurrency", "prompt_len", "output_len", "micro_batches",
                "seq_len", "layout"}  # filled from a case's own keys
_LAYOUT_INPUTS = {"gpus", "tp", "nodes", "activation_checkpointing", "train_tp"}
_SETTING_NAMES = {"mem_fraction_static": "gpu_memory_utilization", "context_length": "max_model_len"}  # SGLang's


def _accepted() -> dict[str, tuple[str, Optional[type]]]:
    """Setting name -> (predict_analytic keyword, or "layout"; the options class when it is a field of one)."""
    out: dict[str, tuple[str, Optional[type]]] = {}
    params = inspect.signature(predict_analytic).parameters
    for name, p in params.items():
        if name in _CALL_INPUTS:
            continue
        if isinstance(p.default, BaseModel):
            for f in type(p.default).model_fields:
                out.setdefault(f, (name, type(p.default)))
        else:
            out.setdefault(name, (name, None))
    for f in set(Layout.model_fields) - _LAYOUT_INPUTS:
        out.setdefault(f, ("layout", None))
    return out


def _library_inputs(case: dict) -> tuple[dict, dict, list[str], list[str]]:
    """The case's engine settings (engine, kv_dtype as kv_cache_dtype, ``settings``) as keywords of
    predict_analytic and fields of Layout, and the rest, listed as not used."""
    accepted = _accepted()
    wanted = []
    if case.get("engine"):
        wanted.append(("engine", "engine", case["engine"]))
    if case.get("kv_dtype"):
        wanted.append(("kv_dtype", "kv_cache_dtype", case["kv_dtype"]))
    if case.get("engine_version"):
        wanted.append(("engine_version", "engine_version", str(case["engine_version"])))
    wanted += [(k, _SETTING_NAMES.get(k, k), v) for k, v in (case.get("settings") or {}).items()]
    kwargs, fields, not_used, notes = {}, {}, [], []
    grouped: dict[str, tuple[type, dict]] = {}
    for key, name, value in wanted:
        if value is None:
            continue
        if name not in accepted:
            not_used.append(f"{key}={value}")
            continue
        target, cls = accepted[name]
        if target == "layout":
            fields[name] = value
        elif cls is not None:
            grouped.setdefault(target, (cls, {}))[1][name] = value
        else:
            kwargs[name] = value
        if name != key:
            notes.append(f"{key} passed as {name}")
    for target, (cls, values) in grouped.items():
        kwargs[target] = cls(**values)  # a value the options reject raises ValueError: the case is not predicted
    return kwargs, fields, not_used, notes


def _checkpointing(mode: str) -> tuple[Any, Optional[str]]:
    """Layout's activation_checkpointing for none|selective|full: the mode where the library takes
    it, else on/off (selective, which recomputes no matmul, as off)."""
    try:
        Layout(activation_checkpointing=mode)
        return mode, None
    except (ValueError, TypeError):  # pydantic's ValidationError is a ValueError
        if mode == "selective":
            return False, "activation_checkpointing=selective (the library takes on/off only: predicted as none)"
        return mode == "full", None


def _running(model, c: int, prompt_len: int, output_len: int) -> int:
    """The sequences predict's engine runs at once for c requests (all c without admission)."""
    return int(model.admitted(c, prompt_len, output_len)) if hasattr(model, "admitted") else c


def _admits(model, prompt_len: int, output_len: int) -> Optional[int]:
    """The most requests predict's engine runs at once (KV cache, max_num_seqs); None without admission."""
    return int(model.admitted(10**9, prompt_len, output_len)) if hasattr(model, "admitted") else None


def _served_tokens_per_s(model, c: int, prompt_len: int, output_len: int) -> tuple[float, str]:
    """One engine's output tokens/s for c requests, and the model's method that gave it."""
    method = "served_tokens_per_s" if hasattr(model, "served_tokens_per_s") else "generation_tokens_per_s"
    return float(getattr(model, method)(c, prompt_len, output_len)), method


def _interval(model, method: str, args: tuple, factor: float) -> Optional[tuple[float, float]]:
    """The library's 80% interval of the figure, where the ThroughputModel has one
    (``<method>_interval(*args, level=0.8)``); None until it does."""
    fn = getattr(model, f"{method}_interval", None)
    band = fn(*args, level=0.8) if fn is not None else None
    if band is None:
        return None
    lo, hi = band
    return float(lo) * factor, float(hi) * factor


def _predict_default(name: str) -> Any:
    return inspect.signature(predict_analytic).parameters[name].default


def _command_line(case: dict, dtype: str, layout: Layout, call: dict, kwargs: dict) -> str:
    parts = ["throughputlab predict", f"-m {case['model']}", f"--gpu '{case['device']}'", f"--dtype {dtype}"]
    if layout.gpus != layout.tp * layout.nodes:
        parts.append(f"--gpus {layout.gpus}")
    if layout.tp != 1:
        parts.append(f"--tp {layout.tp}")
    if layout.nodes != 1:
        parts.append(f"--nodes {layout.nodes}")
    if layout.train_tp != 1:
        parts.append(f"--train-tp {layout.train_tp}")
    if case["kind"] == "generation":
        parts += [f"-c {call['concurrency'][0]}", f"--prompt-len {call['prompt_len']}",
                  f"--output-len {call['output_len']}"]
    else:
        parts += [f"-b {call['micro_batches'][0]}", f"--seq-len {call['seq_len']}"]
        if layout.activation_checkpointing:
            parts.append("--activation-checkpointing" + ("" if layout.activation_checkpointing is True
                                                          else f" {layout.activation_checkpointing}"))
    flags = {**{k: getattr(layout, k) for k in layout.model_fields_set - _LAYOUT_INPUTS}, **_plain(kwargs)}
    parts += [f"--{k.replace('_', '-')}" + ("" if v is True else f" {v}") for k, v in flags.items() if v is not False]
    return " ".join(parts)


def _plain(kwargs: dict) -> dict:
    """predict_analytic's keywords with options objects spread into the fields the case set."""
    out = {}
    for k, v in kwargs.items():
        out.update(v.model_dump(exclude_unset=True) if isinstance(v, BaseModel) else {k: v})
    return out


def predict_case(case: dict) -> Union[Prediction, Skip]:
    """predict's figure for one case's metric, from the case's own settings and predict's defaults."""
    kind, metric = case["kind"], case["metric"]
    supported = GENERATION_METRICS if kind == "generation" else TRAINING_METRICS
    if metric not in supported:
        return Skip(f"metric {metric!r} is not supported for {kind} cases (supported: {', '.join(supported)})")
    try:
        spec = resolve_spec(case["model"])
    except UserError as e:
        return Skip(str(e))
    try:
        kwargs, fields, not_used, notes = _library_inputs(case)
    except (ValueError, TypeError) as e:  # an engine setting the library's options reject
        return Skip(f"predict rejected the settings: {type(e).__name__}: {str(e).splitlines()[0]}")
    tp, nodes = case.get("tp") or 1, case.get("nodes") or 1
    gpus = case.get("gpus") or tp * nodes  # predict: --gpus defaults to tp x nodes
    dtype = case.get("dtype") or _predict_default("dtype")
    if kind == "training":
        if (case.get("parallel") or "fsdp") != "fsdp":
            return Skip(f"parallel {case['parallel']!r}: predict models FSDP training only")
        if (case.get("pp") or 1) > 1:
            return Skip(f"pipeline parallelism (pp {case['pp']}) is not modelled by predict")
        ac, note = _checkpointing(case.get("activation_checkpointing") or "none")
        if note:
            not_used.append(note)
        fields["activation_checkpointing"] = ac
        if tp > 1:  # predict's --tp sizes the generation engines; training's is --train-tp (FSDP x TP)
            fields["train_tp"] = tp
            tp = 1
        b, seq_len = case["micro_batch"], case["seq_len"]
        call = dict(concurrency=[1], micro_batches=[b], seq_len=seq_len)
        engines = 1
    else:
        c, n = case["concurrency"], case.get("num_prompts")
        if c == "max" and n:
            c = n
            notes.append(f"concurrency 'max': all {n} requests at once")
        elif c == "max":
            c = None  # what the engine admits, from the model below
        elif n and n < c:
            notes.append(f"concurrency {c} with {n} requests in the run: at most {n} in flight")
            c = n
        engines = max(gpus // tp, 1)
        c_engine = max(math.ceil(c / engines), 1) if c else 1
        if engines > 1 and c:
            notes.append(f"{engines} engines of TP {tp}: {c_engine} requests each")
        prompt_len = case["prompt_len"]
        if prompt_len is None:
            prompt_len = _predict_default("prompt_len")
            notes.append(f"prompt_len not published: predict's default {prompt_len}")
        output_len = int(round(case["output_len"]))
        if output_len != case["output_len"]:
            notes.append(f"output_len {case['output_len']} (a mean) rounded to {output_len}")
        call = dict(concurrency=[c_engine], prompt_len=prompt_len, output_len=output_len)
    try:
        layout = Layout(gpus=gpus, tp=tp, nodes=nodes, **fields)
        inputs = {"command": _command_line(case, dtype, layout, call, kwargs), "gpu": case["device"], "dtype": dtype,
                  "layout": layout.model_dump(mode="json"), **call, **_plain(kwargs)}
        pred = predict_analytic(spec, case["device"], dtype=dtype, layout=layout, **call, **kwargs)
        model = load_fit(pred).model
    except UserError as e:
        return Skip(str(e), locals().get("inputs", {}))
    except (ValueError, TypeError) as e:  # a setting the library rejects
        return Skip(f"predict rejected the inputs: {type(e).__name__}: {str(e).splitlines()[0]}",
                    locals().get("inputs", {}))

    interval, admits = None, None
    if kind == "training":
        point = pred.training[0]
        if metric == "tokens_per_s_per_gpu":
            value = float(model.train_tokens_per_s(b, seq_len))
            interval = _interval(model, "train_tokens_per_s", (b, seq_len), 1.0)
        else:  # mfu: the predicted point's utilisation over the datasheet peak
            u = [x for x in load_fit(pred).utilisation if x.phase == "train" and x.x == b]
            if not u or u[0].mfu_datasheet is None:
                return Skip("the library gave no MFU for this point", inputs)
            value = float(u[0].mfu_datasheet)
    else:
        point, admits = pred.generation[0], _admits(model, prompt_len, output_len)
        if c is None:  # "max" without num_prompts: every request the engine admits
            if admits is None:
                return Skip("concurrency 'max' without num_prompts: what the engine admits needs an admission "
                            "limit (max_num_seqs, KV cache) from the library, which predict does not give", inputs)
            c_engine = admits
            if c_engine < 1:
                return Skip("concurrency 'max' without num_prompts: predict's engine admits no request", inputs)
            notes.append(f"concurrency 'max' without num_prompts: the {c_engine} requests predict's engine admits")
            call["concurrency"], point = [c_engine], None
            inputs.update(concurrency=[c_engine], command=_command_line(case, dtype, layout, call, kwargs))
        running = _running(model, c_engine, prompt_len, output_len)
        if running < c_engine:
            notes.append(f"predict's engine runs {running} of the {c_engine} requests at once")
        if metric == "tpot_ms":  # a served run's: the other requests' prefills included (rf.served_tpot_s)
            args = (c_engine, prompt_len, output_len)
            value = float(model.served_tpot_s(*args)) * 1e3
            interval = _interval(model, "served_tpot_s", args, 1e3)
        else:
            factor = engines  # tokens/s of the whole run: every engine
            if metric == "total_tokens_per_s":
                factor *= (prompt_len + output_len) / output_len  # prompt tokens counted too
            if metric == "output_tokens_per_s_per_gpu":
                factor /= gpus
            args = (c_engine, prompt_len, output_len)
            value, method = _served_tokens_per_s(model, *args)
            value *= factor
            interval = _interval(model, method, args, factor)
    if point is not None and point.status != "ok":
        notes.append(f"predict marks the point {point.status}: {point.error}")
    return Prediction(value=value, inputs=inputs, not_used=not_used, notes=notes, interval=interval,
                      admits=admits if kind == "generation" else None)


# ---------------------------------------------------------------- rows and statistics


def family(device: str) -> str:
    row = lookup(device)
    if row is None:
        return "unknown device"
    return device_family(row.device) or row.device


TIME_METRICS = ("tpot_ms",)


def rate_ratio(row: dict) -> Optional[float]:
    """predicted/published as a rate (a time metric's ratio inverted): above 1 is optimistic."""
    r = row["ratio"]
    if r is None or r <= 0:
        return None
    return 1.0 / r if row["metric"] in TIME_METRICS else r


def _kind_args(row: dict) -> tuple[str, Optional[str], int]:
    return row["kind"], device_family(row["datasheet_row"]), row["tp"] if row["kind"] == "generation" else 1


def spread_key(row: dict) -> tuple:
    return kind_keys(*_kind_args(row))[0]


def loo_interval(row: dict) -> Optional[list[float]]:
    """The 80% interval predict would print had this case not been among the published points: the band of
    its kind without its own ratio (a leave-one-out check of the intervals)."""
    rr = rate_ratio(row)
    if rr is None:
        return None
    sp = published_spread(*_kind_args(row), leave_out=rr)
    if sp is None:
        return None
    lo, hi = (sp.time if row["metric"] in TIME_METRICS else sp.rate)(row["predicted"])
    return [lo, hi]


def source_out_intervals(rows: list[dict]) -> list[tuple[dict, tuple[float, float]]]:
    """Each case's 80% interval from the bands of its kind built without any case of its own source file:
    how the intervals hold on a source the table has not seen (the library's band logic, other data)."""
    out = []
    for r in rows:
        rr = rate_ratio(r)
        if rr is None:
            continue
        others: dict[tuple, list[float]] = {}
        for o in rows:
            if o["file"] != r["file"] and rate_ratio(o):
                others.setdefault(spread_key(o), []).append(rate_ratio(o))
        sp = published_spread(*_kind_args(r), table=others)
        if sp is not None:
            out.append((r, (sp.time if r["metric"] in TIME_METRICS else sp.rate)(r["predicted"])))
    return out


def write_table(path: Path, doc: str, source: str, name: str, key_type: str,
                groups: dict[tuple, list[float]]) -> int:
    """Write a generated module of the library: its docstring, ``SOURCE`` (``{n}`` becomes the ratio count) and
    ``name``, a dict of sorted ratio lists by kind; the number of ratios."""
    n = sum(len(v) for v in groups.values())
    body = "\n".join(f"    {k!r}: {sorted(v)!r}," for k, v in sorted(groups.items()))
    path.write_text(f'"""{doc}"""\n\nSOURCE = "{source.format(n=n)}"\n\n'
                    f"{name}: dict[{key_type}, list[float]] = {{\n{body}\n}}\n", encoding="utf-8")
    return n


def write_spread(rows: list[dict], path: Path) -> int:
    """Write the library's table of published predicted/published ratios (rates) by kind."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        rr = rate_ratio(r)
        if rr is not None:
            groups.setdefault(spread_key(r), []).append(round(rr, 4))
    return write_table(path, "predict's analytic model against published measurements: predicted/published (as rates: "
                       "above 1 is\noptimistic) by kind (phase, device family, TP size), read by throughputlab.spread. "
                       "Written by\n`python benchmarks/published.py --write-spread throughputlab/spread_data.py`; the "
                       "cases and their sources\nare in benchmarks/data/published/.",
                       f"benchmarks/data/published, {{n}} cases, throughputlab {__version__}", "PUBLISHED",
                       "tuple[str, str, str]", groups)


def make_row(case: dict, result: Union[Prediction, Skip]) -> dict:
    row = lookup(case["device"])
    try:
        moe = resolve_spec(case["model"]).moe is not None
    except UserError:
        moe = None
    out = {
        "file": case["_file"], "id": case["id"], "kinds": list(case.get("checks") or []), "kind": case["kind"],
        "model": case["model"], "moe": moe, "device": case["device"], "datasheet_row": row.device if row else None,
        "family": family(case["device"]), "engine": case.get("engine") or case.get("framework") or "-",
        "tp": case.get("tp") or 1, "gpus": case.get("gpus") or (case.get("tp") or 1) * (case.get("nodes") or 1),
        "metric": case["metric"], "published": float(case["published"]), "ambiguous": bool(case.get("ambiguous")),
        "concurrency": case.get("concurrency"), "sweep": case.get("sweep"),
        "observed_avg_batch": case.get("observed_avg_batch"), "source_url": case["_source"].get("url"),
    }
    if isinstance(result, Prediction):
        out.update(status="predicted", predicted=result.value, ratio=result.value / out["published"],
                   interval=list(result.interval) if result.interval else None, admits=result.admits, reason=None)
        out.update(inputs=result.inputs, not_used=result.not_used, notes=result.notes)
    else:
        out.update(status="not predicted", predicted=None, ratio=None, interval=None, admits=None, reason=result.reason,
                   inputs=result.inputs, not_used=[], notes=[])
    out["loo_interval"] = loo_interval(out) if out["ratio"] is not None else None
    out["_case"] = case
    return out


def stats(rows: list[dict]) -> dict:
    r = np.array([rate_ratio(x) for x in rows if x["ratio"] is not None], dtype=float)
    if not len(r):
        return {"n": 0}
    err = np.abs(r - 1.0)
    return {"n": int(len(r)), "median": float(np.median(r)), "within_10": float(np.mean(err <= 0.10)),
            "within_25": float(np.mean(err <= 0.25)), "p10": float(np.percentile(r, 10)),
            "p90": float(np.percentile(r, 90))}


def _stats_text(s: dict) -> str:
    if not s["n"]:
        return f"{0:>4}  {'-':>6}  {'-':>5}  {'-':>5}  {'-':>13}"
    return (f"{s['n']:>4}  {s['median']:>6.2f}  {s['within_10']:>5.0%}  {s['within_25']:>5.0%}  "
            f"{s['p10']:>5.2f} - {s['p90']:<5.2f}")


def summaries(rows: list[dict]) -> dict[str, list[tuple[str, dict, dict]]]:
    done = [r for r in rows if r["ratio"] is not None]

    def grouped(key, labels) -> list[tuple[str, dict, dict]]:
        out = []
        for value, label in labels:
            g = [r for r in done if key(r) == value]
            out.append((label, stats(g), stats([r for r in g if not r["ambiguous"]])))
        return out

    by_kind = []
    for k, title in KINDS.items():
        g = [r for r in done if k in r["kinds"]]
        by_kind.append((f"{k} {title}", stats(g), stats([r for r in g if not r["ambiguous"]])))
    by_kind.append(("all cases", stats(done), stats([r for r in done if not r["ambiguous"]])))
    fams = sorted({r["family"] for r in done})
    engines = sorted({r["engine"] for r in done})
    tps = sorted({r["tp"] for r in done})
    return {"check kind": by_kind,
            "device family": grouped(lambda r: r["family"], [(f, f) for f in fams]),
            "engine": grouped(lambda r: r["engine"], [(e, e) for e in engines]),
            "TP": grouped(lambda r: r["tp"], [(t, f"TP {t}") for t in tps])}


# ---------------------------------------------------------------- the six targets


def _share(rows: list[dict], tol: float) -> tuple[int, int]:
    return sum(abs(rate_ratio(r) - 1) <= tol for r in rows), len(rows)


def _fig(rows: list[dict], tol: float) -> str:
    if not rows:
        return "no points"
    k, n = _share(rows, tol)
    return f"{k}/{n} within {tol:.0%} ({k / n:.0%}), median {np.median([r['ratio'] for r in rows]):.2f}"


def _plateau_start(points: list[tuple[float, float]], end_value: float) -> Optional[float]:
    """Where a published concurrency -> tokens/s curve reaches its plateau: the smallest concurrency
    within 5% of the value at the sweep's end; None while the curve still rises there (more than 5%
    over its value at 1/1.5 of the end's concurrency)."""
    points = sorted(points)
    c_end = points[-1][0]
    before = [v for c, v in points if c <= c_end / 1.5]
    if before and end_value > 1.05 * before[-1]:
        return None
    return next(c for c, v in points if v >= 0.95 * end_value)


def kv_groups(rows: list[dict]) -> list[dict]:
    """Target 3 per KV-bound sweep (cases sharing ``sweep``) or offline case: the plateau (the value
    at the sweep's largest concurrency) and where it starts: published, the average batch the engine
    held at the first point below its cap (``observed_avg_batch``; else where the published curve
    comes within 5% of its end); predicted, the most requests predict's engine admits for the
    sweep's requests (its KV cache and default caps, the swept max_num_seqs taken off). A sweep whose
    published curve still rises at its end has no start to compare: it is met where the predicted curve,
    by the same rule (:func:`_plateau_start`), still rises there too and the end values agree."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if 3 in r["kinds"]:
            groups.setdefault((r["file"], r["sweep"] or r["id"]), []).append(r)
    out = []
    for (file, name), rs in groups.items():
        rs = sorted(rs, key=lambda r: math.inf if r["concurrency"] == "max" else r["concurrency"])
        last = rs[-1]
        g = {"file": file, "group": name, "points": len(rs), "ambiguous": any(r["ambiguous"] for r in rs),
             "published_plateau": last["published"], "predicted_plateau": last["predicted"],
             "published_start": None, "predicted_start": None, "start_note": None}
        if last["predicted"] is None:
            g.update(met=False, start_note=f"not predicted: {last['reason']}")
            out.append(g)
            continue
        g["plateau_ratio"] = last["predicted"] / last["published"]
        if len(rs) == 1 or not _is_int(last["concurrency"]):
            g.update(start_note="one offline point: no published start")
            g["met"] = abs(g["plateau_ratio"] - 1) <= 0.25
            out.append(g)
            continue
        capped = [r for r in rs if r["observed_avg_batch"] and r["observed_avg_batch"] < 0.95 * r["concurrency"]]
        if capped:
            g["published_start"] = float(capped[0]["observed_avg_batch"])
        else:
            g["published_start"] = _plateau_start([(r["concurrency"], r["published"]) for r in rs], last["published"])
        case = last["_case"]
        settings = dict(case.get("settings") or {})
        if settings.get("max_num_seqs") == case["concurrency"]:  # the swept cap
            del settings["max_num_seqs"]
        p = predict_case({**case, "settings": settings})
        g["predicted_start"] = p.admits if isinstance(p, Prediction) else None
        if g["published_start"] is None:
            # No published plateau to place: the prediction agrees where its own curve, by the same rule, still
            # rises at the sweep's end too (its admission limit, if any, beyond the sweep).
            pred = [(r["concurrency"], r["predicted"]) for r in rs if r["predicted"] is not None]
            flat = _plateau_start(pred, last["predicted"]) if len(pred) > 1 else None
            g["start_note"] = "the published curve still rises at its end; " + (
                "so does the predicted one" if flat is None else f"the predicted one flattens from {flat:,.0f}")
            g["met"] = flat is None and abs(g["plateau_ratio"] - 1) <= 0.25
        elif g["predicted_start"] is None:
            g["start_note"] = "predict gives no admission limit (KV cache, max_num_seqs)"
            g["met"] = False
        else:
            g["start_ratio"] = g["predicted_start"] / g["published_start"]
            g["met"] = abs(g["plateau_ratio"] - 1) <= 0.25 and 1 / 1.5 <= g["start_ratio"] <= 1.5
        out.append(g)
    return out


def targets(rows: list[dict]) -> list[dict]:
    done = [r for r in rows if r["ratio"] is not None]
    tagged = lambda k: [r for r in done if k in r["kinds"]]  # noqa: E731
    unamb = lambda rs: [r for r in rs if not r["ambiguous"]]  # noqa: E731
    missed = lambda k: [r for r in rows if k in r["kinds"] and r["ratio"] is None]  # noqa: E731
    out = []

    def add(k, goal, met, figure, figure_unamb, extra=""):
        out.append({"kind": k, "goal": goal, "met": met, "figure": figure, "figure_unambiguous": figure_unamb,
                    "extra": extra, "not_predicted": len(missed(k))})

    t1 = [r for r in tagged(1) if r["gpus"] == 1 and r["moe"] is False]
    off = [r["id"] for r in tagged(1) if r not in t1]
    k1, n1 = _share(t1, 0.10)
    add(1, "one dense model on one GPU, decode-heavy: within 10% on >= 80% of the points",
        bool(n1) and k1 / n1 >= 0.80, _fig(t1, 0.10), _fig(unamb(t1), 0.10),
        f"left out: {len(off)} case(s) tagged 1 that are not a dense model on one GPU" if off else "")

    meds, parts = [], []
    for tp in (4, 8):
        g = [r for r in tagged(2) if r["tp"] == tp]
        if g:
            m = float(np.median([rate_ratio(r) for r in g]))
            mu = [rate_ratio(r) for r in unamb(g)]
            meds.append(m)
            parts.append(f"TP {tp}: median {m:.2f} over {len(g)}" +
                         (f" (unambiguous {np.median(mu):.2f} over {len(mu)})" if mu else " (no unambiguous point)"))
        else:
            parts.append(f"TP {tp}: no points")
    add(2, "TP 4 and TP 8: median predicted/published within 15% of 1 (each)",
        len(meds) == 2 and all(abs(m - 1) <= 0.15 for m in meds), "; ".join(parts), "")

    groups = kv_groups(rows)
    good = sum(g["met"] for g in groups)
    add(3, "KV-bound sweeps: plateau within 25% of the published one, starting within 1.5x of its concurrency",
        bool(groups) and good == len(groups), f"{good}/{len(groups)} sweeps or offline points met",
        (f"{sum(g['met'] for g in groups if not g['ambiguous'])}/{sum(not g['ambiguous'] for g in groups)} met"
         if any(not g["ambiguous"] for g in groups) else "none"))
    out[-1]["groups"] = groups

    t4 = tagged(4)
    add(4, "large models whose weights nearly fill memory: every point within 25%",
        bool(t4) and _share(t4, 0.25)[0] == len(t4), _fig(t4, 0.25), _fig(unamb(t4), 0.25))

    t5 = [r for r in tagged(5) if r["kind"] == "training" and 8 <= r["gpus"] <= 128]
    off5 = [r for r in tagged(5) if r not in t5]
    add(5, "training tokens/s per GPU, FSDP on 8 to 128 GPUs: every point within 20%",
        bool(t5) and _share(t5, 0.20)[0] == len(t5), _fig(t5, 0.20), _fig(unamb(t5), 0.20),
        f"left out: {len(off5)} case(s) tagged 5 outside 8-128 GPUs" if off5 else "")

    t6 = [r for r in tagged(6) if r["interval"]]
    inside = lambda rs, key: sum(r[key][0] <= r["published"] <= r[key][1] for r in rs)  # noqa: E731
    if not t6:
        add(6, "the printed 80% intervals hold >= 75% of the points", False, "no intervals yet", "")
    else:
        l6 = [r for r in tagged(6) if r.get("loo_interval")]
        u6 = unamb(l6)
        printed = f"printed intervals (their own points among the band's): {inside(t6, 'interval')}/{len(t6)}"
        add(6, "the printed 80% intervals hold >= 75% of the points (judged leave-one-out: each case's band "
               "without its own ratio)", bool(l6) and inside(l6, "loo_interval") / len(l6) >= 0.75,
            f"{inside(l6, 'loo_interval')}/{len(l6)} published values inside "
            f"({inside(l6, 'loo_interval') / max(len(l6), 1):.0%}); {printed}",
            f"{inside(u6, 'loo_interval')}/{len(u6)} unambiguous" if u6 else "no unambiguous point")
        every = [r for r in done if r.get("loo_interval")]
        lofo = source_out_intervals(done)
        k = sum(iv[0] <= r["published"] <= iv[1] for r, iv in lofo)
        out[-1]["extra"] = (f"every predicted case, leave-one-out: {inside(every, 'loo_interval')}/{len(every)} inside "
                            f"({inside(every, 'loo_interval') / max(len(every), 1):.0%}); leaving out each case's whole "
                            f"source file (cases from a source not seen): {k}/{len(lofo)} ({k / max(len(lofo), 1):.0%})")
    return out


# ---------------------------------------------------------------- output


def _num(v: Optional[float]) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}"


def render(rows: list[dict], n_files: int, verbose: bool) -> tuple[str, dict]:
    lines = [f"Published measurements against `throughputlab predict` (analytic model, predict's defaults; "
             f"throughputlab {__version__} from {Path(throughputlab.__file__).parent})",
             f"{len(rows)} cases from {n_files} file(s); {sum(r['ratio'] is not None for r in rows)} predicted, "
             f"{sum(r['ratio'] is None for r in rows)} not predicted",
             "flags: A ambiguous (the source leaves something open, see its note), U case settings predict did not "
             "take, K predict marks the point over its KV cache or out of memory", ""]
    head = (f"{'id':<48} {'kinds':<6} {'model':<16} {'device':<14} {'tp':>2} {'metric':<9} {'published':>10} "
            f"{'predicted':>10} {'pred/pub':>8}  flags")
    current = None
    for r in rows:
        if r["file"] != current:
            current = r["file"]
            lines += ["", f"== {current}", head]
        metric = GENERATION_METRICS.get(r["metric"]) or TRAINING_METRICS.get(r["metric"]) or r["metric"]
        flags = ("A" if r["ambiguous"] else "") + ("U" if r["not_used"] else "") + \
                ("K" if any(n.startswith("predict marks") for n in r["notes"]) else "")
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        lines.append(f"{r['id']:<48} {','.join(map(str, r['kinds'])):<6} {r['model']:<16} {r['device']:<14} "
                     f"{r['tp']:>2} {metric:<9} {_num(r['published']):>10} {_num(r['predicted']):>10} {ratio:>8}  "
                     + (flags if r["ratio"] is not None else "NOT PREDICTED"))
        if verbose:
            if r["inputs"].get("command"):
                lines.append(f"    {r['inputs']['command']}")
            if r["interval"]:
                lines.append(f"    80% interval: {_num(r['interval'][0])} - {_num(r['interval'][1])}")
            if r["not_used"]:
                lines.append(f"    not used: {', '.join(r['not_used'])}")
            for n in r["notes"]:
                lines.append(f"    note: {n}")
            if r["reason"]:
                lines.append(f"    not predicted: {r['reason']}")

    skipped = [r for r in rows if r["ratio"] is None]
    lines += ["", f"Not predicted ({len(skipped)}):"] + [f"  {r['file']}: {r['id']}: {r['reason']}" for r in skipped]
    if not skipped:
        lines[-1] += " none"

    unused: dict[str, int] = {}
    for r in rows:
        for s in r["not_used"]:
            key = s.split("=", 1)[0] if "=" in s.split(" ", 1)[0] else s.split(" (", 1)[0]
            unused[key] = unused.get(key, 0) + 1
    lines += ["", "Case settings predict did not take (cases): " +
              (", ".join(f"{k} ({v})" for k, v in sorted(unused.items(), key=lambda kv: (-kv[1], kv[0]))) or "none")]

    summ = summaries(rows)
    sub = f"{'n':>4}  {'median':>6}  {'<=10%':>5}  {'<=25%':>5}  {'p10 - p90':^13}"
    for title, groups in summ.items():
        lines += ["", f"By {title} (predicted/published rate; TPOT inverted)".ljust(50) + "all cases".ljust(45) + "unambiguous only",
                  " " * 50 + sub + "    " + sub]
        for label, a, u in groups:
            lines.append(f"  {label[:47]:<48}{_stats_text(a)}    {_stats_text(u)}")

    tg = targets(rows)
    lines += ["", "Targets"]
    for t in tg:
        lines.append(f"  ({t['kind']}) {t['goal']}: {'MET' if t['met'] else 'NOT MET'}")
        lines.append(f"      {t['figure']}" + (f"; unambiguous: {t['figure_unambiguous']}" if t["figure_unambiguous"]
                                               else ""))
        if t["extra"]:
            lines.append(f"      {t['extra']}")
        if t["not_predicted"]:
            lines.append(f"      {t['not_predicted']} case(s) tagged {t['kind']} not predicted (listed above)")
        for g in t.get("groups", []):
            if g["predicted_plateau"] is None:
                lines.append(f"      {g['group']}: {g['start_note']}")
                continue
            start = ""
            if g["published_start"] is not None:
                ps = "-" if g["predicted_start"] is None else f"{g['predicted_start']:,.0f}"
                start = f", plateau from {ps} vs {g['published_start']:,.0f}"
            verdict = "met" if g["met"] else "not met"
            lines.append(f"      {g['group']}: {verdict}: plateau {_num(g['predicted_plateau'])} "
                         f"vs {_num(g['published_plateau'])} ({g['plateau_ratio']:.2f}){start}"
                         + (f" ({g['start_note']})" if g["start_note"] else "") + (" [A]" if g["ambiguous"] else ""))
    report = {"throughputlab": __version__, "cases": [{k: v for k, v in r.items() if not k.startswith("_")}
                                                      for r in rows],
              "summaries": {t: [{"group": lab, "all": a, "unambiguous": u} for lab, a, u in gs]
                            for t, gs in summ.items()},
              "settings_not_used": unused, "targets": tg}
    return "\n".join(lines) + "\n", report


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", type=int, choices=sorted(KINDS), help="only the cases that serve this check kind")
    ap.add_argument("--file", metavar="GLOB", help="only the data files whose name matches (e.g. 'trtllm*')")
    ap.add_argument("--case", metavar="SUBSTR", help="only the cases whose id contains SUBSTR")
    ap.add_argument("-v", "--verbose", action="store_true", help="show predict's inputs (and notes) per case")
    ap.add_argument("--json", metavar="FILE", type=Path, help="also write every case's row and the summaries here")
    ap.add_argument("--write-spread", metavar="FILE", type=Path,
                    help="write the library's table of predicted/published by kind (throughputlab/spread_data.py)")
    ap.add_argument("--data", metavar="DIR", type=Path, default=DATA_DIR, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        cases = load_cases(args.data, args.file)
    except DataError as e:
        print(f"malformed data file: {e}", file=sys.stderr)
        return 2
    if args.kind is not None:
        cases = [c for c in cases if args.kind in (c.get("checks") or [])]
    if args.case:
        cases = [c for c in cases if args.case in c["id"]]
    n_files = len({c["_file"] for c in cases})
    if not cases:
        print("no cases match the selection")
        return 0
    rows = [make_row(c, predict_case(c)) for c in cases]
    if args.write_spread:
        n = write_spread(rows, args.write_spread)
        print(f"wrote {n} ratios to {args.write_spread}")
    text, report = render(rows, n_files, args.verbose)
    sys.stdout.write(text)
    if args.json:
        try:
            args.json.write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
        except OSError as e:
            print(f"cannot write {args.json}: {e.strerror or e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
