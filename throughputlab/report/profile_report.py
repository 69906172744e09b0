"""The report of one or more profiles: figures, tables and notes, rendered by report/page.py.

One color per profile; several profiles are overlaid on the same axes (two GPUs, two models,
vllm against hf). Every string that comes from a profile and goes into a plotly figure is
HTML-escaped here (plotly renders a subset of HTML in names and titles); tables and notes are
escaped by page.py. No torch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from throughputlab.errors import UserError
from throughputlab.fit import FitResult, fit_profile, generation_knee, load_fit
from throughputlab.profile import Profile
from throughputlab.report.page import Section, esc, render_html

log = logging.getLogger(__name__)

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
GiB = 2**30


def _t(text: str) -> str:
    """Text for a plotly figure: escaped, so a name holding markup is shown, never interpreted.

    Only &, < and > are replaced: plotly parses tags only after '<', and shows &quot; literally."""
    return esc(str(text), quote=False)


def profile_label(p: Profile) -> str:
    if p.kind == "predicted":
        return f"{p.model.name} on {p.hardware.device_name} (predicted)"
    backend = p.settings.gen_backend or p.settings.train_backend or ""
    return f"{p.model.name} on {p.hardware.device_name}" + (f", {backend}" if backend else "")


def _fit_of(p: Profile, warnings: list[str]) -> Optional[FitResult]:
    fit = load_fit(p)
    if fit is not None:
        return fit
    try:
        return fit_profile(p)
    except UserError as e:
        warnings.append(f"{profile_label(p)}: no fit ({e})")
        return None


# ---------------------------------------------------------------- figures


def _layout(fig, title: str, xtitle: str, ytitle: str, logx=True, logy=True):
    fig.update_layout(title=_t(title), template="plotly_white", height=480, margin=dict(l=60, r=20, t=60, b=50),
                      legend=dict(orientation="h", yanchor="top", y=-0.15, font=dict(size=11)))
    fig.update_xaxes(title_text=_t(xtitle), type="log" if logx else "linear")
    fig.update_yaxes(title_text=_t(ytitle), type="log" if logy else "linear")
    return fig


def _spread(samples: list[float], med: float) -> tuple[float, float]:
    return (max(samples) - med, med - min(samples)) if samples else (0.0, 0.0)


def _grid(lo: float, hi: float, n: int = 80) -> np.ndarray:
    return np.unique(np.round(np.geomspace(max(lo, 1), max(hi, lo + 1), n), 3))


def _vline(fig, x: float, y0: float, y1: float, name: str, color: str, dash="dot", **kw):
    import plotly.graph_objects as go

    fig.add_trace(go.Scatter(x=[x, x], y=[y0, y1], mode="lines", name=_t(name), line=dict(color=color, dash=dash, width=1.5),
                             hovertemplate=f"{_t(name)}: %{{x:.3g}}<extra></extra>"), **kw)


def _hline(fig, y: float, x0: float, x1: float, name: str, color: str, dash="dot", **kw):
    import plotly.graph_objects as go

    fig.add_trace(go.Scatter(x=[x0, x1], y=[y, y], mode="lines", name=_t(name), line=dict(color=color, dash=dash, width=1.5),
                             hovertemplate=f"{_t(name)}: %{{y:.4g}}<extra></extra>"), **kw)


def generation_figure(items: list[tuple[Profile, Optional[FitResult], str]]):
    """Tokens/s against concurrency: medians with spread, fitted curve, knee, the two asymptotes."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for p, fit, color in items:
        label = profile_label(p)
        ok = sorted((g for g in p.generation if g.status == "ok" and g.tokens_per_s), key=lambda g: g.concurrency)
        if not ok:
            continue
        meds = [g.tokens_per_s for g in ok]
        up, down = zip(*(_spread(g.tokens_per_s_samples, g.tokens_per_s) for g in ok))
        predicted = p.kind == "predicted"
        fig.add_trace(go.Scatter(
            x=[g.concurrency for g in ok], y=meds, mode="markers", name=_t(f"{label}: {'predicted' if predicted else 'measured median'}"),
            marker=dict(color=color, size=9, symbol="circle-open" if predicted else "circle"),
            error_y=dict(type="data", symmetric=False, array=list(up), arrayminus=list(down), visible=not predicted),
            hovertemplate="concurrency %{x}<br>%{y:.4g} tokens/s<extra></extra>"))
        if fit is None or fit.model.decode is None:
            continue
        m = fit.model
        prompt_len, output_len = ok[0].prompt_len, ok[0].output_len
        s = prompt_len + output_len / 2
        c_max = max(g.concurrency for g in ok)
        knee = m.knee(s)
        hi = max(c_max * 2, (knee or 0) * 2)
        cs = _grid(1, hi)
        fig.add_trace(go.Scatter(x=cs, y=[m.generation_tokens_per_s(c, prompt_len, output_len) for c in cs], mode="lines",
                                 name=_t(f"{label}: {fit.method} model"), line=dict(color=color, width=2),
                                 hovertemplate="concurrency %{x:.3g}<br>%{y:.4g} tokens/s<extra></extra>"))
        d, k = m.decode, m.costs
        mem = [c * d.bw_bytes_per_s / (k.weight_bytes_for(c) + c * s * k.kv_bytes_per_token) for c in cs]
        # large c: each sequence costs its FLOPs plus the per-sequence cost (0 without an overhead probe)
        ceiling = 1.0 / ((k.flops_per_token + s * k.attn_flops_per_ctx_token) / d.phi_flops_per_s + d.t_seq_s)
        fig.add_trace(go.Scatter(x=cs, y=mem, mode="lines", name=_t(f"{label}: memory roofline c*BW/(W+c*s*k)"),
                                 line=dict(color=color, dash="dot", width=1)))
        _hline(fig, ceiling, cs[0], cs[-1], f"{label}: compute ceiling " + ("1/((F+s*a)/PHI + t_seq)" if d.t_seq_s else "PHI/(F+s*a)"), color, dash="dash")
        if knee is not None:
            _vline(fig, knee, min(meds) / 2, ceiling * 1.2, f"{label}: decode knee c*={knee:.3g}", color, dash="dashdot")
        e2e = generation_knee(m, prompt_len, output_len)
        if e2e is not None and e2e < hi:
            _vline(fig, e2e, min(meds) / 2, ceiling * 1.2, f"{label}: end-to-end knee (prefill included) {e2e:.3g}",
                   color, dash="longdashdot")
    return _layout(fig, "Generation tokens/s against concurrency", "concurrency (sequences)", "output tokens/s")


