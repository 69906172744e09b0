"""GuideLLM's report (``benchmarks.json``), read into a Profile.

Each benchmark of the report is one run: one GenSample holding its successful requests' output
tokens (``output_token_count``'s sum) over the time GuideLLM's mean ``output_tokens_per_second``
implies, so the point's tokens/s is the rate GuideLLM reports. The concurrency of a point is
the strategy's: ``streams`` for ``concurrent``, 1 for ``synchronous``, and for ``throughput``,
``constant`` and ``poisson`` (which set no concurrency) the measured mean
``request_concurrency``, rounded, as the notes say. Per-request TTFTs come from the report's
sampled successful requests when it holds them; the summary statistics of
``time_to_first_token_ms``, ``inter_token_latency_ms`` and ``request_concurrency`` (mean,
median, percentiles) go into the notes. Reports from before and after GuideLLM moved the
strategy from ``args`` to ``config`` are both read; metrics may be split by status
(``successful``) or not.
"""

from __future__ import annotations

from datetime import datetime, timezone
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
)
from throughputlab.records.profile import GenPoint, GenSample, Profile

EXPECTED = "a GuideLLM benchmarks.json report"
BACKEND = "guidellm"
_MEASURED_CONCURRENCY = ("throughput", "constant", "poisson")
_STRATEGIES = ("synchronous", "concurrent", *_MEASURED_CONCURRENCY)
NOT_MEASURED = ("not measured by GuideLLM: decode-step and prefill times (TTFT includes queueing), the engine's "
                "running batch, peak memory, telemetry; ITL is summarised per request, so no per-token gaps are kept")


def _dist(metrics: dict, name: str, where: str, required: bool = True) -> Optional[dict]:
    """The successful requests' distribution summary of a metric (mean, median, percentiles...)."""
    m = metrics.get(name)
    if m is None:
        if required:
            raise UserError(f"{where}: field metrics.{name} is missing")
        return None
    d = m.get("successful", m) if isinstance(m, dict) else None
    if not isinstance(d, dict):
        raise UserError(f"{where}: field metrics.{name} is not a distribution summary (mean, median, percentiles)")
    return d


def _strategy(bench: dict, where: str) -> dict:
    for parent in ("config", "args"):
        block = bench.get(parent)
        if isinstance(block, dict) and isinstance(block.get("strategy"), dict):
            return block["strategy"]
    raise UserError(f"{where}: field config.strategy (args.strategy in older reports) is missing")


def _stats_line(name: str, d: Optional[dict], where: str) -> Optional[str]:
    if not d:
        return None
    parts = [f"{k} {v:.4g}" for k in ("mean", "median") if (v := number(d, k, where, required=False)) is not None]
    pct = d.get("percentiles") if isinstance(d.get("percentiles"), dict) else {}
    parts += [f"{k} {v:.4g}" for k in ("p50", "p90", "p95", "p99")
              if (v := number(pct, k, f"{where}: {name}.percentiles", required=False)) is not None]
    return f"{name} {', '.join(parts)}" if parts else None


def _measured_at(bench: dict) -> Optional[str]:
    start = bench.get("start_time")
    if start is None and isinstance(bench.get("run_stats"), dict):
        start = bench["run_stats"].get("start_time")
    if isinstance(start, (int, float)) and not isinstance(start, bool) and start > 0:
        return datetime.fromtimestamp(start, timezone.utc).isoformat(timespec="seconds")
    return None


def _ttfts_s(bench: dict) -> list[float]:
    """TTFT of each successful request the report kept (GuideLLM samples them), in seconds."""
    reqs = bench.get("requests")
    ok = reqs.get("successful") if isinstance(reqs, dict) else None
    if not isinstance(ok, list):
        return []
    out = []
    for r in ok:
        v = r.get("time_to_first_token_ms") if isinstance(r, dict) else None
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0:
            out.append(v / 1e3)
    return out


