"""vLLM's own benchmarks, read into a Profile.

Sources: a ``vllm bench serve --save-result`` JSON (one run; ``--append-result`` files hold one
run per line), several of them, a ``vllm bench sweep serve`` output folder (``run=N.json`` files,
else the rows of ``summary.csv``), a folder of ``--save-result`` files, or a
``vllm bench throughput --output-json`` file.

One run is one GenSample with the run's real totals: ``duration`` and ``total_output_tokens``
(so its tokens/s is the run's ``output_throughput``). Runs at the same concurrency and mean
lengths are samples of one point. With ``--save-detailed`` the successful requests' ``ttfts``
and pooled ``itls`` go into the sample; the summary statistics (mean, median, pNN of TTFT,
TPOT, ITL, E2EL in ms) go into the notes, as the schema has no field for them.

The concurrency of a point is ``max_concurrency``; without it, ``num_prompts`` when every
request was sent at once (``request_rate`` inf), else the mean number of requests in flight by
Little's law (completed * mean E2E latency / duration), rounded. A throughput run sends all
``num_requests`` at once (capped by ``max_num_seqs`` when given); its JSON counts prompt and
output tokens together, so it needs the run's ``--output-len``.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Optional, Sequence

from throughputlab.errors import UserError
from throughputlab.imports.common import (
    Target,
    by_concurrency,
    count,
    imported_profile,
    merge_points,
    model_mismatch,
    number,
    one_model,
    read_json,
    read_text,
)
from throughputlab.records.profile import EngineInfo, GenPoint, GenSample, Profile

EXPECTED = "a vllm bench serve --save-result JSON, a vllm bench sweep serve folder or a vllm bench throughput JSON"
SERVE, OFFLINE = "vllm-serve", "vllm-throughput"
_METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2EL"))
_DETAIL = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")
_NOT_MEASURED = {
    SERVE: ("not measured by vllm bench serve: decode-step and prefill times (TTFT includes queueing and the "
            "prefills of other requests), the engine's running batch (max_concurrency caps the client's requests "
            "in flight), peak memory, telemetry"),
    OFFLINE: ("not measured by vllm bench throughput: output tokens apart from prompt tokens (from --output-len), "
              "latencies, the engine's running batch (all requests are submitted at once; max_num_seqs caps it), "
              "peak memory, telemetry"),
}


@dataclass
class Run:
    """One benchmark run as its file holds it."""

    where: str  # the file, and the line or row within it
    data: dict
    kind: str  # SERVE or OFFLINE
    server: Optional[str] = None  # the sweep's server settings (the SERVE-... part of its folder name)


# ---------------------------------------------------------------- finding runs


def _kind(data: dict, where: str) -> str:
    if "benchmarks" in data:
        raise UserError(f"{where}: a GuideLLM report, not a vllm bench result: use `throughputlab import guidellm`")
    if "elapsed_time" in data and "num_requests" in data:
        return OFFLINE
    if any(k in data for k in ("duration", "completed", "total_output_tokens", "output_throughput")):
        return SERVE
    raise UserError(f"{where}: not a vllm bench result (no field duration or elapsed_time); expected {EXPECTED}")


def _runs_of_doc(doc, where: str, server: Optional[str] = None) -> list[Run]:
    if isinstance(doc, dict):
        items = [(where, doc)]
    elif isinstance(doc, list) and doc and all(isinstance(d, dict) for d in doc):
        items = [(f"{where} (run {i + 1})", d) for i, d in enumerate(doc)]
    else:
        raise UserError(f"{where}: not a vllm bench result (expected a JSON object); expected {EXPECTED}")
    return [Run(w, d, _kind(d, w), server) for w, d in items]


def _server_of(folder: Path, run_file: Path) -> Optional[str]:
    rel = run_file.parent.relative_to(folder).as_posix()
    m = re.search(r"SERVE-+(.*?)(?:-+BENCH-|$)", rel)
    return m.group(1) if m else None


def _run_number(p: Path) -> tuple:
    m = re.fullmatch(r"run=(-?\d+)\.json", p.name)
    return (str(p.parent), int(m.group(1)) if m else 0)


def _runs_of_folder(folder: Path) -> list[Run]:
    run_files = sorted((p for p in folder.rglob("run=*.json") if re.fullmatch(r"run=\d+\.json", p.name)),
                       key=_run_number)
    if run_files:
        runs = []
        for f in run_files:
            runs.extend(_runs_of_doc(read_json(f, EXPECTED), str(f), _server_of(folder, f)))
        return runs
    summary = folder / "summary.csv"
    if summary.is_file():
        rows = list(csv.DictReader(read_text(summary, "vllm bench sweep serve's summary.csv").splitlines()))
        if rows:
            # the per-request lists are strings in the CSV: the rows give the totals only
            return [Run(f"{summary} row {i + 1}", {k: v for k, v in r.items() if k and k not in _DETAIL},
                        _kind(r, f"{summary} row {i + 1}")) for i, r in enumerate(rows)]
    results = sorted(p for p in folder.glob("*.json") if not p.name.endswith(".pytorch.json")
                     and p.name not in ("summary.json", "warmup.json") and not p.name.endswith(".failure.json"))
    runs = []
    for f in results:
        runs.extend(_runs_of_doc(read_json(f, EXPECTED), str(f)))
    if not runs:
        raise UserError(f"{folder}: an empty sweep: no run=N.json files, no rows in summary.csv and no result JSON")
    return runs


def collect_runs(paths: Sequence[Path]) -> list[Run]:
    """Every run in ``paths`` (files and folders), in the order given."""
    if not paths:
        raise UserError("give at least one vllm bench result file or sweep folder")
    runs: list[Run] = []
    for path in paths:
        path = Path(path)
        if path.is_dir():
            runs.extend(_runs_of_folder(path))
        else:
            runs.extend(_runs_of_doc(read_json(path, EXPECTED), str(path)))
    return runs


# ---------------------------------------------------------------- one run -> one point


def _measured_at(data: dict) -> Optional[str]:
    """``date`` as vllm bench writes it (local time, %Y%m%d-%H%M%S), in ISO form."""
    try:
        return datetime.strptime(str(data.get("date", "")), "%Y%m%d-%H%M%S").isoformat()
    except ValueError:
        return None


def _is_inf(rate) -> bool:
    if rate is None:
        return True
    if isinstance(rate, str):
        return rate.strip().lower() in ("inf", "infinity", "")
    return isinstance(rate, (int, float)) and math.isinf(rate)


def _concurrency(run: Run, completed: int, duration: float, mean_out: float) -> tuple[int, Optional[str]]:
    """The point's concurrency and, when it is not the configured cap, how it was obtained."""
    d, where = run.data, run.where
    cap = count(d, "max_concurrency", where, required=False)
    if cap is not None:
        if cap < 1:
            raise UserError(f"{where}: field max_concurrency must be at least 1, got {cap}")
        return cap, None
    if _is_inf(d.get("request_rate")):
        n = count(d, "num_prompts", where, required=False)
        if n is None:
            raise UserError(f"{where}: fields max_concurrency and num_prompts are missing: the concurrency is unknown")
        return max(n, 1), (f"no max_concurrency and request_rate inf: all {n} requests sent at once, concurrency "
                           "taken as num_prompts (the engine's max_num_seqs may have run fewer at a time)")
    e2el = number(d, "mean_e2el_ms", where, required=False)
    how = "mean E2E latency"
    if e2el is None:
        ttft, tpot = number(d, "mean_ttft_ms", where, required=False), number(d, "mean_tpot_ms", where, required=False)
        if ttft is None or tpot is None:
            raise UserError(f"{where}: no max_concurrency and a finite request_rate, and field mean_e2el_ms (or "
                            "mean_ttft_ms and mean_tpot_ms) is missing: the concurrency cannot be measured")
        e2el, how = ttft + tpot * max(mean_out - 1, 0), "mean TTFT + TPOT x (output - 1)"
    mean_c = completed * e2el / 1e3 / duration
    return max(round(mean_c), 1), (f"request_rate {d.get('request_rate')} without max_concurrency: concurrency is "
                                   f"the mean requests in flight, {mean_c:.2f} (completed x {how} / duration)")


