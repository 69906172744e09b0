"""RL run logs: per-step phase times of a real GRPO/PPO run, for comparing with what `decide`
models.

Formats:

- ``verl``: veRL's file logger, JSON lines ``{"step": N, "data": {...}}``, phases from
  ``timing_s/gen``, ``timing_s/old_log_prob``, ``timing_s/ref``, ``timing_s/values``,
  ``timing_s/update_critic``, ``timing_s/update_actor``, ``timing_s/update_weights``,
  ``timing_s/step``; also ``perf/total_num_tokens``, ``perf/throughput``,
  ``perf/max_memory_allocated_gb`` and ``response_length/mean|max|min|clip_ratio``;
- ``trl``: a Hugging Face ``trainer_state.json``, its ``log_history`` entries: ``step_time``
  (seconds per step, averaged over the logging interval), cumulative ``num_tokens`` and
  ``completions/mean_length|max_length|min_length|clipped_ratio``;
- ``csv``: a column ``step`` and phase times in seconds, named after the phase (``gen`` or
  ``gen_s``; the step's own time ``step_s`` or ``step_time``), plus optional ``response_length``.

``columns`` renames any of them: ``{"gen": "my_gen_time"}`` reads the phase gen from the column
(or log key) my_gen_time; ``step_index`` names the step-number column of a CSV. Records without
any phase time (veRL's validation-only steps, TRL's eval and summary entries) are skipped and
counted; a step logged twice (a resumed run) keeps its last record.

``load_run_log(path)`` returns a RunLog; ``RunLog.phase_summary()`` gives per phase the median
over steps, its p10/p90 spread and the number of steps; ``response_length_summary()`` the same
for the per-step mean response length. No torch.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Literal, Optional

from throughputlab.errors import UserError
from throughputlab.imports.common import number, read_json, read_text
from throughputlab.records.base import Record
from throughputlab.records.profile import percentiles

PHASES = ("gen", "logprob", "ref", "values", "update_critic", "update_actor", "sync", "step")
EXTRAS = ("response_length", "response_length_max", "response_length_min", "clip_ratio", "tokens", "tokens_per_s",
          "max_memory_allocated_gb")
FORMATS = ("verl", "trl", "csv")
Format = Literal["verl", "trl", "csv"]

VERL_KEYS = {
    "gen": "timing_s/gen", "logprob": "timing_s/old_log_prob", "ref": "timing_s/ref", "values": "timing_s/values",
    "update_critic": "timing_s/update_critic", "update_actor": "timing_s/update_actor",
    "sync": "timing_s/update_weights", "step": "timing_s/step",
    "response_length": "response_length/mean", "response_length_max": "response_length/max",
    "response_length_min": "response_length/min", "clip_ratio": "response_length/clip_ratio",
    "tokens": "perf/total_num_tokens", "tokens_per_s": "perf/throughput",
    "max_memory_allocated_gb": "perf/max_memory_allocated_gb",
}
TRL_KEYS = {
    "step": "step_time", "response_length": "completions/mean_length", "response_length_max": "completions/max_length",
    "response_length_min": "completions/min_length", "clip_ratio": "completions/clipped_ratio",
    "tokens": "num_tokens",  # cumulative in TRL: differenced into tokens per step below
}


class StepRecord(Record):
    """One logged step: its phase times and what else the log says about it (None: not logged)."""

    step: int
    phases_s: dict[str, float]
    response_length: Optional[float] = None  # mean over the step's responses, tokens
    response_length_max: Optional[float] = None
    response_length_min: Optional[float] = None
    clip_ratio: Optional[float] = None  # share of responses cut at the length limit
    tokens: Optional[float] = None  # tokens the step processed (veRL: prompt + response, all ranks)
    tokens_per_s: Optional[float] = None  # as the log reports it (veRL: per GPU)
    max_memory_allocated_gb: Optional[float] = None  # as the log reports it


class Spread(Record):
    """Median over steps with its p10/p90 spread; n: the steps that logged the quantity."""

    n: int
    median: float
    p10: float
    p90: float
    mean: float
    min: float
    max: float


class RunLog(Record):
    path: str
    format: Format
    keys: dict[str, str]  # phase or quantity -> the column or log key it was read from
    steps: list[StepRecord]
    skipped: int = 0  # records without any phase time
    duplicates: int = 0  # records replaced by a later record of the same step

    def phase_summary(self) -> dict[str, Spread]:
        """Per phase (in PHASES order, those the log has): median seconds over steps, p10/p90, count."""
        out = {}
        for phase in PHASES:
            xs = [s.phases_s[phase] for s in self.steps if phase in s.phases_s]
            if xs:
                out[phase] = spread(xs)
        return out

    def response_length_summary(self) -> Optional[Spread]:
        """Spread over steps of the per-step mean response length (tokens); None if not logged."""
        xs = [s.response_length for s in self.steps if s.response_length is not None]
        return spread(xs) if xs else None

    def extra_summary(self) -> dict[str, Spread]:
        """The other per-step quantities the log has (max/min response length, clip ratio, tokens...)."""
        out = {}
        for name in EXTRAS[1:]:
            xs = [getattr(s, name) for s in self.steps if getattr(s, name) is not None]
            if xs:
                out[name] = spread(xs)
        return out


def spread(xs: list[float]) -> Spread:
    q = percentiles(xs, (10, 50, 90))
    return Spread(n=len(xs), median=q["p50"], p10=q["p10"], p90=q["p90"], mean=sum(xs) / len(xs), min=min(xs),
                  max=max(xs))


# ---------------------------------------------------------------- reading


def _check_columns(columns: Optional[dict[str, str]]) -> dict[str, str]:
    columns = dict(columns or {})
    valid = (*PHASES, *EXTRAS, "step_index")
    for name, key in columns.items():
        if name not in valid:
            raise UserError(f"--column {name}={key}: unknown name {name!r}; use one of {', '.join(valid)}")
        if not key:
            raise UserError(f"--column {name}=: give the column or log key after '='")
    return columns


def _detect(path: Path, text: str) -> Format:
    if path.suffix.lower() == ".csv":
        return "csv"
    try:
        doc = json.loads(text)
    except ValueError:
        first = next(line for line in text.splitlines() if line.strip())
        try:
            doc = json.loads(first)
        except ValueError:
            doc = None
        if isinstance(doc, dict) and "data" in doc and "step" in doc:
            return "verl"
        raise UserError(f"{path}: not a veRL file-logger JSONL, a TRL trainer_state.json or a CSV (give --format "
                        f"{'|'.join(FORMATS)})") from None
    if isinstance(doc, dict) and "log_history" in doc:
        return "trl"
    if isinstance(doc, dict) and "data" in doc and "step" in doc:
        return "verl"
    raise UserError(f"{path}: not a veRL file-logger JSONL, a TRL trainer_state.json or a CSV (give --format "
                    f"{'|'.join(FORMATS)})")


def _step_record(step: int, values: dict, keys: dict[str, str], where: str) -> Optional[StepRecord]:
    phases = {}
    for phase in PHASES:
        if phase in keys:
            x = number(values, keys[phase], where, required=False)
            if x is not None:
                if x < 0:
                    raise UserError(f"{where}: field {keys[phase]} is negative ({x:g} s)")
                phases[phase] = x
    if not phases:
        return None
    extra = {name: number(values, keys[name], where, required=False) for name in EXTRAS if name in keys}
    return StepRecord(step=step, phases_s=phases, **extra)


def _step_number(value, where: str, key: str) -> int:
    x = number({key: value}, key, where)
    if x != int(x):
        raise UserError(f"{where}: field {key} must be a whole step number, got {x:g}")
    return int(x)


def _verl(path: Path) -> list[tuple[int, dict, str]]:
    doc = read_json(path, "a veRL file-logger JSONL")
    records = doc if isinstance(doc, list) else [doc]
    rows = []
    for i, rec in enumerate(records, 1):
        where = f"{path} record {i}"
        if not isinstance(rec, dict) or not isinstance(rec.get("data"), dict) or "step" not in rec:
            raise UserError(f"{where}: not a veRL file-logger record (fields step and data)")
        rows.append((_step_number(rec["step"], where, "step"), rec["data"], where))
    return rows


def _trl(path: Path) -> list[tuple[int, dict, str]]:
    doc = read_json(path, "a TRL trainer_state.json")
    history = doc.get("log_history") if isinstance(doc, dict) else None
    if not isinstance(history, list):
        raise UserError(f"{path}: field log_history is missing: not a TRL trainer_state.json")
    rows = []
    for i, rec in enumerate(history):
        where = f"{path} log_history[{i}]"
        if not isinstance(rec, dict) or "step" not in rec:
            raise UserError(f"{where}: field step is missing")
        rows.append((_step_number(rec["step"], where, "step"), rec, where))
    return rows


def _csv(path: Path, keys: dict[str, str], text: str) -> list[tuple[int, dict, str]]:
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    step_col = keys.get("step_index", "step")
    if step_col not in header:
        raise UserError(f"{path}: no column {step_col} (the step number; --column step_index=COLUMN names another); "
                        f"columns are {', '.join(header) or 'none'}")
    rows = []
    for lineno, raw in enumerate(reader, 2):
        rec = {(k or "").strip(): v for k, v in raw.items()}
        if not any((v or "").strip() for v in rec.values() if isinstance(v, str)):
            continue
        where = f"{path} line {lineno}"
        rows.append((_step_number(rec.get(step_col), where, step_col), rec, where))
    return rows


def _csv_keys(header: set[str], columns: dict[str, str]) -> dict[str, str]:
    keys = {}
    for name in (*PHASES, *EXTRAS):
        names = ("step_s", "step_time") if name == "step" else (name, f"{name}_s")
        found = next((n for n in names if n in header), None)
        if found:
            keys[name] = found
    return keys | columns


def load_run_log(path, fmt: Optional[str] = None, columns: Optional[dict[str, str]] = None) -> RunLog:
    """Read an RL run log (``fmt``: verl, trl or csv; detected when None); ``columns`` maps a phase
    or quantity to the column or key to read it from. Bad files are one-line UserErrors."""
    path = Path(path)
    columns = _check_columns(columns)
    if fmt is not None and fmt not in FORMATS:
        raise UserError(f"--format {fmt}: unknown run-log format; use one of {', '.join(FORMATS)}")
    text = read_text(path, "a veRL file-logger JSONL, a TRL trainer_state.json or a CSV")
    fmt = fmt or _detect(path, text)
    if fmt == "verl":
        keys = VERL_KEYS | columns
        rows = _verl(path)
    elif fmt == "trl":
        keys = TRL_KEYS | columns
        rows = _trl(path)
    else:
        rows = _csv(path, columns, text)
        header = set(next(csv.reader(text.splitlines()), []))
        keys = _csv_keys({h.strip() for h in header}, columns)
    keys.pop("step_index", None)
    for name, key in columns.items():
        if name != "step_index" and not any(key in values for _, values, _ in rows):
            raise UserError(f"--column {name}={key}: no record of {path} has {key!r}")

    by_step: dict[int, StepRecord] = {}
    skipped = duplicates = 0
    for step, values, where in rows:
        rec = _step_record(step, values, keys, where)
        if rec is None:
            skipped += 1
            continue
        duplicates += step in by_step
        by_step[step] = rec
    if not by_step:
        wanted = ", ".join(keys[p] for p in PHASES if p in keys)
        if fmt == "csv" and not wanted:
            raise UserError(f"{path}: no timing keys: no phase-time column ({', '.join(PHASES[:-1])}, step_time, or "
                            "these with an _s suffix; --column PHASE=COLUMN names others)")
        raise UserError(f"{path}: no timing keys in any of its {len(rows)} record(s) (looked for {wanted or 'none'}; "
                        "--column PHASE=KEY names others)")
    steps = [by_step[s] for s in sorted(by_step)]
    if fmt == "trl" and "tokens" in keys:
        _tokens_per_step(steps)
    return RunLog(path=str(path), format=fmt, keys={k: v for k, v in keys.items() if _seen(steps, k, rows, v)},
                  steps=steps, skipped=skipped, duplicates=duplicates)


def _tokens_per_step(steps: list[StepRecord]) -> None:
    """TRL's num_tokens counts every token seen so far: per step it is the difference over the
    steps between two log entries (the first entry has no predecessor and keeps None)."""
    prev = None
    for s in steps:
        total = s.tokens
        s.tokens = None
        if total is not None and prev is not None and s.step > prev[0] and total >= prev[1]:
            s.tokens = (total - prev[1]) / (s.step - prev[0])
        if total is not None:
            prev = (s.step, total)


def _seen(steps: list[StepRecord], name: str, rows, key: str) -> bool:
    if name in PHASES:
        return any(name in s.phases_s for s in steps)
    return any(key in values for _, values, _ in rows)
