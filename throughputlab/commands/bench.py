"""`throughputlab bench`: parse options, build a BenchSpec, run it with a progress bar, print a summary."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import click

from throughputlab.commands.options import IntList, check_writable, default_profile_name, parse_engine_args


@click.command(context_settings={"show_default": True})
@click.option("--model", "-m", default="demo",
              help="Preset name (see `throughputlab models`), a Hugging Face model folder, or a hub id (org/name).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Profile JSON to write. Default: profile-MODEL-DEVICE-TIME.json in the current folder.")
@click.option("--only", type=click.Choice(["gen", "train"]), default=None, help="Measure only generation or training.")
@click.option("--backend", "gen_backend", type=click.Choice(["hf", "vllm", "openai"]), default="hf",
              help="Generation backend: hf (transformers loop), vllm (offline engine), openai (an endpoint).")
@click.option("--train-backend", type=click.Choice(["torch"]), default="torch", help="Training backend.")
@click.option("--concurrency", "-c", type=IntList(allow_auto=True), default="1,2,4,8,16,32,64,128",
              help="Generation concurrencies (sequences decoded together), or `auto` (double until tokens/s stops growing).")
@click.option("--batch-sizes", "-b", type=IntList(allow_auto=True), default="1,2,4,8",
              help="Training micro-batch sizes, or `auto` (double until tokens/s stops growing or memory runs out).")
@click.option("--prompt-len", type=int, default=64, help="Synthetic prompt tokens per sequence.")
@click.option("--output-len", type=int, default=32, help="New tokens per sequence (EOS ignored).")
@click.option("--seq-len", type=int, default=128, help="Tokens per training sequence.")
@click.option("--dtype", default="auto", help="auto (bfloat16 on GPU and on CPUs with native bf16, else float32), bfloat16, float16, float32.")
@click.option("--device", default="auto", help="auto, cpu, cuda or cuda:N.")
@click.option("--warmup", type=int, default=1, help="Untimed runs before each point.")
@click.option("--repeats", type=int, default=1, help="Timed runs per point in each round (every sample is kept).")
@click.option("--rounds", type=int, default=3,
              help="Passes over the sweep, each adding --repeats timed runs to every point: a slow spell of the "
                   "machine then costs one sample of many points, not every sample of a few, and the point's "
                   "median ignores it. --rounds 1 --repeats 3 measures each point in one go.")
@click.option("--max-cv", type=float, default=0.10,
              help="While some point's tokens/s spread (stdev/mean) is above this after the last round, run one "
                   "more round over all points (with --rounds 1: measure that point again at once).")
@click.option("--max-remeasure", type=int, default=2,
              help="At most this many extra rounds (with --rounds 1: re-measurements of a noisy point).")
@click.option("--auto-cap", type=int, default=1024, help="Largest value an `auto` sweep tries.")
@click.option("--resume", is_flag=True, help="Continue an interrupted profile (--output): finished points are not re-measured.")
@click.option("--force", is_flag=True, help="Overwrite --output if it exists.")
@click.option("--random-weights", is_flag=True, help="Random weights for a model folder or hub id (presets always use them).")
@click.option("--trust-remote-code", is_flag=True, help="Allow a model folder/hub id to run its own Python code (off by default).")
@click.option("--engine-arg", "engine_args", multiple=True, metavar="KEY=VALUE",
              help="Pass an option to the vLLM engine, e.g. --engine-arg gpu_memory_utilization=0.8 (repeatable).")
@click.option("--url", default=None, help="Base URL of an OpenAI-compatible server, for --backend openai.")
@click.option("--served-model", default=None, help="Model name the server expects (--backend openai).")
@click.option("--telemetry/--no-telemetry", default=True, help="Sample GPU (pynvml) or CPU/RSS telemetry during each point.")
@click.option("--telemetry-hz", type=float, default=20.0, help="Telemetry sampling rate.")
@click.option("--py-spy", "py_spy", is_flag=True, help="Record py-spy flame graphs of the host processes during points.")
@click.option("--py-spy-points", type=IntList(), default=None,
              help="Only these concurrencies/micro-batches are profiled with --py-spy (default: all).")
@click.option("--effective-lr", "track_effective_lr", is_flag=True,
              help="Record ||dW||/||W|| per parameter group in training points.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the HTML report here at the end.")
@click.option("--seed", type=int, default=0, help="Seed for weights and synthetic tokens.")
@click.option("--allocator", type=click.Choice(["auto", "system"]), default="auto", show_default=True,
              help="auto: on CPU, run the hf/torch backends under tcmalloc or jemalloc when the system has one "
                   "(LD_PRELOAD, as vLLM's and PyTorch's CPU guides recommend; glibc malloc faults large blocks in "
                   "again at every step, 15-25%% of a CPU training step). system: keep the process's allocator. "
                   "The profile records which one ran.")
def bench(output: Optional[Path], report_path: Optional[Path], engine_args: tuple[str, ...], allocator: str,
          **kw) -> None:
    """Measure generation tokens/s against concurrency and training tokens/s against micro-batch.

    Writes a profile (JSON) after every point, so Ctrl-C or a crash keeps what was measured;
    re-run with --resume -o PROFILE to finish. Presets use random weights: throughput does
    not depend on the weight values.

    \b
    Examples:
      throughputlab bench                                   # demo model, both sweeps (~3 min on 2 CPU cores)
      throughputlab bench -m qwen2.5-1.5b -c 1,8,64,256 -o q15.json
      throughputlab bench -m tiny --only train -b auto
      throughputlab bench -m tiny --backend vllm --only gen --engine-arg enforce_eager=true
    """
    from throughputlab.commands import allocator as alloc

    alloc.maybe_reexec(allocator, kw["device"], in_process_only=kw["gen_backend"] == "hf" or kw["only"] == "train")
    from throughputlab.bench import BenchSpec, run_bench

    spec = BenchSpec(engine_args=parse_engine_args(engine_args), command_line=["throughputlab", *sys.argv[1:]],
                     py_spy_points=kw.pop("py_spy_points") or [], **kw)
    spec.output = output or default_profile_name(spec.model, kw["device"])
    check_writable(spec.output)
    if report_path is not None:
        check_writable(report_path, "--report")
    console = _console()
    console.print(f"[bold]throughputlab bench[/]: model {spec.model}, profile -> {spec.output}", highlight=False)
    hooks = RichHooks(console)
    try:
        with hooks:
            profile = run_bench(spec, hooks)
    except KeyboardInterrupt:
        console.print(f"\ninterrupted: finished points are in {spec.output}; "
                      f"continue with: throughputlab bench ... --resume -o {spec.output}", highlight=False)
        raise SystemExit(130)
    print_summary(console, profile)
    console.print(f"profile written to {spec.output}", highlight=False)
    if report_path is not None:
        from throughputlab.report.profile_report import write_report

        write_report([profile], report_path)
        console.print(f"report written to {report_path}", highlight=False)


def _console():
    from rich.console import Console

    return Console(stderr=False, highlight=False)


class RichHooks:
    """A rich progress bar: current point and the last point's tokens/s."""

    def __init__(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("{task.fields[last]}"), console=console,
                                 transient=False)
        self.task = None

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def sweep_started(self, kind, total):
        self.task = self.progress.add_task(kind, total=total, last="")

    def point_started(self, kind, x):
        label = "concurrency" if kind == "generation" else "micro-batch"
        self.progress.update(self.task, description=f"{kind}: {label} {x}")

    def point_finished(self, point, resumed=False):
        x = getattr(point, "concurrency", None) or getattr(point, "micro_batch", None)
        tps = point.tokens_per_s
        tag = " (resumed)" if resumed else ""
        last = f"{x}: {tps:,.0f} tok/s{tag}" if tps else f"{x}: {point.status}{tag}"
        self.progress.update(self.task, advance=1, last=last)

    def sweep_finished(self, kind):
        if self.task is not None:
            t = self.progress.tasks[self.task]
            self.progress.update(self.task, total=t.completed, description=f"{kind}: done")