def _detail(run: Run) -> tuple[list[float], list[float]]:
    """Per-request TTFTs and pooled ITLs (seconds) of the successful requests (--save-detailed)."""
    d, where = run.data, run.where
    if d.get("ttfts") is None:
        return [], []
    ttfts, itls, outs = d.get("ttfts"), d.get("itls"), d.get("output_lens")
    for key, xs in (("ttfts", ttfts), ("itls", itls), ("output_lens", outs)):
        if xs is not None and not isinstance(xs, list):
            raise UserError(f"{where}: field {key} is not a list")
    if outs is not None and len(outs) != len(ttfts):
        raise UserError(f"{where}: fields ttfts and output_lens differ in length ({len(ttfts)} and {len(outs)})")
    errors = d.get("errors") if isinstance(d.get("errors"), list) else None
    try:
        ok = [i for i in range(len(ttfts))
              if (outs is None or (outs[i] or 0) > 0) and not (errors and i < len(errors) and errors[i])]
        ttft_s = [float(ttfts[i]) for i in ok]
        itl_s = [float(x) for i in ok if itls and i < len(itls) for x in (itls[i] or [])]
    except (TypeError, ValueError):
        raise UserError(f"{where}: fields ttfts, itls and output_lens must hold numbers") from None
    if not all(math.isfinite(x) and x >= 0 for x in ttft_s + itl_s):
        raise UserError(f"{where}: fields ttfts and itls must hold non-negative finite numbers (seconds)")
    return ttft_s, itl_s


