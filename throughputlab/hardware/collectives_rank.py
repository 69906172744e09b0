"""One rank of the collective micro-benchmarks: the program ``torch.distributed.run`` starts
(``-m throughputlab.hardware.collectives_rank``). Definitions, records and the caller's side
are in :mod:`throughputlab.hardware.collectives`; rank 0 writes the result as JSON.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Optional

from throughputlab.hardware.collectives import ELEMENT_BYTES, bus_factor, default_sizes, fit_op, point_from_samples
from throughputlab.records.collectives import OPS, CollectiveBench, CollectiveOp, CollectivePoint, Op

log = logging.getLogger(__name__)


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description="One rank of the collectives benchmark (start it with torch.distributed.run).")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--sizes", default="")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--caller-pid", type=int, default=None, help="exit when this process is gone")
    args = ap.parse_args(argv)
    if any(o not in OPS for o in args.ops.split(",")):
        ap.error(f"--ops must be among {', '.join(OPS)}, got {args.ops}")
    if "RANK" not in os.environ:
        raise SystemExit("start this module with python -m torch.distributed.run --nproc-per-node N -m "
                         "throughputlab.hardware.collectives_rank --out FILE")
    if args.caller_pid:
        _exit_with_caller(args.caller_pid)
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(local)
        dev, backend, name = torch.device("cuda", local), "nccl", torch.cuda.get_device_name(local)
    else:
        torch.set_num_threads(1)
        dev, backend, name = torch.device("cpu"), "gloo", None  # the caller names the CPU
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout_s))
    try:
        n = dist.get_world_size()
        sizes = [int(s) for s in args.sizes.split(",") if s] or default_sizes(args.device)
        results = [_measure_op(op, sizes, n, rank, dev, args.iters, args.warmup) for op in args.ops.split(",")]
        if rank == 0:
            bench = CollectiveBench(backend=backend, device=args.device, device_name=name, world_size=n,
                                    warmup=args.warmup, iters=args.iters, threads_per_rank=torch.get_num_threads(),
                                    torch_version=torch.__version__, ops=results)
            tmp = args.out + ".tmp"
            Path(tmp).write_text(bench.model_dump_json(indent=1))
            os.replace(tmp, args.out)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def _exit_with_caller(pid: int, every_s: float = 0.5) -> None:
    """A caller killed with SIGKILL cannot clean up: each rank then ends itself, the launcher
    sees its ranks fail and exits, and nothing of the run outlives the caller by more than a
    second. (A thread, as a rank spends its time inside blocking collectives.)"""
    import threading

    import psutil

    try:
        caller = psutil.Process(pid)  # its start time guards against a reused pid
    except psutil.Error:
        os._exit(3)

    def watch():
        while True:
            time.sleep(every_s)
            try:
                gone = not caller.is_running() or caller.status() == psutil.STATUS_ZOMBIE
            except psutil.Error:
                gone = True
            if gone:
                log.error("the process that started this run (pid %d) is gone: exiting", pid)
                os._exit(3)

    threading.Thread(target=watch, name="caller-watch", daemon=True).start()


def _unsupported(e: BaseException) -> bool:
    msg = str(e).lower()
    return isinstance(e, NotImplementedError) or any(
        k in msg for k in ("not support", "unsupported", "not implemented"))


def _measure_op(op: Op, sizes: list[int], n: int, rank: int, dev, iters: int, warmup: int) -> CollectiveOp:
    factor = bus_factor(op, n)
    points: list[CollectivePoint] = []
    for i, size in enumerate(sizes):
        try:
            points.append(_measure_point(op, size, n, rank, dev, iters, warmup))
        except (RuntimeError, NotImplementedError, ValueError) as e:
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
            if i == 0 and _unsupported(e):
                return CollectiveOp(op=op, status="unsupported", bus_factor=factor, error=msg)
            # a failed collective may leave the group unusable: larger sizes of this op are not tried
            points.append(CollectivePoint(size_bytes=size, count=size // ELEMENT_BYTES, status="error", error=msg))
            result = CollectiveOp(op=op, status="error", bus_factor=factor, error=msg, points=points)
            result.fit = fit_op(result)
            return result
    result = CollectiveOp(op=op, status="ok", bus_factor=factor, points=points)
    result.fit = fit_op(result)
    return result


def _collective(op: Op, n: int, dev, size: int):
    """The buffers and a call running the op once; the values are set by ``fill`` and checked by ``check``."""
    import torch
    import torch.distributed as dist

    count = size // ELEMENT_BYTES
    chunk = count // n
    if op == "all_reduce":
        buf = torch.empty(count, dtype=torch.float32, device=dev)

        def run():
            dist.all_reduce(buf)

        def fill(rank):
            buf.fill_(rank + 1)

        def check():
            return bool((buf == n * (n + 1) / 2).all())

        def zero():
            buf.zero_()
    elif op == "all_gather":
        inp = torch.empty(chunk, dtype=torch.float32, device=dev)
        out = torch.empty(chunk * n, dtype=torch.float32, device=dev)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

        def run():
            gather(out, inp)

        def fill(rank):
            inp.fill_(rank + 1)
            out.fill_(-1)

        def check():  # chunk i came from rank i
            want = torch.arange(1, n + 1, dtype=torch.float32, device=dev)[:, None]
            return bool((out.view(n, chunk) == want).all())

        def zero():
            inp.zero_()
    else:
        inp = torch.empty(chunk * n, dtype=torch.float32, device=dev)
        out = torch.empty(chunk, dtype=torch.float32, device=dev)
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        me = {}

        def run():
            scatter(out, inp)

        def fill(rank):  # rank r's chunk j holds (r+1)(j+1): rank j receives (j+1) n(n+1)/2
            me["rank"] = rank
            inp.view(n, chunk).copy_((rank + 1) * torch.arange(1, n + 1, dtype=torch.float32, device=dev)[:, None])
            out.fill_(-1)

        def check():
            return bool((out == (me["rank"] + 1) * n * (n + 1) / 2).all())

        def zero():
            inp.zero_()
    return run, fill, check, zero


def _measure_point(op: Op, size: int, n: int, rank: int, dev, iters: int, warmup: int) -> CollectivePoint:
    import torch
    import torch.distributed as dist

    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def barrier():
        if cuda:
            dist.barrier(device_ids=[dev.index])
        else:
            dist.barrier()
        sync()

    run, fill, check, zero = _collective(op, n, dev, size)
    fill(rank)
    sync()
    run()
    sync()
    correct = check()
    zero()  # zeros from here on: repeated sums neither overflow nor turn denormal
    for _ in range(warmup):
        run()
    times = []
    for _ in range(iters):
        barrier()
        t = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - t)
    # slowest rank per iteration; a wrong result on any rank marks the point
    agg = torch.tensor(times + [0.0 if correct else 1.0], dtype=torch.float64, device=dev)
    dist.all_reduce(agg, op=dist.ReduceOp.MAX)
    vals = agg.tolist()
    return point_from_samples(size, vals[:-1], n, op, correct=vals[-1] == 0.0)


if __name__ == "__main__":
    from torch.distributed.elastic.multiprocessing.errors import record

    sys.exit(record(main)())
