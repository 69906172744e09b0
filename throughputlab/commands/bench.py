"""`throughputlab bench`: layer the spec (file, flags, --set), run it with a progress bar, print a summary."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Optional

import click

from throughputlab.commands.bench_output import RichHooks, print_ranks, print_scaling, print_summary
from throughputlab.commands.options import IntList, check_writable, default_profile_name, parse_engine_args
from throughputlab.errors import UserError
from throughputlab.records.settings import BenchSpec, check_endpoint
from throughputlab.settings.options import command_layers, flag_names, given, layer_options, print_spec, setting_option

# flag (click parameter name) -> the spec key it sets; the spec holds the defaults
SPEC_FLAGS = {
    "model": "model", "only": "only", "gen_backend": "generation.backend", "train_backend": "training.backend",
    "concurrency": "generation.concurrency", "batch_sizes": "training.micro_batches",
    "prompt_len": "generation.prompt_len", "output_len": "generation.output_len", "seq_len": "training.seq_len",
    "dtype": "dtype", "device": "device", "warmup": "measurement.warmup", "repeats": "measurement.repeats",
    "rounds": "measurement.rounds", "max_cv": "measurement.max_cv", "max_remeasure": "measurement.max_remeasure",
    "auto_cap": "measurement.auto_cap", "random_weights": "random_weights", "trust_remote_code": "trust_remote_code",
    "engine_args": "generation.engine_args", "tensor_parallel": "generation.tensor_parallel",
    "data_parallel": "generation.data_parallel", "url": "generation.url", "contexts": "generation.contexts",
    "seq_lens": "training.seq_lens", "served_model": "generation.served_model",
    "telemetry": "telemetry.enabled", "telemetry_hz": "telemetry.hz", "py_spy": "py_spy.enabled",
    "py_spy_points": "py_spy.points", "track_effective_lr": "training.effective_lr", "seed": "seed",
    "nproc_per_node": "distributed.nproc_per_node", "nnodes": "distributed.nnodes",
    "node_rank": "distributed.node_rank", "rdzv_endpoint": "distributed.rdzv_endpoint",
    "activation_checkpointing": "distributed.activation_checkpointing", "collectives": "distributed.collectives",
    "world_sizes": "distributed.world_sizes",
}


def spec_option(*decls: str, shown: Optional[str] = None, **kw):
    """A flag for one spec key: no default of its own (None: not given); its help is the key's
    description in BenchSpec, with the key and the spec's default."""
    return setting_option(BenchSpec, SPEC_FLAGS[decls[-1]], *decls, shown=shown, **kw)


@click.command()
@layer_options("bench", "generation.prompt_len=256, --set generation.concurrency=[1,8,64]")
@spec_option("--model", "-m", "model")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Profile JSON to write. Default: profile-MODEL-DEVICE-TIME.json in the current folder.")
@spec_option("--only", "only", type=click.Choice(["gen", "train"]), shown="both")
@spec_option("--backend", "gen_backend", type=click.Choice(["hf", "vllm", "openai"]))
@spec_option("--train-backend", "train_backend", type=click.Choice(["torch"]))
@spec_option("--concurrency", "-c", "concurrency", type=IntList(allow_auto=True))
@spec_option("--batch-sizes", "-b", "batch_sizes", type=IntList(allow_auto=True))
@spec_option("--prompt-len", "prompt_len", type=int)
@spec_option("--output-len", "output_len", type=int)
@spec_option("--seq-len", "seq_len", type=int)
@spec_option("--contexts", "contexts", type=IntList(), metavar="LIST")
@spec_option("--seq-lens", "seq_lens", type=IntList(), metavar="LIST")
@spec_option("--dtype", "dtype")
@spec_option("--device", "device")
@spec_option("--warmup", "warmup", type=int)
@spec_option("--repeats", "repeats", type=int)
@spec_option("--rounds", "rounds", type=int)
@spec_option("--max-cv", "max_cv", type=float)
@spec_option("--max-remeasure", "max_remeasure", type=int)
@spec_option("--auto-cap", "auto_cap", type=int)
@click.option("--resume", is_flag=True,
              help="Continue the profile --output: finished points are not re-measured; settings not given come "
                   "from the profile, given ones must match it.")
