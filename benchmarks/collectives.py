"""Collective micro-benchmarks: all-reduce, all-gather and reduce-scatter over message sizes,
with nccl-tests' algorithm and bus bandwidths and a fitted latency + bandwidth line per op.

    python benchmarks/collectives.py                          # 2 gloo ranks on this CPU, 4 KiB to 64 MiB
    python benchmarks/collectives.py --nproc 8 --device cuda  # NCCL, one GPU per rank, 4 KiB to 1 GiB
    python benchmarks/collectives.py --json coll.json --iters 50

Runs ``throughputlab.hardware.collectives.measure_collectives`` (PyTorch's launcher, one rank
per device; definitions in that module's docstring) and prints the table, the fits, the
topology and the wall time. Every result is checked on every rank before it is timed.

On CPU this checks the mechanics and the correctness of the measurement (the launcher, the
three ops, the arithmetic, clean exits), not NCCL's speed: gloo moves the bytes through TCP on
loopback, one OpenMP thread per rank, and its figures say nothing about NVLink or PCIe. The
figures that feed the throughput model come from a GPU run.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--sizes", default="", help="comma-separated byte counts (default: powers of 4 from 4 KiB)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args()

    from throughputlab.errors import UserError
    from throughputlab.hardware.collectives import CollectiveRunError, measure_collectives, table_lines

    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()] or None
    except ValueError:
        print(f"--sizes must be comma-separated byte counts, got {args.sizes!r}", file=sys.stderr)
        return 2
    try:
        bench = measure_collectives(args.nproc, args.device, sizes, iters=args.iters, warmup=args.warmup,
                                    timeout_s=args.timeout)
    except UserError as e:
        print(e, file=sys.stderr)
        return 2
    except CollectiveRunError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"$ python benchmarks/collectives.py --nproc {args.nproc} --device {args.device}"
          f" --iters {args.iters} --warmup {args.warmup}")
    print("\n".join(table_lines(bench)))
    t = bench.topology
    if t is not None:
        c = t.cpu
        nodes = ", ".join(f"node {n.index}: cpus {_ranges(n.cpus)}" for n in c.numa_nodes) or "unknown"
        print(f"topology: {c.sockets} socket(s), {c.physical_cores} physical / {c.logical_cores} logical cores, "
              f"NUMA ({c.source}) {nodes}")
        if t.gpu.source == "nvml":
            for p in t.gpu.pairs:
                print(f"  gpu {p.gpu_a} - gpu {p.gpu_b}: {p.link} (PCIe path {p.pcie_path})")
        else:
            print(f"  gpus: {t.gpu.note}")
    print(f"wall time {bench.wall_s:.1f} s (launcher start-up included), torch {bench.torch_version}")
    if args.json:
        with open(args.json, "w") as f:
            f.write(bench.model_dump_json(indent=1))
    return 0


def _ranges(cpus: list[int]) -> str:
    out, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            out.append(f"{start}-{c}" if c != start else f"{c}")
            start = None
    return ",".join(out)


if __name__ == "__main__":
    sys.exit(main())