def step_figure(items: list[tuple[Profile, Optional[FitResult], str]]):
    """Decode step and prefill time against concurrency, with the KV-cache capacity limit."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for p, fit, color in items:
        label = profile_label(p)
        ok = sorted((g for g in p.generation if g.status == "ok"), key=lambda g: g.concurrency)
        if not ok:
            continue
        dec = [(g.concurrency, g.decode_step_s) for g in ok if g.decode_step_s]
        pre = [(g.concurrency, g.prefill_s) for g in ok if g.prefill_s]
        if dec:
            fig.add_trace(go.Scatter(x=[c for c, _ in dec], y=[t * 1e3 for _, t in dec], mode="markers",
                                     name=_t(f"{label}: decode step"), marker=dict(color=color, size=9)))
        if pre:
            fig.add_trace(go.Scatter(x=[c for c, _ in pre], y=[t * 1e3 for _, t in pre], mode="markers",
                                     name=_t(f"{label}: prefill"), marker=dict(color=color, size=9, symbol="diamond-open")))
        ys = [t * 1e3 for _, t in dec + pre] or [1.0]
        prompt_len, output_len = ok[0].prompt_len, ok[0].output_len
        c_hi = max(g.concurrency for g in ok) * 2
        m = fit.model if fit else None
        if m is not None and m.decode is not None:
            cs = _grid(1, c_hi)
            s = prompt_len + output_len / 2
            fig.add_trace(go.Scatter(x=cs, y=[m.decode_step_s(c, s) * 1e3 for c in cs], mode="lines",
                                     name=_t(f"{label}: decode step ({fit.method})"), line=dict(color=color, width=2)))
            fig.add_trace(go.Scatter(x=cs, y=[m.prefill_s(c, prompt_len) * 1e3 for c in cs], mode="lines",
                                     name=_t(f"{label}: prefill ({fit.method})"), line=dict(color=color, width=1.5, dash="dash")))
        probe = fit.generation.probe_points if fit is not None and fit.generation is not None else []
        if probe:  # the overhead probe: what a step costs apart from the weights and the matmuls
            fig.add_trace(go.Scatter(x=[q.x for q in probe], y=[q.measured_s * 1e3 for q in probe], mode="markers",
                                     name=_t(f"{label}: overhead probe step"), marker=dict(color=color, size=7, symbol="x")))
            fig.add_trace(go.Scatter(x=[q.x for q in probe], y=[q.fitted_s * 1e3 for q in probe], mode="lines",
                                     name=_t(f"{label}: overhead probe step (fit)"), line=dict(color=color, width=1, dash="dot")))
        kv_c = _kv_concurrency(p, m, prompt_len + output_len)
        if kv_c is not None and kv_c <= 8 * c_hi:  # further out it only squashes the plot; the table states it
            _vline(fig, kv_c, min(ys) / 2, max(ys) * 2, f"{label}: KV-cache capacity ({kv_c:.4g} sequences)", color,
                   dash="longdash")
    return _layout(fig, "Decode step and prefill time", "concurrency (sequences)", "time (ms)")


def _kv_concurrency(p: Profile, m, seq_tokens: int) -> Optional[float]:
    e = p.engine
    if e is not None and e.max_concurrency:
        return float(e.max_concurrency)
    tokens = (e.kv_cache_tokens if e is not None else None) or (m.kv_cache_tokens if m is not None else None)
    return tokens / seq_tokens if tokens else None


def training_figure(items: list[tuple[Profile, Optional[FitResult], str]]):
    """Training tokens/s and peak memory against micro-batch, memory limit and largest micro-batch."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for p, fit, color in items:
        label = profile_label(p)
        ok = sorted((t for t in p.training if t.status == "ok" and t.tokens_per_s), key=lambda t: t.micro_batch)
        if not ok:
            continue
        meds = [t.tokens_per_s for t in ok]
        up, down = zip(*(_spread(t.tokens_per_s_samples, t.tokens_per_s) for t in ok))
        fig.add_trace(go.Scatter(x=[t.micro_batch for t in ok], y=meds, mode="markers",
                                 name=_t(f"{label}: tokens/s"), marker=dict(color=color, size=9),
                                 error_y=dict(type="data", symmetric=False, array=list(up), arrayminus=list(down))),
                      secondary_y=False)
        mem_pts = [(t.micro_batch, t.peak_mem_bytes / GiB) for t in ok if t.peak_mem_bytes]
        if mem_pts:
            fig.add_trace(go.Scatter(x=[b for b, _ in mem_pts], y=[g for _, g in mem_pts], mode="markers",
                                     name=_t(f"{label}: peak memory"), marker=dict(color=color, size=8, symbol="square-open")),
                          secondary_y=True)
        m = fit.model if fit else None
        if m is None or m.train is None:
            continue
        seq = ok[0].seq_len
        max_b = m.max_micro_batch()
        b_hi = max(max(t.micro_batch for t in ok) * 2, min(max_b or 0, 4096))
        bs = _grid(1, b_hi)
        fig.add_trace(go.Scatter(x=bs, y=[m.train_tokens_per_s(b, seq) for b in bs], mode="lines",
                                 name=_t(f"{label}: tokens/s ({fit.method})"), line=dict(color=color, width=2)),
                      secondary_y=False)
        t = m.train
        if t.mem0_bytes is not None and t.mem_per_sample_bytes:
            fig.add_trace(go.Scatter(x=bs, y=[(t.mem0_bytes + b * t.mem_per_sample_bytes) / GiB for b in bs], mode="lines",
                                     name=_t(f"{label}: memory line M0+b*m"), line=dict(color=color, width=1.5, dash="dash")),
                          secondary_y=True)
        if t.device_memory_bytes:
            _hline(fig, t.device_memory_bytes / GiB, bs[0], bs[-1], f"{label}: device memory", color, dash="dot",
                   secondary_y=True)
        if max_b:
            _vline(fig, max_b, min(meds) / 2, max(meds) * 1.5, f"{label}: largest micro-batch that fits ({max_b})", color,
                   dash="dashdot", secondary_y=False)
    fig.update_yaxes(title_text="training tokens/s", type="log", secondary_y=False)
    fig.update_yaxes(title_text="peak memory (GiB)", type="linear", secondary_y=True, rangemode="tozero")
    fig.update_layout(title=_t("Training tokens/s and peak memory against micro-batch"), template="plotly_white",
                      height=480, margin=dict(l=60, r=60, t=60, b=50),
                      legend=dict(orientation="h", yanchor="top", y=-0.15, font=dict(size=11)))
    fig.update_xaxes(title_text="micro-batch (sequences)", type="log")
    return fig


