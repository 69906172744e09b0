"""`throughputlab hardware`, `models` and `export`: look at the machine, the presets and a profile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import click

from throughputlab.errors import UserError


@click.command()
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--dtype", default="auto", show_default=True, help="dtype of the micro-benchmarks (auto: as bench picks it).")
@click.option("--no-bench", is_flag=True, help="Skip the copy, matrix-vector and matmul micro-benchmarks.")
@click.option("--json", "as_json", is_flag=True, help="Print the hardware record as JSON.")
@click.option("--collectives", "nproc", type=click.IntRange(min=2), default=None, metavar="N",
              help="Also time all-reduce, all-gather and reduce-scatter on N ranks under torch.distributed.run "
                   "(NCCL on GPUs, gloo on CPU: there it checks mechanics, not NCCL's speed), with the topology.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the hardware record (with the collectives) as JSON here.")
def hardware(device: str, dtype: str, no_bench: bool, as_json: bool, nproc: Optional[int],
             output: Optional[Path]) -> None:
    """Describe the device: GPUs through NVML (or the CPU), datasheet peaks, measured copy and
    matrix-vector GB/s (the read bandwidth decode and the KV reads see) and matmul TFLOP/s, and with
    --collectives N the bus bandwidth of the collectives between N devices."""
    from throughputlab.commands.options import check_writable
    from throughputlab.hardware.probe import probe, resolve_device, resolve_dtype

    if output is not None:
        check_writable(output, "--output")  # before the micro-benchmarks, not after them
    dev = resolve_device(device)
    hw = probe(dev, resolve_dtype(dtype, dev), run_microbench=not no_bench)
    if nproc is not None:
        from throughputlab.hardware.collectives import CollectiveRunError, measure_collectives, table_lines
        from throughputlab.hardware.topology import topology

        try:
            hw.collectives = measure_collectives(nproc, "cuda" if dev.startswith("cuda") else "cpu")
        except CollectiveRunError as e:
            raise UserError(f"--collectives {nproc}: the ranks failed ({e})") from None
        hw.topology = hw.collectives.topology or topology()
    if output is not None:
        try:
            output.write_text(hw.model_dump_json(indent=1))
        except OSError as e:
            raise UserError(f"--output {output}: cannot write it ({e.strerror or e}); choose another path") from None
    if as_json:
        click.echo(hw.model_dump_json(indent=2))
        return
    click.echo(f"device: {hw.device_type} - {hw.device_name}")
    if hw.cpu:
        c = hw.cpu
        click.echo(f"cpu: {c.model}, {c.logical_cores} logical cores, {_gib(c.memory_total_bytes)} memory")
    for g in hw.gpus:
        click.echo(f"gpu {g.index}: {g.name}, {_gib(g.memory_total_bytes)}, driver {g.driver}, "
                   f"SM clock max {g.sm_clock_max_mhz} MHz, power limit {g.power_limit_w} W")
    if not hw.gpus:
        click.echo("gpu: none visible through NVML (no driver): measurements run on the CPU")
    if hw.datasheet:
        d = hw.datasheet
        flops = ", ".join(f"{k} {v / 1e12:,.0f}" for k, v in d.flops_per_s.items())
        click.echo(f"datasheet ({d.device}): {d.memory_bandwidth_bytes_per_s / 1e9:,.0f} GB/s, dense TFLOP/s: {flops}")
        click.echo(f"  source: {d.source}")
    else:
        click.echo("datasheet: no row for this device (peaks come from the micro-benchmarks only)")
    if hw.microbench:
        m = hw.microbench
        gemv = (f"matrix-vector {m.gemv_bandwidth_bytes_per_s / 1e9:,.1f} GB/s (weights read), "
                if m.gemv_bandwidth_bytes_per_s else "")
        click.echo(f"measured ({m.dtype}): copy {m.copy_bandwidth_bytes_per_s / 1e9:,.1f} GB/s (read+write), "
                   f"{gemv}matmul {m.matmul_flops_per_s / 1e12:,.3f} TFLOP/s (n={m.matmul_n})")
    if hw.collectives is not None:
        for line in table_lines(hw.collectives):
            click.echo(line)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON.")
@click.option("--dtype", default="bfloat16", show_default=True, help="dtype for the byte columns.")
def models(as_json: bool, dtype: str) -> None:
    """List the shipped model presets with the quantities the throughput model uses.

    W: weight bytes read per decode step; k: KV-cache bytes per context token; F: FLOPs per
    token outside attention; a: attention FLOPs per context token.
    """
    from throughputlab.models import preset_description, preset_names, resolve_model
    from throughputlab.models.spec import dtype_bytes

    nbytes = dtype_bytes(dtype)
    rows = []
    for name in preset_names():
        s = resolve_model(name).spec
        rows.append({"name": name, "description": preset_description(name), "params_total": s.params_total,
                     "params_active": s.params_active, **s.summary(nbytes)})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"{'preset':15} {'params':>9} {'active':>9} {'W GB':>8} {'k KB':>7} {'F GFLOP':>8}  description"
               f"   ({dtype})")
    for r in rows:
        click.echo(f"{r['name']:15} {_b(r['params_total']):>9} {_b(r['params_active']):>9} "
                   f"{r['weight_bytes_per_step'] / 1e9:8.2f} {r['kv_bytes_per_token'] / 1e3:7.1f} "
                   f"{r['flops_per_token'] / 1e9:8.2f}  {r['description']}")


@click.command()
@click.argument("profile", type=click.Path(path_type=Path))
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="CSV file (default: PROFILE with -generation.csv / -training.csv / -samples.csv).")
@click.option("--what", type=click.Choice(["generation", "training", "samples", "all"]), default="all",
              show_default=True, help="Which table: per-point medians, or every raw sample.")
def export(profile: Path, output: Optional[Path], what: str) -> None:
    """Write a profile's points as CSV (medians per point, or every raw sample)."""
    from throughputlab.commands.options import check_writable
    from throughputlab.records.profile import Profile

    prof = Profile.load(profile)  # every problem with the file is one line (throughputlab.files)
    tables = {"generation": prof.generation_df, "training": prof.training_df, "samples": prof.samples_df}
    chosen = list(tables) if what == "all" else [what]
    if output is not None and len(chosen) > 1:
        raise UserError("--output names one file: add --what generation|training|samples, or omit --output")
    for name in chosen:
        path = output or profile.with_name(f"{profile.stem}-{name}.csv")
        check_writable(path)
        tables[name]().to_csv(path, index=False)
        click.echo(f"wrote {path}")


def _gib(b: Optional[int]) -> str:
    return "?" if b is None else f"{b / 2**30:.1f} GiB"


def _b(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