@click.option("--force", is_flag=True, help="Overwrite --output if it exists.")
@spec_option("--random-weights", "random_weights", is_flag=True)
@spec_option("--trust-remote-code", "trust_remote_code", is_flag=True)
@spec_option("--tensor-parallel", "tensor_parallel", type=int)
@spec_option("--data-parallel", "data_parallel", type=int)
@spec_option("--engine-arg", "engine_args", multiple=True, metavar="KEY=VALUE")
@spec_option("--url", "url")
@spec_option("--served-model", "served_model")
@spec_option("--telemetry/--no-telemetry", "telemetry")
@spec_option("--telemetry-hz", "telemetry_hz", type=float)
@spec_option("--py-spy", "py_spy", is_flag=True)
@spec_option("--py-spy-points", "py_spy_points", type=IntList())
@spec_option("--effective-lr", "track_effective_lr", is_flag=True)
@spec_option("--nproc-per-node", "nproc_per_node", type=click.IntRange(min=1))
@spec_option("--world-sizes", "world_sizes", type=IntList(), metavar="LIST")
@spec_option("--nnodes", "nnodes", type=click.IntRange(min=1))
@spec_option("--node-rank", "node_rank", type=click.IntRange(min=0))
@spec_option("--rdzv-endpoint", "rdzv_endpoint", metavar="HOST:PORT")
@spec_option("--activation-checkpointing", "activation_checkpointing", is_flag=True)
@spec_option("--collectives/--no-collectives", "collectives")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the HTML report here at the end.")
@spec_option("--seed", "seed", type=int)
@click.option("--allocator", type=click.Choice(["auto", "system"]), default="auto", show_default=True,
              help="auto: on CPU, run the hf/torch backends under a caching allocator: tcmalloc or jemalloc when "
                   "the system has one, else the mimalloc of the cmeel-mimalloc package (LD_PRELOAD, as vLLM's and "
                   "PyTorch's CPU guides recommend; glibc malloc faults large blocks in again at every step). "
                   "system: keep the process's allocator. The profile records which one ran.")