# ---------------------------------------------------------------- tables


def _n(x: Optional[float]) -> Optional[str]:
    """Readable number: thousands separated, three significant figures below 100."""
    if x is None:
        return None
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _pct(x: Optional[float]) -> Optional[str]:
    return None if x is None else f"{100 * x:.1f}%"


def _telemetry(point) -> str:
    t = point.telemetry
    if t is None:
        return ""
    keys = list(t.mean)[:5]
    parts = [f"{k} {t.mean[k]:.3g}/{t.max.get(k, float('nan')):.3g}" for k in keys]
    s = f"{t.source}, {t.n_samples} samples (mean/max): " + ", ".join(parts)
    if t.throttled:
        s += "; throttled: " + ", ".join(t.throttle_reasons)
    return s


def points_tables(p: Profile, fit: Optional[FitResult]) -> list[tuple[str, pd.DataFrame]]:
    label = profile_label(p)
    util = {(u.phase, u.x): u for u in (fit.utilisation if fit else [])}
    own = fit is not None and p.kind == "measured"  # a prediction's stored errors belong to the measured profile
    loo = {pt.x: pt for pt in (fit.generation.points if own and fit.generation else [])}
    rows = []
    for g in sorted(p.generation, key=lambda g: g.concurrency):
        u = util.get(("decode", g.concurrency))
        e = loo.get(g.concurrency)
        rows.append({
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
    tloo = {pt.x: pt for pt in (fit.training.points if own and fit.training else [])}
    rows = []
    for t in sorted(p.training, key=lambda t: t.micro_batch):
        u = util.get(("train", t.micro_batch))
        e = tloo.get(t.micro_batch)
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
        add("decode", g.params)
        notes.append(f"{label}: {g.knee_note}")
        if g.generation_knee_note:
            notes.append(f"{label}: {g.generation_knee_note}")
        if g.n_points:
            forms = ", ".join(f"{k} {_pct(v) or 'n/a'}" for k, v in g.form_loo_mean_abs_error.items())
            notes.append(f"{label}: decode form '{g.form}' (fitted to {g.target}); mean held-out error by form: {forms}; "
                         f"largest held-out tokens/s error {_pct(g.loo_max_abs_error) or 'n/a'}")
    if fit.prefill is not None:
        add("prefill", fit.prefill.params)
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
            notes.append(f"{label}: largest micro-batch that fits in "
                         f"{_fmt((mem.device_memory_bytes or 0) / GiB, 'GiB')}: {mem.max_micro_batch}")
    elif fit.model.train is not None and fit.model.max_micro_batch() is not None:
        notes.append(f"{label}: largest micro-batch that fits: {fit.model.max_micro_batch()}")
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
    rows = [("kind", p.kind), ("model", p.model.name), ("parameters (total / active)",
                                                         f"{p.model.params_total:,} / {p.model.params_active:,}"),
            ("device", f"{hw.device_type}: {hw.device_name}"), ("device memory", _fmt((hw.memory_total_bytes or 0) / GiB, "GiB")),
            ("dtype", st.dtype), ("backends", f"{st.gen_backend or '-'} / {st.train_backend or '-'}"),
            ("lengths", f"prompt {st.prompt_len}, output {st.output_len}, training seq {st.seq_len}"),
            ("repeats", f"{st.rounds} round(s) x {st.repeats} (warm-up {st.warmup}, max cv {st.max_cv})")]
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
        rows.append(("engine", f"{e.name} {e.version or ''}; KV cache {e.kv_cache_tokens} tokens; "
                               f"max concurrency {e.max_concurrency}; max_num_seqs {e.max_num_seqs}"))
    rows += [("python", env.python), ("platform", env.platform), ("host", env.hostname),
             ("git", env.git_hash or ""), ("torch threads", str(env.torch_threads or "")),
             ("packages", ", ".join(f"{k} {v}" for k, v in sorted(env.packages.items()))),
             ("command", " ".join(env.command_line)), ("measured", f"{env.started_at} to {env.updated_at or ''}")]
    rows += [("note", n) for n in p.notes]
    return pd.DataFrame(rows, columns=["item", "value"])


# ---------------------------------------------------------------- page


def build_sections(profiles: Sequence[Profile]) -> list[Section]:
    if not profiles:
        raise UserError("report: give at least one profile")
    warnings: list[str] = []
    items = [(p, _fit_of(p, warnings), COLORS[i % len(COLORS)]) for i, p in enumerate(profiles)]
    sections = []
    summary = Section("Summary", anchor="summary")
    for p, fit, _ in items:
        parts = [profile_label(p)]
        if fit and fit.generation:
            parts.append(fit.generation.knee_note)
            if fit.generation.generation_knee_note:
                parts.append(fit.generation.generation_knee_note)
        gp = [g for g in p.generation if g.status == "ok"]
        if gp:
            kv_c = _kv_concurrency(p, fit.model if fit else None, gp[0].prompt_len + gp[0].output_len)
            if kv_c is not None:
                parts.append(f"KV cache holds {kv_c:,.0f} sequences of {gp[0].prompt_len + gp[0].output_len} tokens")
        mb = fit.model.max_micro_batch() if fit and fit.model.train else None
        if mb is not None:
            parts.append(f"largest micro-batch that fits: {mb}")
        summary.notes.append("; ".join(parts))
    summary.notes.extend(warnings)
    sections.append(summary)
    if any(p.generation for p in profiles):
        sections.append(Section("Generation", anchor="generation",
                                notes=["Markers: measured medians, bars from the fastest to the slowest repeat. "
                                       "Solid: the fitted model (end to end, prefill included). Dotted and dashed: the "
                                       "decode roofline asymptotes (memory slope, compute ceiling); dash-dot: the decode knee; long dash-dot: "
                                       "the end-to-end knee, where prefill compute is counted too."],
                                figures=[generation_figure(items), step_figure(items)]))
    if any(p.training for p in profiles):
        sections.append(Section("Training", anchor="training", figures=[training_figure(items)]))
    pts = Section("Points", anchor="points",
                  notes=["MBU/MFU: achieved bytes/s and FLOP/s of the decode step (generation) or micro-step "
                         "(training) over the datasheet peak and the probe's micro-benchmark. Held-out error: the "
                         "point's tokens/s predicted by a fit without it."])
    for p, fit, _ in items:
        pts.tables.extend(points_tables(p, fit))
    sections.append(pts)
    fs = Section("Fit", anchor="fit")
    for p, fit, _ in items:
        if fit is None:
            continue
        notes, tables = fit_tables(p, fit)
        fs.notes.extend(notes)
        fs.tables.extend(tables)
    sections.append(fs)
    envs = Section("Environment", anchor="environment")
    for p, _, _ in items:
        envs.tables.append((profile_label(p), environment_table(p)))
    sections.append(envs)
    return sections


def render_report(profiles: Sequence[Profile], title: Optional[str] = None) -> str:
    labels = [profile_label(p) for p in profiles]
    title = title or ("throughputlab report: " + ("; ".join(labels) if len(labels) <= 3 else f"{len(labels)} profiles"))
    sub = "Generation and training throughput, the fitted roofline model and its held-out errors."
    return render_html(title, build_sections(profiles), subtitle=sub)


def write_report(profiles: Sequence[Profile], path) -> None:
    """Write the one-file offline HTML report of ``profiles`` (the hook ``bench --report`` calls)."""
    html = render_report(list(profiles))
    path = Path(path)
    try:
        if str(path.parent):
            path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html, encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot write report {path}: {e.strerror or e}; choose another -o") from None
