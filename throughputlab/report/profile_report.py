"""The report of one or more profiles: sections of figures (report/figures.py, report/attention.py),
tables (report/tables.py) and notes, rendered by report/page.py. The entry point: it hands the
profiles down to those modules, which share only the leaves labels.py and plotting.py (and page.py)
and never call one another, so the flow never returns to a module it has left.

One color per profile (its prompt lengths in shades of it); several profiles are overlaid on the
same axes (two GPUs, two models, vllm against hf). A profile's stored fit is shown; a profile without one is fitted with
`throughputlab fit`'s defaults, and the page says so. No torch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional, Sequence

from throughputlab.errors import UserError
from throughputlab.fit.load import load_or_fit
from throughputlab.fit.schema import FitResult, micro_batch_statement
from throughputlab.records.profile import Profile
from throughputlab.report.attention import attention_figure, attention_notes, attention_table
from throughputlab.report.figures import generation_figure, step_figure, training_figure
from throughputlab.report.labels import COLORS, contexts_of, kv_concurrency, profile_label
from throughputlab.report.page import Section, render_html
from throughputlab.report.tables import environment_table, fit_tables, points_tables

log = logging.getLogger(__name__)


def _fit_of(p: Profile, notes: list[str]) -> Optional[FitResult]:
    said: list[str] = []
    try:
        fit = load_or_fit(p, said=said)
    except UserError as e:
        notes.append(f"{profile_label(p)}: no fit ({e})")
        return None
    notes.extend(f"{profile_label(p)}: {s}" for s in said)
    return fit




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
        groups = contexts_of(g for g in p.generation if g.status == "ok")
        if groups:  # at the longest context, the one the cache binds first
            seq_tokens = max(pl + ol for pl, ol, _ in groups)
            kv_c = kv_concurrency(p, fit.model if fit else None, seq_tokens)
            if kv_c is not None:
                parts.append(f"KV cache holds {kv_c:,.0f} sequences of {seq_tokens} tokens")
        mb = micro_batch_statement(fit) if fit else None
        if mb:
            parts.append(mb)
        summary.notes.append("; ".join(parts))
    summary.notes.extend(warnings)
    sections.append(summary)
    if any(p.generation for p in profiles):
        notes = ["Markers: measured medians, bars from the fastest to the slowest repeat (a predicted profile's "
                 "markers are the model's own points, without bars). "
                 "Solid: the fitted model (end to end, prefill included). Dotted and dashed: the "
                 "decode roofline asymptotes (memory slope, compute ceiling); dash-dot: the decode knee; long dash-dot: "
                 "the end-to-end knee, where prefill compute is counted too."]
        if any(len(contexts_of(g for g in p.generation if g.status == "ok")) > 1 for p in profiles):
            notes.append("A profile measured at several prompt lengths has one marker set and one fitted curve per "
                         "prompt length (darker: shorter), the model evaluated at each one's mean context; its "
                         "asymptotes and knees are left out of the plot (the knee is stated in the Fit section).")
        sections.append(Section("Generation", anchor="generation", notes=notes,
                                figures=[generation_figure(items), step_figure(items)]))
        att = Section("Attention share of the decode step", anchor="attention",
                      notes=["The attention's time (its KV reads or its FLOPs, whichever bounds it) over the whole "
                             "decode step, from the throughput model, at each measured prompt length (solid) and at "
                             "longer ones (dashed, predicted: outside the measured contexts). With one measured context "
                             "the attention's own rates are not identified and what stands in for them is used."],
                      figures=[attention_figure(items)])
        for p, fit, _ in items:
            att.notes.extend(attention_notes(p, fit))
            table = attention_table(p, fit)
            if table is not None:
                att.tables.append(table)
        sections.append(att)
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


def tell_apart(profiles: Sequence[Profile], paths: Sequence) -> list[Profile]:
    """Profiles whose labels would be the same (one model, device and backend measured twice) get
    their file's name beside the model's, so an overlay's curves and tables can be told apart."""
    labels = [profile_label(p) for p in profiles]
    stems = [Path(x).stem for x in paths]
    out = []
    for p, label, path, stem in zip(profiles, labels, paths, stems):
        if labels.count(label) > 1:
            tag = stem if stems.count(stem) == 1 else str(path)
            p = p.model_copy(update={"model": p.model.model_copy(update={"name": f"{p.model.name} [{tag}]"})})
        out.append(p)
    return out


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