def _latency_line(d: dict, where: str) -> Optional[str]:
    parts = []
    for key, name in _METRICS:
        stats = []
        for stat in ("mean", "median"):
            v = number(d, f"{stat}_{key}_ms", where, required=False)
            if v is not None:
                stats.append(f"{stat} {v:.4g}")
        pcts = [k for k in d if re.fullmatch(rf"p[\d.]+_{key}_ms", k)]
        for k in sorted(pcts, key=lambda k: float(k[1:].split("_")[0])):
            v = number(d, k, where, required=False)
            if v is not None:
                stats.append(f"{k.split('_')[0]} {v:.4g}")
        if stats:
            parts.append(f"{name} ms {', '.join(stats)}")
    return "; ".join(parts) or None


def serve_point(run: Run, notes: list[str]) -> GenPoint:
    """One ``vllm bench serve`` run as a point of one sample; notes get what it does not say."""
    d, where = run.data, run.where
    duration = number(d, "duration", where)
    completed = count(d, "completed", where)
    failed = count(d, "failed", where, required=False) or 0
    total_in = count(d, "total_input_tokens", where)
    total_out = count(d, "total_output_tokens", where)
    if duration <= 0:
        raise UserError(f"{where}: field duration must be positive, got {duration:g}")
    at = _measured_at(d)
    extra = {"measured_at": at} if at else {}
    if completed == 0 or total_out == 0:
        notes.append(f"{where}: no successful requests ({failed} failed): recorded as an error point, not fitted")
        return GenPoint(backend=SERVE, concurrency=count(d, "max_concurrency", where, required=False) or 1,
                        prompt_len=0, output_len=0, status="error", error=f"no successful requests ({failed} failed)",
                        **extra)
    p_len, o_len = round(total_in / completed), round(total_out / completed)
    c, how = _concurrency(run, completed, duration, total_out / completed)
    ttft_s, itl_s = _detail(run)
    tag = f"c={c} ({where})"
    if how:
        notes.append(f"{tag}: {how}")
    if failed:
        notes.append(f"{tag}: {failed} of {completed + failed} requests failed; tokens/s counts the {completed} "
                     "that completed")
    reported = number(d, "output_throughput", where, required=False)
    if reported and abs(total_out / duration / reported - 1) > 0.01:
        notes.append(f"{tag}: output_throughput {reported:.4g} differs from total_output_tokens / duration "
                     f"{total_out / duration:.4g}; the totals are used")
    lat = _latency_line(d, where)
    if lat:
        notes.append(f"{tag}: {lat}")
    sample = GenSample(total_s=duration, output_tokens=total_out, ttft_s=ttft_s, itl_s=itl_s)
    return GenPoint(backend=SERVE, concurrency=c, prompt_len=p_len, output_len=o_len, status="ok",
                    samples=[sample], **extra)


