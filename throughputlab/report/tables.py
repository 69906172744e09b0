"""The report's tables: points (with a few telemetry figures), fitted parameters, peaks and the
environment. Cells are plain text; page.py escapes them. No torch."""

from __future__ import annotations

from typing import Optional

import pandas as pd

from throughputlab import roofline as rf
from throughputlab.fit.schema import FitResult, micro_batch_statement
from throughputlab.records.profile import Profile
from throughputlab.report.labels import GiB, profile_label


def _n(x: Optional[float]) -> Optional[str]:
    """Readable number: thousands separated, three significant figures below 100."""
    if x is None:
        return None
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _pct(x: Optional[float]) -> Optional[str]:
    return None if x is None else f"{100 * x:.1f}%"


# The few telemetry figures a reader compares across points, in this order; the profile keeps the rest.
_TELEMETRY = (("gpu_util_pct", "GPU util", "{:.0f}%"), ("proc_cpu_pct", "CPU", "{:.0f}%"),
              ("gpu_mem_used_gib", "GPU mem", "{:.3g} GiB"), ("proc_rss_gib", "RSS", "{:.3g} GiB"),
              ("gpu_power_w", "power", "{:.0f} W"), ("proc_minor_faults_per_s", "page faults", "{:,.0f}/s"))


def _telemetry(point) -> str:
    """Utilisation, memory, power or page faults (means; memory at its maximum), and throttling."""
    t = point.telemetry
    if t is None:
        return ""
    parts = []
    for key, label, fmt in _TELEMETRY:
        v = (t.max if key.endswith("_gib") else t.mean).get(key)
        if v is not None:
            parts.append(f"{label} {fmt.format(v)}")
    if t.throttled:
        parts.append("throttled: " + ", ".join(t.throttle_reasons))
    return "; ".join(parts)


def _ctx(s) -> float:
    return round(float(s), 3)


def points_tables(p: Profile, fit: Optional[FitResult]) -> list[tuple[str, pd.DataFrame]]:
    label = profile_label(p)
    # points are matched by concurrency and context: a profile may measure each concurrency at several contexts
    util = {(u.phase, u.x, _ctx(u.context_len)): u for u in (fit.utilisation if fit else [])}
    own = fit is not None and p.kind != "predicted"  # a prediction's stored errors belong to the measured profile
    loo = {(pt.x, _ctx(pt.context_len)): pt for pt in (fit.generation.points if own and fit.generation else [])}
    several = len({g.prompt_len for g in p.generation}) > 1
    rows = []
    for g in sorted(p.generation, key=lambda g: (g.prompt_len, g.output_len, g.concurrency)):
        s = _ctx(rf.mean_context(g.prompt_len, g.output_len))
        u = util.get(("decode", g.concurrency, s))
        e = loo.get((g.concurrency, s))
        rows.append({
            **({"prompt len": g.prompt_len} if several else {}),
            "concurrency": g.concurrency, "status": g.status, "tokens/s": _n(g.tokens_per_s),
            "decode step (ms)": _n(None if g.decode_step_s is None else g.decode_step_s * 1e3),
            "prefill (ms)": _n(None if g.prefill_s is None else g.prefill_s * 1e3),
            "MBU datasheet": _pct(u.mbu_datasheet) if u else None, "MFU datasheet": _pct(u.mfu_datasheet) if u else None,
            "MBU microbench": _pct(u.mbu_microbench) if u else None, "MFU microbench": _pct(u.mfu_microbench) if u else None,
            "fitted tokens/s": _n(e.fitted_tokens_per_s) if e else None,
            "held-out error": _pct(e.loo_rel_error) if e else None, "cv": _pct(g.cv), "telemetry": _telemetry(g), "error": g.error or "",
        })
    out = []
    if rows:
        out.append((f"{label}: generation points (decode utilisation)", pd.DataFrame(rows)))
    tloo = {(pt.x, _ctx(pt.context_len)): pt for pt in (fit.training.points if own and fit.training else [])}
    rows = []
    for t in sorted(p.training, key=lambda t: (t.seq_len, t.micro_batch)):
        u = util.get(("train", t.micro_batch, _ctx(t.seq_len)))
        e = tloo.get((t.micro_batch, _ctx(t.seq_len)))
        rows.append({
            "micro-batch": t.micro_batch, "seq len": t.seq_len, "status": t.status, "tokens/s": _n(t.tokens_per_s),
            "step (ms)": _n(None if t.step_s is None else t.step_s * 1e3),
            "peak mem (GiB)": None if t.peak_mem_bytes is None else t.peak_mem_bytes / GiB,
            "MFU datasheet": _pct(u.mfu_datasheet) if u else None, "MFU microbench": _pct(u.mfu_microbench) if u else None,
            "fitted tokens/s": _n(e.fitted_tokens_per_s) if e else None,
            "held-out error": _pct(e.loo_rel_error) if e else None, "cv": _pct(t.cv), "telemetry": _telemetry(t), "error": t.error or "",
        })
    if rows:
        out.append((f"{label}: training points", pd.DataFrame(rows)))
    return out