def print_summary(console, profile) -> None:
    from rich.table import Table

    if profile.generation:
        t = Table(title=f"generation ({profile.settings.gen_backend}, prompt {profile.settings.prompt_len}, "
                        f"output {profile.settings.output_len})")
        for col in ("concurrency", "status", "tokens/s", "decode step ms", "prefill ms", "cv %", "peak mem GiB"):
            t.add_column(col, justify="right")
        for p in sorted(profile.generation, key=lambda p: p.concurrency):
            t.add_row(str(p.concurrency), p.status, _f(p.tokens_per_s, "{:,.1f}"), _f(p.decode_step_s, "{:.2f}", 1e3),
                      _f(p.prefill_s, "{:.1f}", 1e3), _f(p.cv, "{:.1f}", 100), _f(p.peak_mem_bytes, "{:.2f}", 2**-30))
        console.print(t)
    if profile.training:
        t = Table(title=f"training ({profile.settings.train_backend}, seq {profile.settings.seq_len})")
        for col in ("micro-batch", "status", "tokens/s", "step ms", "cv %", "peak mem GiB"):
            t.add_column(col, justify="right")
        for p in sorted(profile.training, key=lambda p: p.micro_batch):
            t.add_row(str(p.micro_batch), p.status, _f(p.tokens_per_s, "{:,.1f}"), _f(p.step_s, "{:.1f}", 1e3),
                      _f(p.cv, "{:.1f}", 100), _f(p.peak_mem_bytes, "{:.2f}", 2**-30))
        console.print(t)
        from throughputlab.sweep import largest_fitting

        fit = largest_fitting(profile.training)
        if fit is not None:
            console.print(f"largest micro-batch that fits: {fit} (larger ones ran out of memory)")


def _f(x, fmt: str, scale: float = 1.0) -> str:
    return "-" if x is None else fmt.format(x * scale)