@click.pass_context
def bench(ctx: click.Context, spec_file: Optional[Path], set_items: tuple[str, ...], print_spec: bool,
          output: Optional[Path], resume: bool, force: bool, report_path: Optional[Path], allocator: str,
          **flags) -> None:
    """Measure generation tokens/s against concurrency and training tokens/s against micro-batch.

    Writes a profile (JSON) after every point, so Ctrl-C or a crash keeps what was measured;
    `--resume -o PROFILE` finishes it. Presets use random weights: throughput does not
    depend on the weight values.

    The settings are one tree (`--print-spec` shows it), built in this order, later winning:
    the spec's defaults < --spec FILE < the flags below < --set KEY=VALUE. The profile stores
    the resolved spec. With --resume the stored spec replaces the defaults, so `--resume -o
    PROFILE` alone continues exactly; a setting given that differs from the stored one is
    refused (the py-spy options may change), except that the measured axes may grow: a -c,
    --contexts, -b or --seq-lens list that keeps every stored value adds the new ones
    (`--resume --contexts 64,512,2048 -o PROFILE` adds 2048 to a profile of 64 and 512).

    \b
    Examples:
      throughputlab bench                                   # demo model, both sweeps (20 s to 2 min on 2 CPU cores)
      throughputlab bench -m qwen2.5-1.5b -c 1,8,64,256 -o q15.json
      throughputlab bench --spec sweep.yaml --set measurement.rounds=1
      throughputlab bench -m tiny --only train -b auto
      throughputlab bench -m tiny --backend vllm --only gen --engine-arg enforce_eager=true
    """
    from throughputlab import allocator as alloc
    from throughputlab import spec as specs

    if resume and output is None:
        raise UserError("--resume needs --output PROFILE: the profile to continue")
    typed = given(ctx, flags)
    if "engine_args" in typed:
        typed["engine_args"] = parse_engine_args(typed["engine_args"])
    unused = _refuse_ignored(typed, flag_names(ctx))
    layers = command_layers(ctx, spec_file, "bench", typed, SPEC_FLAGS, set_items)
    from throughputlab.bench import RunOptions, resume_base, run_bench

    # --world-sizes writes one profile per size: a resumed run repeats the first run's options
    world_sizes = typed.get("world_sizes")
    spec = specs.resolve(layers, base=resume_base(output) if resume and not world_sizes else None)
    if print_spec:
        _print_spec(spec)
        for note in unused:  # stdout is the spec file
            click.echo(note, err=True)
        return
    note = alloc.maybe_reexec(allocator, spec.device,
                              in_process_only=spec.generation.backend == "hf" or spec.only == "train")
    run = RunOptions(output=output or default_profile_name(spec.model, spec.device), resume=resume, force=force,
                     command_line=["throughputlab", *sys.argv[1:]])
    dist = spec.distributed
    check_writable(run.output)
    spec.check()
    if not dist.world_sizes and dist.nnodes == 1:  # a later node's ranks resume from node 0's profile
        run.check()
    if report_path is not None:
        check_writable(report_path, "--report")
    if note:  # printed once, on stdout, with the run's header, after every check of the input
        unused.append(note)
    layout = ranks = None
    if dist.world_sizes:
        if dist.nproc_per_node > 1 or dist.nnodes > 1:
            raise UserError("--world-sizes runs each size on this machine: drop --nproc-per-node and --nnodes")
        if spec.only != "train":
            raise UserError("--world-sizes sweeps the training ranks: add --only train")
        for note in unused:
            click.echo(note)
        _world_sizes(spec, dist.world_sizes, run)
        return
    if resume and dist.nproc_per_node == 1 and dist.nnodes == 1:  # a profile older than the spec's ranks
        spec = _stored_ranks(run.output, spec)
        dist = spec.distributed
    if resume and dist.nnodes > 1:
        _check_node(layers, dist)
    if dist.nproc_per_node > 1 or dist.nnodes > 1:
        from throughputlab.records.distributed import DistributedSpec

        if spec.only != "train":
            raise UserError("--nproc-per-node runs the training sweep on several ranks: add --only train "
                            "(measure generation in a run of its own)")
        if dist.nnodes > 1 and not dist.rdzv_endpoint:
            raise UserError("--nnodes above 1 needs --rdzv-endpoint HOST:PORT (node 0's address)")
        check_endpoint(dist.rdzv_endpoint)
        if dist.node_rank >= dist.nnodes:
            raise UserError(f"--node-rank {dist.node_rank} must be below --nnodes {dist.nnodes}")
        layout = DistributedSpec(nproc_per_node=dist.nproc_per_node, nnodes=dist.nnodes, node_rank=dist.node_rank,
                                 rdzv_endpoint=dist.rdzv_endpoint,
                                 activation_checkpointing=dist.activation_checkpointing,
                                 collectives=dist.collectives)
    elif dist.activation_checkpointing:
        raise UserError("--activation-checkpointing goes with --nproc-per-node (the FSDP2 trainer)")
    console = _console()
    replicas = spec.generation.data_parallel if spec.run_gen else 1
    console.print(f"[bold]throughputlab bench[/]: model {spec.model}, profile -> {run.output}"
                  + (f", {layout.world_size} ranks" if layout else "")
                  + (f", {replicas} engine replicas" if replicas > 1 else ""), highlight=False)
    for note in unused:
        console.print(note, highlight=False)
    hooks = RichHooks(console)
    try:
        with hooks:
            if spec.generation.data_parallel > 1 and spec.run_gen:
                from throughputlab.distributed.replicas import run_generation_replicas

                res = run_generation_replicas(spec, run.output, resume=resume, force=force, hooks=hooks)
                if not res.ok:
                    raise UserError(f"the engine replicas stopped: {res.message}; finished points are in "
                                    f"{run.output}, the ranks' output in {res.log_path}; continue with --resume")
                profile = res.profile
            elif layout is None:
                profile = run_bench(spec, run, hooks)
            else:
                from throughputlab.distributed.launch import run_training_ranks

                res = run_training_ranks(spec, layout, run.output, resume=resume, force=force, hooks=hooks)
                if not res.ok:
                    raise UserError(f"the ranks stopped: {res.message}; finished points are in {run.output}, "
                                    f"the ranks' output in {res.log_path}; continue with --resume")
                if res.profile is None:  # not node 0: rank 0's machine holds the profile
                    console.print("this node's ranks finished; node 0 wrote the profile", highlight=False)
                    return
                profile = res.profile
                ranks = res.ranks
    except KeyboardInterrupt:
        if run.output.exists():
            console.print(f"\ninterrupted: finished points are in {run.output}; "
                          f"continue with: throughputlab bench --resume -o {shlex.quote(str(run.output))}",
                          highlight=False, soft_wrap=True)
        else:
            console.print("\ninterrupted before the first point: no profile written", highlight=False)
        raise SystemExit(130) from None
    print_summary(console, profile)
    if ranks is not None:
        print_ranks(console, ranks)
    console.print(f"profile written to {run.output}", highlight=False)
    if report_path is not None:
        from throughputlab.report.profile_report import write_report

        write_report([profile], report_path)
        console.print(f"report written to {report_path}", highlight=False)


