"""`throughputlab import`: other tools' results into a profile, RL run logs into phase times.

Each subcommand parses options, calls one function of throughputlab.imports, saves, prints.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import click

from throughputlab.commands.options import check_writable, default_profile_name
from throughputlab.errors import UserError


def _target_options(f):
    f = click.option("--force", is_flag=True, help="Overwrite an existing --output.")(f)
    f = click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Profile to write [default: profile-MODEL-GPU-TIME.json].")(f)
    f = click.option("--tp", type=int, default=1, show_default=True,
                     help="Devices of one engine (tensor parallel size) the numbers were measured with.")(f)
    f = click.option("--dtype", default="bfloat16", show_default=True, help="Weights and compute dtype of the runs.")(f)
    f = click.option("--gpu", required=True, help="The device, by its datasheet name (h100, a100 80gb, l4...).")(f)
    f = click.option("--model", "-m", required=True,
                     help="The model: a preset, a folder with config.json or a hub id (weights are not loaded).")(f)
    return f


def _output_path(output: Optional[Path], model: str, gpu_name: str, force: bool) -> Path:
    out = output or default_profile_name(model, gpu_name.replace(" ", "-"))
    if out.exists() and not force:
        raise UserError(f"--output {out} exists; pass --force to overwrite it")
    check_writable(out)
    return out


def _save_and_print(prof, out: Path) -> None:
    from throughputlab.records.profile import percentiles

    prof.save(out)
    click.echo(f"{prof.model.name} on {prof.hardware.device_name} ({prof.settings.dtype}), "
               f"{prof.settings.gen_backend}: {len(prof.generation)} point(s)")
    click.echo(f"{'concurrency':>11} {'prompt':>7} {'output':>7} {'runs':>5} {'tokens/s':>10} "
               f"{'TTFT p50 ms':>12} {'ITL p50 ms':>11}  status")
    for p in prof.generation:
        ttft = percentiles([x for s in p.samples for x in s.ttft_s])
        itl = percentiles([x for s in p.samples for x in s.itl_s])
        tps = f"{p.tokens_per_s:,.1f}" if p.tokens_per_s else "-"
        click.echo(f"{p.concurrency:>11} {p.prompt_len:>7} {p.output_len:>7} {len(p.samples):>5} {tps:>10} "
                   f"{_ms(ttft):>12} {_ms(itl):>11}  {p.status}{': ' + p.error if p.error else ''}")
    click.echo(f"wrote {out}; next: throughputlab fit {out}, then throughputlab report {out} -o report.html")


def _ms(q) -> str:
    return f"{q['p50'] * 1e3:.1f}" if q else "-"


@click.group(name="import")
def import_group() -> None:
    """Bring your own numbers: other benchmarks' results as a profile, RL run logs as phase times.

    \b
      throughputlab import vllm-bench sweep-dir/ --model qwen2.5-7b --gpu h100 -o q7.json
      throughputlab import guidellm benchmarks.json --model qwen2.5-7b --gpu h100 -o q7.json
      throughputlab import runlog verl-metrics.jsonl
    """


@import_group.command(name="vllm-bench", context_settings={"show_default": True})
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@_target_options
@click.option("--output-len", type=int, default=None,
              help="vllm bench throughput files only: the run's --output-len (its JSON counts prompt and output "
                   "tokens together).")
@click.option("--max-num-seqs", type=int, default=None,
              help="vllm bench throughput files only: the engine's max_num_seqs (caps the concurrency).")
def vllm_bench(paths, model, gpu, dtype, tp, output, force, output_len, max_num_seqs) -> None:
    """vllm bench serve --save-result JSONs, a vllm bench sweep serve folder, or vllm bench throughput JSON.

    \b
    One run is one sample with its real totals (duration, total_output_tokens); runs at the same
    max_concurrency and mean lengths are one point. --save-detailed files add per-request TTFT and
    ITL; the summary latencies go into the profile's notes.
    """
    from throughputlab.imports.common import resolve_target
    from throughputlab.imports.vllm_bench import load_vllm_bench

    target = resolve_target(model, gpu, dtype, tp)
    out = _output_path(output, model, target.datasheet.device, force)
    prof = load_vllm_bench(list(paths), target, output_len=output_len, max_num_seqs=max_num_seqs,
                           command_line=["throughputlab", *sys.argv[1:]])
    _save_and_print(prof, out)


@import_group.command(name="guidellm", context_settings={"show_default": True})
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@_target_options
def guidellm(paths, model, gpu, dtype, tp, output, force) -> None:
    """GuideLLM benchmarks.json reports (or folders holding one).

    \b
    Concurrency per benchmark: the strategy's streams (concurrent), 1 (synchronous), else the
    measured mean request concurrency (throughput, constant, poisson), as the notes say.
    """
    from throughputlab.imports.common import resolve_target
    from throughputlab.imports.guidellm import load_guidellm

    target = resolve_target(model, gpu, dtype, tp)
    out = _output_path(output, model, target.datasheet.device, force)
    prof = load_guidellm(list(paths), target, command_line=["throughputlab", *sys.argv[1:]])
    _save_and_print(prof, out)


@import_group.command(name="runlog")
@click.argument("log", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["verl", "trl", "csv"]), default=None,
              help="The log's format [default: from the file].")
@click.option("--column", "columns", multiple=True, metavar="NAME=KEY",
              help="Read phase or quantity NAME from column/key KEY (repeatable): gen=my_gen_time, "
                   "step_index=iteration.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the summary and every step as JSON.")
def runlog(log: Path, fmt: Optional[str], columns: tuple[str, ...], json_path: Optional[Path]) -> None:
    """An RL run log (veRL file logger, TRL trainer_state.json, CSV): per-phase median seconds and spread.

    \b
    Phases: gen, logprob, ref, values, update_critic, update_actor, sync (weights to the rollout
    engine), step; with p10/p90 over steps and the number of steps, and the response lengths.
    """
    from throughputlab.imports.runlog import load_run_log

    renames = {}
    for item in columns:
        name, sep, key = item.partition("=")
        if not sep:
            raise UserError(f"--column expects NAME=KEY, got {item!r}")
        renames[name.strip()] = key.strip()
    if json_path is not None:
        check_writable(json_path, "--json")
    rl = load_run_log(log, fmt, renames)
    phases = rl.phase_summary()
    step = phases.get("step")
    click.echo(f"{log}: {rl.format}, {len(rl.steps)} step(s)"
               + (f", {rl.skipped} record(s) without phase times skipped" if rl.skipped else "")
               + (f", {rl.duplicates} repeated step(s) replaced by the later record" if rl.duplicates else ""))
    click.echo(f"{'phase':<14} {'key':<26} {'steps':>5} {'median s':>9} {'p10 s':>8} {'p90 s':>8} {'of step':>8}")
    for name, s in phases.items():
        share = f"{100 * s.median / step.median:.0f}%" if step and step.median > 0 and name != "step" else ""
        click.echo(f"{name:<14} {rl.keys.get(name, ''):<26} {s.n:>5} {s.median:>9.3f} {s.p10:>8.3f} {s.p90:>8.3f} "
                   f"{share:>8}")
    lengths = rl.response_length_summary()
    if lengths:
        click.echo(f"response length (per-step mean, tokens): median {lengths.median:.1f}, p10 {lengths.p10:.1f}, "
                   f"p90 {lengths.p90:.1f} over {lengths.n} step(s)")
    for name, s in rl.extra_summary().items():
        click.echo(f"{name}: median {s.median:.4g} (p10 {s.p10:.4g}, p90 {s.p90:.4g}, max {s.max:.4g}) "
                   f"over {s.n} step(s)")
    if json_path is not None:
        doc = {"phases": {k: v.model_dump() for k, v in phases.items()},
               "response_length": lengths.model_dump() if lengths else None,
               "extra": {k: v.model_dump() for k, v in rl.extra_summary().items()},
               "log": rl.model_dump()}
        try:
            json_path.write_text(json.dumps(doc, indent=1), encoding="utf-8")
        except OSError as e:
            raise UserError(f"cannot write --json {json_path}: {e.strerror or e}") from None
        click.echo(f"wrote {json_path}")
