"""Collective micro-benchmarks: all-reduce, all-gather and reduce-scatter over message sizes on
the machine's devices, through ``torch.distributed`` (NCCL on CUDA, gloo on CPU), started by
PyTorch's launcher, with a latency + bandwidth line fitted per op.

Definitions (nccl-tests, PERFORMANCE.md), for ``n`` ranks and a message of ``S`` bytes:

- ``S`` (``size_bytes``) is the all-reduce buffer, the all-gather *output* (n chunks of S/n,
  one from each rank) and the reduce-scatter *input* (each rank keeps one reduced S/n chunk).
  Elements are float32.
- ``time_s``: per timed iteration, every rank times one op between a barrier (with a device
  synchronisation) and the op's completion (synchronised again on CUDA); the iteration's time
  is the slowest rank's, and ``time_s`` is the median over the timed iterations, after
  ``warmup`` untimed ones. The barrier's exit skew between ranks is part of the time.
- ``algbw_bytes_per_s = S / time_s``.
- ``busbw_bytes_per_s = algbw * bus_factor``, with ``bus_factor = 2(n-1)/n`` for all-reduce
  and ``(n-1)/n`` for all-gather and reduce-scatter: the bytes each rank's link carries in the
  ring algorithms, so figures from different rank counts compare (and approach the link
  bandwidth when the op is bandwidth bound).
- The fit is ``t(S) = alpha_s + S * bus_factor / busbw_fit_bytes_per_s`` (the form
  ``roofline.allreduce_s`` and ``roofline.allgather_s`` evaluate). The slope comes from an
  ordinary least-squares line through the larger half of the measured sizes (at least two),
  where bandwidth dominates; ``alpha_s`` is the smallest, over the smallest quarter of the
  sizes (at least one), of the measured time minus that line's bandwidth term: the intercept
  of the large sizes is too noisy to set the latency, and contention from other processes
  only ever adds time. ``max_rel_error`` says how far the line is from the measured times
  over all sizes (where the curve bends, for instance when the buffers outgrow a cache).

Before timing each size, every op is run once on values that tell the ranks and chunks apart
and its result is checked (``status="incorrect"`` otherwise). An op the backend does not
implement (gloo has no reduce-scatter in some torch builds; torch 2.13's gloo has one) is
recorded as ``unsupported``, not replaced by another op.

``measure_collectives`` is the entry point: it starts ``python -m torch.distributed.run`` as a
child in its own session, waits with a deadline, reads rank 0's JSON from a temporary file,
and kills every process of the run (the launcher's group and each worker's own group: the
launcher starts its workers in new sessions) on success, failure, timeout or Ctrl-C. Should
the caller itself be killed (SIGKILL), each rank notices within a second and exits, and the
launcher with it. On CPU
each rank runs one OpenMP thread: two ranks with two threads each on two cores slow each
other 5-10x. On CPU the figures check mechanics and correctness, not NCCL's speed.

Each rank runs :mod:`throughputlab.hardware.collectives_rank` (``python -m
torch.distributed.run --nproc-per-node N -m throughputlab.hardware.collectives_rank --out
FILE``); :func:`throughputlab.hardware.torchrun.run_launcher` keeps the launcher's process
tree in hand.
"""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from throughputlab import scratch
from throughputlab.errors import UserError
from throughputlab.hardware.probe import cpu_info
from throughputlab.hardware.topology import topology
from throughputlab.hardware.torchrun import failure_summary, read_log, run_launcher
from throughputlab.records.collectives import OPS, CollectiveBench, CollectiveFit, CollectiveOp, CollectivePoint, Op
from throughputlab.roofline import bus_factor

ELEMENT_BYTES = 4  # float32, as nccl-tests' default
KIB = 1024


def default_sizes(device: str) -> list[int]:
    """Powers of 4 from 4 KiB to 64 MiB on CPU, to 1 GiB on GPUs."""
    top = 2**30 if device.startswith("cuda") else 64 * 2**20
    sizes, s = [], 4 * KIB
    while s <= top:
        sizes.append(s)
        s *= 4
    return sizes