def _stored_ranks(path: Path, spec: BenchSpec) -> BenchSpec:
    """A profile written before the spec held its ranks: the FSDP ranks its training points ran on.
    One node only; several must be given again (their rendezvous is not in such a profile)."""
    from throughputlab.records.profile import Profile

    layouts = {(p.layout.world_size, p.layout.nodes, p.layout.activation_checkpointing)
               for p in Profile.load(path).training if p.layout is not None and p.layout.fsdp}
    if not layouts:
        return spec
    world, nodes, ac = max(layouts)
    if nodes > 1:
        raise UserError(f"--resume: the profile's training ran on {world} ranks over {nodes} nodes: give --nnodes "
                        f"{nodes} --nproc-per-node {world // nodes} --node-rank N --rdzv-endpoint HOST:PORT again")
    dist = spec.distributed.model_copy(update={"nproc_per_node": world,
                                                "activation_checkpointing": spec.distributed.activation_checkpointing
                                                or ac})
    return spec.model_copy(update={"distributed": dist})


def _check_node(layers, dist) -> None:
    """A resumed run over several machines: the stored spec is node 0's, so each machine names
    itself and the meeting point again."""
    from throughputlab.settings import flatten

    typed = {k for layer in layers for k in flatten(layer.values)}
    missing = [flag for key, flag in (("distributed.node_rank", "--node-rank N"),
                                      ("distributed.rdzv_endpoint", "--rdzv-endpoint HOST:PORT")) if key not in typed]
    if missing:
        raise UserError(f"--resume over {dist.nnodes} nodes: give {' and '.join(missing)} again on each machine "
                        "(the profile holds node 0's)")


_PHASE_ONLY = {"generation": "train", "training": "gen"}


def _refuse_ignored(given: dict, flag_names: dict) -> list[str]:
    """Flags that another flag would drop without a word: a length missing from the axis that
    replaces it is refused; a phase's flags beside --only for the other phase are returned as
    notes (printed with the run's output, once, after the allocator's re-exec)."""
    for axis, one in (("contexts", "prompt_len"), ("seq_lens", "seq_len")):
        if axis in given and one in given and given[one] not in given[axis]:
            raise UserError(f"{flag_names[axis]} replaces {flag_names[one]}, and {given[one]} is not in the list: "
                            f"give one, or add {given[one]} to {flag_names[axis]}")
    only = given.get("only")
    notes = []
    for section, skipping in _PHASE_ONLY.items():
        flags = sorted(flag_names[n] for n in given if SPEC_FLAGS[n].startswith(section + "."))
        if only == skipping and flags:
            notes.append(f"note: {', '.join(flags)} not used: --only {skipping} skips the {section} sweep")
    return notes


def _world_sizes(spec, sizes: list[int], run) -> None:
    """The training sweep at each world size, one profile each; then the scaling table."""
    from throughputlab.distributed.launch import run_training_ranks
    from throughputlab.distributed.scaling import check_world_sizes, per_rank_micro_batches, world_size_output
    from throughputlab.records.distributed import DistributedSpec

    sizes = check_world_sizes(sizes)
    outputs = {n: world_size_output(run.output, n) for n in sizes}
    for out in outputs.values():
        if out.exists() and not (run.resume or run.force):
            raise UserError(f"{out} exists: pass --resume to continue it or --force to overwrite it")
        check_writable(out)
    console = _console()
    profiles = []
    for n in sizes:
        out = outputs[n]
        spec_n = spec.model_copy(deep=True)
        spec_n.training.micro_batches = per_rank_micro_batches(spec.training.micro_batches, n)
        spec_n.distributed = spec.distributed.model_copy(update={"nproc_per_node": n, "world_sizes": None})
        layout = DistributedSpec(nproc_per_node=n, activation_checkpointing=spec.distributed.activation_checkpointing,
                                 collectives=spec.distributed.collectives)
        console.print(f"[bold]throughputlab bench[/]: model {spec.model}, {n} rank(s), profile -> {out}",
                      highlight=False)
        hooks = RichHooks(console)
        try:
            with hooks:
                res = run_training_ranks(spec_n, layout, out, resume=run.resume and out.exists(), force=run.force,
                                         hooks=hooks)
        except KeyboardInterrupt:
            console.print(f"\ninterrupted: finished points are in {out}; continue with the same command and "
                          "--resume", highlight=False)
            raise SystemExit(130) from None
        if not res.ok:
            raise UserError(f"the {n}-rank run stopped: {res.message}; finished points are in {out}, the ranks' "
                            f"output in {res.log_path}; continue with the same command and --resume")
        profiles.append(res.profile)
        print_summary(console, res.profile)
        if res.ranks is not None:
            print_ranks(console, res.ranks)
    print_scaling(console, profiles)


def _print_spec(spec: BenchSpec) -> None:
    print_spec(spec)


def _console():
    from rich.console import Console

    console = Console(stderr=False, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:  # a pipe or a log: room for whole headers
        console.width = 140
    return console