def throughput_point(run: Run, notes: list[str], output_len: Optional[int], max_num_seqs: Optional[int]) -> GenPoint:
    """One ``vllm bench throughput`` run: all requests at once, prompt and output tokens counted together."""
    d, where = run.data, run.where
    elapsed = number(d, "elapsed_time", where)
    n = count(d, "num_requests", where)
    total = count(d, "total_num_tokens", where)
    if elapsed <= 0 or n == 0:
        raise UserError(f"{where}: fields elapsed_time and num_requests must be positive")
    out = count(d, "total_output_tokens", where, required=False)
    if out is None:
        if output_len is None:
            raise UserError(f"{where}: a vllm bench throughput result has no output token count (field "
                            "total_output_tokens): pass --output-len, the --output-len of that run")
        out = n * output_len
    prompt_total = total - out
    if prompt_total < 0:
        raise UserError(f"{where}: field total_num_tokens ({total}) is below the output tokens ({out}): "
                        "check --output-len")
    c = min(n, max_num_seqs) if max_num_seqs else n
    how = (f"all {n} requests submitted at once; concurrency {c}"
           + (f" (capped by --max-num-seqs {max_num_seqs})" if max_num_seqs and max_num_seqs < n else
              " (num_requests: the engine's max_num_seqs may have run fewer at a time; give --max-num-seqs)"))
    src = "total_output_tokens" if "total_output_tokens" in d else f"num_requests x --output-len {output_len}"
    notes.append(f"c={c} ({where}): {how}; output tokens from {src}, prompt tokens the rest of total_num_tokens")
    sample = GenSample(total_s=elapsed, output_tokens=out)
    return GenPoint(backend=OFFLINE, concurrency=c, prompt_len=round(prompt_total / n), output_len=round(out / n),
                    status="ok", samples=[sample])


# ---------------------------------------------------------------- the profile


def load_vllm_bench(paths: Sequence[Path], target: Target, *, output_len: Optional[int] = None,
                    max_num_seqs: Optional[int] = None, command_line: Optional[list[str]] = None) -> Profile:
    """A Profile of every run in ``paths``; bad files are one-line UserErrors naming file and field."""
    if output_len is not None and output_len < 1:
        raise UserError(f"--output-len must be a positive integer, got {output_len}")
    if max_num_seqs is not None and max_num_seqs < 1:
        raise UserError(f"--max-num-seqs must be a positive integer, got {max_num_seqs}")
    runs = collect_runs(paths)
    models: dict[str, list[str]] = {}
    for r in runs:
        models.setdefault(str(r.data.get("model_id") or r.data.get("model") or ""), []).append(r.where)
    model_id = one_model(models, "model_id")
    point_notes: list[str] = []
    points = []
    servers: dict[tuple, set] = {}
    for r in runs:
        if r.kind == SERVE:
            p = serve_point(r, point_notes)
        else:
            p = throughput_point(r, point_notes, output_len, max_num_seqs)
        servers.setdefault(p.key, set()).add(r.server)
        points.append(p)
    for key, names in servers.items():
        if len(names) > 1:
            shown = ", ".join(sorted(n or "(none)" for n in names))
            raise UserError(f"{paths[0]}: runs at concurrency {key[2]} come from several server settings ({shown}); "
                            "import one SERVE-... folder at a time")
    kinds = sorted({r.kind for r in runs})
    given = [str(p) for p in paths]
    if not any(p.status == "ok" for p in points):
        raise UserError(f"{given[0]}: no run has successful requests: nothing to import")
    shown = ", ".join(given[:4]) + (f" and {len(given) - 4} more" if len(given) > 4 else "")
    notes = [f"imported from {' and '.join('vllm bench ' + k.split('-')[1] for k in kinds)}: {len(runs)} run(s) "
             f"in {shown}" + (f"; model_id {model_id}" if model_id else ""),
             *(_NOT_MEASURED[k] for k in kinds)]
    mismatch = model_mismatch(target, model_id)
    if mismatch:
        notes.append(mismatch)
    if any(r.kind == SERVE for r in runs) and not any(s.ttft_s for p in points for s in p.samples):
        notes.append("per-request TTFT and ITL are absent (the runs were saved without --save-detailed): only the "
                     "summary statistics below")
    servers_seen = sorted({r.server for r in runs if r.server})
    if servers_seen:
        notes.append(f"server settings of the sweep: {', '.join(servers_seen)}")
    engine_args = {"tensor_parallel_size": target.tp} if target.tp > 1 else {}
    if max_num_seqs:
        engine_args["max_num_seqs"] = max_num_seqs
    engine = EngineInfo(name="vllm", engine_args=engine_args, max_num_seqs=max_num_seqs)
    return imported_profile(target, merge_points(points), backend="+".join(kinds), source="imported: vllm bench",
                            notes=notes + by_concurrency(point_notes), engine=engine, command_line=command_line)