def benchmark_point(bench: dict, where: str, notes: list[str]) -> GenPoint:
    """One benchmark of a report as a point of one sample."""
    if not isinstance(bench, dict):
        raise UserError(f"{where}: not a benchmark (expected a JSON object)")
    strategy = _strategy(bench, where)
    kind = strategy.get("type_") or strategy.get("type")
    if kind not in _STRATEGIES:
        raise UserError(f"{where}: field config.strategy.type_ is {kind!r}; known strategies are "
                        f"{', '.join(_STRATEGIES)}")
    metrics = bench.get("metrics")
    if not isinstance(metrics, dict):
        raise UserError(f"{where}: field metrics is missing")
    rate = number(_dist(metrics, "output_tokens_per_second", where), "mean",
                  f"{where}: metrics.output_tokens_per_second")
    outs = _dist(metrics, "output_token_count", where)
    prompts = _dist(metrics, "prompt_token_count", where)
    ow = f"{where}: metrics.output_token_count"
    out_total = number(outs, "total_sum", ow, required=False)
    if out_total is None:
        out_total = number(outs, "mean", ow) * count(outs, "count", ow)
    conc = _dist(metrics, "request_concurrency", where, required=kind in _MEASURED_CONCURRENCY)
    if kind == "synchronous":
        c, how = 1, None
    elif kind == "concurrent":
        c, how = count(strategy, "streams", f"{where}: config.strategy"), None
        if c < 1:
            raise UserError(f"{where}: field config.strategy.streams must be at least 1, got {c}")
    else:
        mean_c = number(conc, "mean", f"{where}: metrics.request_concurrency")
        c = max(round(mean_c), 1)
        shown = f"{kind} at {strategy['rate']:g} requests/s" if isinstance(strategy.get("rate"), (int, float)) else kind
        how = f"strategy {shown} sets no concurrency: the measured mean request_concurrency {mean_c:.2f}, rounded"
    at = _measured_at(bench)
    tag = f"c={c} ({where}, {kind})"
    if not rate or rate <= 0 or out_total <= 0:
        notes.append(f"{tag}: no successful output tokens: recorded as an error point, not fitted")
        return GenPoint(backend=BACKEND, concurrency=c, prompt_len=0, output_len=0, status="error",
                        error="no successful output tokens", **({"measured_at": at} if at else {}))
    if how:
        notes.append(f"{tag}: {how}")
    lat = [s for s in (_stats_line("TTFT ms", _dist(metrics, "time_to_first_token_ms", where, False), where),
                       _stats_line("ITL ms", _dist(metrics, "inter_token_latency_ms", where, False), where),
                       _stats_line("request concurrency", conc, where)) if s]
    if lat:
        notes.append(f"{tag}: {'; '.join(lat)}")
    sample = GenSample(total_s=out_total / rate, output_tokens=round(out_total), ttft_s=_ttfts_s(bench))
    return GenPoint(backend=BACKEND, concurrency=c,
                    prompt_len=round(number(prompts, "mean", f"{where}: metrics.prompt_token_count")),
                    output_len=round(number(outs, "mean", ow)), status="ok", samples=[sample],
                    **({"measured_at": at} if at else {}))


def _report(path: Path) -> tuple[Path, dict]:
    if path.is_dir():
        path = path / "benchmarks.json"
    if path.suffix.lower() in (".yaml", ".yml"):
        raise UserError(f"{path}: a YAML report; save GuideLLM's report as JSON (--output-path benchmarks.json)")
    if path.suffix.lower() == ".csv":
        raise UserError(f"{path}: GuideLLM's CSV summary lacks the strategies; give its benchmarks.json")
    doc = read_json(path, EXPECTED)
    if not isinstance(doc, dict) or "benchmarks" not in doc:
        if isinstance(doc, dict) and ("duration" in doc or "elapsed_time" in doc):
            raise UserError(f"{path}: a vllm bench result, not a GuideLLM report: "
                            "use `throughputlab import vllm-bench`")
        raise UserError(f"{path}: not a GuideLLM report (no field benchmarks); expected {EXPECTED}")
    if not isinstance(doc["benchmarks"], list) or not doc["benchmarks"]:
        raise UserError(f"{path}: field benchmarks is empty: the report holds no benchmark")
    return path, doc


def _model_of(report: dict, bench: dict) -> str:
    for block, key in ((report.get("args"), "model"), (bench.get("worker"), "backend_model"),
                       ((bench.get("config") or {}).get("backend") if isinstance(bench.get("config"), dict) else None,
                        "model")):
        if isinstance(block, dict) and isinstance(block.get(key), str) and block[key]:
            return block[key]
    return ""


def load_guidellm(paths: Sequence[Path], target: Target, *, command_line: Optional[list[str]] = None) -> Profile:
    """A Profile of every benchmark in the reports ``paths`` (files, or folders holding benchmarks.json)."""
    if not paths:
        raise UserError("give at least one GuideLLM benchmarks.json report")
    notes: list[str] = []
    points = []
    models: dict[str, list[str]] = {}
    files, kinds = [], []
    for raw in paths:
        path, report = _report(Path(raw))
        files.append(str(path))
        for i, bench in enumerate(report["benchmarks"]):
            where = f"{path}: benchmarks[{i}]"
            points.append(benchmark_point(bench, where, notes))
            kinds.append(_strategy(bench, where).get("type_") or "?")
            models.setdefault(_model_of(report, bench), []).append(where)
    model = one_model(models, "model")
    if not any(p.status == "ok" for p in points):
        raise UserError(f"{files[0]}: no benchmark has successful output tokens: nothing to import")
    head = [f"imported from GuideLLM: {len(points)} benchmark(s) ({', '.join(sorted(set(kinds)))}) in "
            f"{', '.join(files)}" + (f"; model {model}" if model else ""),
            NOT_MEASURED,
            "each benchmark's sample: successful output tokens over (those tokens / GuideLLM's mean output tokens/s)"]
    mismatch = model_mismatch(target, model)
    if mismatch:
        head.append(mismatch)
    return imported_profile(target, merge_points(points), backend=BACKEND, source="imported: guidellm",
                            notes=head + by_concurrency(notes), command_line=command_line)