# ---------------------------------------------------------------- derived figures (pure)


def point_from_samples(size_bytes: int, samples_s: list[float], n: int, op: Op,
                       correct: bool = True) -> CollectivePoint:
    t = statistics.median(samples_s)
    algbw = size_bytes / t if t > 0 else None
    return CollectivePoint(size_bytes=size_bytes, count=size_bytes // ELEMENT_BYTES,
                           status="ok" if correct else "incorrect", time_s=t, algbw_bytes_per_s=algbw,
                           busbw_bytes_per_s=None if algbw is None else algbw * bus_factor(op, n),
                           samples_s=list(samples_s))


def fit_line(sizes_bytes: list[int], times_s: list[float], factor: float) -> Optional[CollectiveFit]:
    """The latency + bandwidth line of the module docstring; None with fewer than 3 sizes."""
    pts = sorted(zip(sizes_bytes, times_s))
    k = len(pts)
    if k < 3 or factor <= 0:
        return None
    large = pts[k - max(2, math.ceil(k / 2)):]
    small = pts[:max(1, k // 4)]
    xs, ys = [p[0] for p in large], [p[1] for p in large]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    slope = max(slope, 0.0)
    alpha = min(t - s * slope for s, t in small)
    busbw = factor / slope if slope > 0 else None
    err = max(abs(alpha + s * slope - t) / t for s, t in pts) if all(t > 0 for _, t in pts) else None
    return CollectiveFit(alpha_s=alpha, busbw_fit_bytes_per_s=busbw, slope_sizes_bytes=[s for s, _ in large],
                         alpha_sizes_bytes=[s for s, _ in small], max_rel_error=err)


def fit_op(op: CollectiveOp) -> Optional[CollectiveFit]:
    ok = [p for p in op.points if p.status == "ok" and p.time_s is not None]
    return fit_line([p.size_bytes for p in ok], [p.time_s for p in ok], op.bus_factor)


def table_lines(bench: CollectiveBench) -> list[str]:
    """The figures as text rows (nccl-tests' columns), one block per op, then the fits."""
    lines = [f"{bench.backend} on {bench.world_size} x {bench.device} ({bench.device_name or 'unknown'}), "
             f"{bench.dtype}, {bench.warmup} warm-up + {bench.iters} timed iterations per size, "
             f"{bench.threads_per_rank} thread(s) per rank",
             f"{'op':15} {'size':>10} {'time us':>11} {'algbw GB/s':>11} {'busbw GB/s':>11}  status"]
    for o in bench.ops:
        if o.status == "unsupported" or not o.points:
            lines.append(f"{o.op:15} {'':>10} {'':>11} {'':>11} {'':>11}  {o.status}: {o.error or ''}")
            continue
        for p in o.points:
            if p.time_s is None:
                lines.append(f"{o.op:15} {_size(p.size_bytes):>10} {'':>11} {'':>11} {'':>11}  {p.status}: {p.error}")
                continue
            algbw, busbw = (p.algbw_bytes_per_s or 0) / 1e9, (p.busbw_bytes_per_s or 0) / 1e9
            lines.append(f"{o.op:15} {_size(p.size_bytes):>10} {p.time_s * 1e6:11.1f} {algbw:11.3f} {busbw:11.3f}"
                         f"  {p.status}")
    lines.append("fit t(S) = alpha + S * bus_factor / busbw_fit "
                 "(slope: larger half of the sizes; alpha: smallest quarter)")
    for o in bench.ops:
        f = o.fit
        if f is None:
            lines.append(f"{o.op:15} no fit ({o.status})")
            continue
        bw = f"{f.busbw_fit_bytes_per_s / 1e9:.3f} GB/s" if f.busbw_fit_bytes_per_s else "not identified"
        err = f", max error {f.max_rel_error:.0%}" if f.max_rel_error is not None else ""
        lines.append(f"{o.op:15} alpha {f.alpha_s * 1e6:.1f} us, busbw_fit {bw} (bus factor {o.bus_factor:.3f}){err}")
    return lines


def _size(b: int) -> str:
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= div and b % div == 0:
            return f"{b // div} {unit}"
    return f"{b} B"


# ---------------------------------------------------------------- the caller's side


class CollectiveRunError(RuntimeError):
    """The launcher or a rank failed or ran out of time; every process of the run is gone."""


def measure_collectives(nproc: int = 2, device: str = "cpu", sizes: Optional[list[int]] = None, *,
                        ops: tuple[Op, ...] | list[Op] = OPS, iters: int = 20, warmup: int = 5,
                        timeout_s: float = 600.0, record_topology: bool = True) -> CollectiveBench:
    """Run the benchmark on ``nproc`` ranks of ``device`` ("cpu", or "cuda": one GPU per rank)
    under ``torch.distributed.run`` and return rank 0's result.

    Raises UserError for bad arguments and CollectiveRunError when the run fails or exceeds
    ``timeout_s``; no process of the run survives either way, nor a KeyboardInterrupt.
    """
    device = _check_args(nproc, device, sizes, ops, iters, warmup, timeout_s)
    sizes = [_round_size(s, nproc) for s in (sizes or default_sizes(device))]
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    with scratch.folder("throughputlab-collectives-") as tmp:
        out, log_path = Path(tmp) / "result.json", Path(tmp) / "launcher.log"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "--max-restarts", "0", "--monitor-interval", "0.1", "-m", "throughputlab.hardware.collectives_rank",
               "--out", str(out), "--device", device, "--sizes", ",".join(map(str, sizes)), "--ops", ",".join(ops),
               "--iters", str(iters), "--warmup", str(warmup), "--timeout-s", str(timeout_s),
               "--caller-pid", str(os.getpid())]
        rc, timed_out = run_launcher(cmd, {**_child_env(device), "TMPDIR": tmp}, log_path,  # torchelastic_* in tmp
                                     timeout_s=timeout_s)
        if timed_out:
            raise CollectiveRunError(
                f"the collectives run ({nproc} ranks) did not finish within {timeout_s:g} s (timeout_s); the launcher "
                f"and its ranks were killed. Last output: {failure_summary(read_log(log_path))}")
        if rc != 0 or not out.is_file():
            raise CollectiveRunError(f"the collectives run failed (launcher exit code {rc}): "
                                     f"{failure_summary(read_log(log_path))}")
        bench = CollectiveBench.model_validate_json(out.read_text())
    bench.started_at, bench.wall_s = started, time.monotonic() - t0
    if bench.device == "cpu":
        bench.device_name = cpu_info().model
    if record_topology:
        bench.topology = topology()
    return bench


def _check_args(nproc, device, sizes, ops, iters, warmup, timeout_s) -> str:
    if not isinstance(nproc, int) or nproc < 2:
        raise UserError(f"--nproc must be an integer of at least 2 (collectives need two ranks), got {nproc!r}")
    if device.startswith("cuda"):
        device = "cuda"
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda":
        import torch

        have = torch.cuda.device_count()
        if have < nproc:
            raise UserError(f"--nproc {nproc} needs {nproc} GPUs (one per rank); torch sees {have}")
    if sizes is not None and (not sizes or any(not isinstance(s, int) or s < ELEMENT_BYTES * nproc for s in sizes)):
        raise UserError(f"--sizes must be byte counts of at least {ELEMENT_BYTES * nproc} "
                        f"(one float32 per rank), got {sizes!r}")
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise UserError(f"--ops must be among {', '.join(OPS)}, got {', '.join(map(str, ops)) or 'none'}")
    if iters < 1 or warmup < 0:
        raise UserError(f"--iters must be at least 1 and --warmup at least 0, got {iters} and {warmup}")
    if not timeout_s > 0:
        raise UserError(f"--timeout must be positive seconds, got {timeout_s!r}")
    return device


def _round_size(size: int, n: int) -> int:
    """Down to whole float32 elements, the same number on every rank."""
    step = ELEMENT_BYTES * n
    return size // step * step


def _child_env(device: str) -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if device == "cpu":
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env