def _fmt(v: Optional[float], unit: str) -> str:
    if v is None:
        return ""
    return f"{v:.4g} {unit}".strip()


def fit_tables(p: Profile, fit: FitResult) -> tuple[list[str], list[tuple[str, pd.DataFrame]]]:
    label = profile_label(p)
    notes = [f"{label}: {fit.method} model"]
    rows = []

    def add(part, params):
        for e in params:
            rows.append({"part": part, "parameter": e.name, "value": _fmt(e.value, e.unit),
                         "95% low": _fmt(e.lo, e.unit), "95% high": _fmt(e.hi, e.unit),
                         "identified": "yes" if e.identified else "no", "note": e.note or ""})

    g = fit.generation
    if g is not None:
        add("decode", g.params + g.combinations)
        notes.append(f"{label}: {g.knee_note}")
        if g.generation_knee_note:
            notes.append(f"{label}: {g.generation_knee_note}")
        if g.n_points:
            forms = ", ".join(f"{k} {_pct(v) or 'n/a'}" for k, v in g.form_loo_mean_abs_error.items())
            notes.append(f"{label}: decode form '{g.form}' (fitted to {g.target}); mean held-out error by form: {forms}; "
                         f"largest held-out tokens/s error {_pct(g.loo_max_abs_error) or 'n/a'}")
    if fit.prefill is not None:
        add("prefill", fit.prefill.params + fit.prefill.combinations)
    tr = fit.training
    if tr is not None:
        add("training", tr.params)
        notes.append(f"{label}: largest held-out training tokens/s error {_pct(tr.loo_max_abs_error) or 'n/a'}"
                     + (f"; {tr.note}" if tr.note else ""))
        mem = tr.memory
        if mem is not None:
            rows.append({"part": "memory", "parameter": "mem0_bytes", "value": _fmt(mem.mem0_bytes / GiB, "GiB"),
                         "95% low": _fmt(mem.mem0_ci[0] / GiB, "GiB") if mem.mem0_ci else "",
                         "95% high": _fmt(mem.mem0_ci[1] / GiB, "GiB") if mem.mem0_ci else "", "identified": "yes",
                         "note": ""})
            rows.append({"part": "memory", "parameter": "mem_per_sample_bytes",
                         "value": _fmt(mem.mem_per_sample_bytes / GiB, "GiB"),
                         "95% low": _fmt(mem.mem_per_sample_ci[0] / GiB, "GiB") if mem.mem_per_sample_ci else "",
                         "95% high": _fmt(mem.mem_per_sample_ci[1] / GiB, "GiB") if mem.mem_per_sample_ci else "",
                         "identified": "yes", "note": mem.note or ""})
    mb = micro_batch_statement(fit)
    if mb:
        notes.append(f"{label}: {mb}")
    pk = fit.peaks
    peaks = pd.DataFrame([
        {"peak": "memory bandwidth", "datasheet": _fmt(pk.datasheet_bytes_per_s, "B/s"),
         "micro-benchmark": (_fmt(pk.microbench_bytes_per_s, "B/s") + " (copy)" if pk.microbench_bytes_per_s else "")},
        {"peak": "matrix-vector read bandwidth (the decode's access pattern)", "datasheet": "",
         "micro-benchmark": _fmt(pk.microbench_gemv_bytes_per_s, "B/s")},
        {"peak": f"FLOP/s ({pk.dtype}; microbench {pk.microbench_dtype or 'n/a'})",
         "datasheet": _fmt(pk.datasheet_flops_per_s, "FLOP/s"), "micro-benchmark": _fmt(pk.microbench_flops_per_s, "FLOP/s")},
    ])
    if pk.datasheet_source:
        notes.append(f"{label}: datasheet source: {pk.datasheet_source}")
    notes.extend(f"{label}: {a}" for a in fit.assumptions)
    notes.extend(f"{label}: warning: {w}" for w in fit.warnings)
    return notes, [(f"{label}: fitted parameters", pd.DataFrame(rows)), (f"{label}: hardware peaks", peaks)]


def environment_table(p: Profile) -> pd.DataFrame:
    hw, env, st = p.hardware, p.environment, p.settings
    prompts = ", ".join(map(str, sorted({g.prompt_len for g in p.generation}))) or str(st.prompt_len)
    seqs = ", ".join(map(str, sorted({t.seq_len for t in p.training}))) or str(st.seq_len)
    rows = [("kind", p.kind), ("model", p.model.name), ("parameters (total / active)",
                                                         f"{p.model.params_total:,} / {p.model.params_active:,}"),
            ("device", f"{hw.device_type}: {hw.device_name}"), ("device memory", _fmt((hw.memory_total_bytes or 0) / GiB, "GiB")),
            ("dtype", st.dtype), ("backends", f"{st.gen_backend or '-'} / {st.train_backend or '-'}"),
            ("lengths", f"prompt {prompts}, output {st.output_len}, training seq {seqs}"),
            ("repeats", f"{st.rounds} round(s) x {st.repeats} (warm-up {st.warmup}, max cv {st.max_cv})")]
    if p.kind == "predicted":  # nothing was measured: no sweep settings to show
        rows = rows[:-1]
    if hw.cpu:
        rows.append(("cpu", f"{hw.cpu.model} ({hw.cpu.logical_cores} logical cores)"))
    if st.device == "cpu":
        rows.append(("allocator", env.env_vars.get("LD_PRELOAD") or "system (glibc malloc)"))
    for gpu in hw.gpus:
        rows.append((f"gpu {gpu.index}", f"{gpu.name}, driver {gpu.driver}, cc {gpu.cuda_capability}"))
    if hw.microbench:
        mb = hw.microbench
        rows.append(("micro-benchmarks", f"copy {_fmt(mb.copy_bandwidth_bytes_per_s, 'B/s')}, "
                                         f"matrix-vector {_fmt(mb.gemv_bandwidth_bytes_per_s, 'B/s')}, "
                                         f"matmul {_fmt(mb.matmul_flops_per_s, 'FLOP/s')} ({mb.dtype})"))
    if p.engine:
        e = p.engine
        parts = [f"{e.name} {e.version or ''}".strip()]
        parts += [f"{label} {value}" for label, value in (
            ("KV cache tokens", e.kv_cache_tokens), ("max concurrency", e.max_concurrency),
            ("max_num_seqs", e.max_num_seqs)) if value is not None]
        rows.append(("engine", "; ".join(parts)))
    rows += [("python", env.python), ("platform", env.platform), ("host", env.hostname),
             ("git", env.git_hash or ""), ("torch threads", str(env.torch_threads or "")),
             ("packages", ", ".join(f"{k} {v}" for k, v in sorted(env.packages.items()))),
             ("command", " ".join(env.command_line)),
             ("predicted" if p.kind == "predicted" else "measured", f"{env.started_at} to {env.updated_at or ''}")]
    rows += [("note", n) for n in p.notes]
    return pd.DataFrame(rows, columns=["item", "value"])
