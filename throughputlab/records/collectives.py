"""The collective benchmark's record: all-reduce, all-gather and reduce-scatter timed over message
sizes on one machine's devices, with a latency + bandwidth line per op. The definitions (sizes,
algbw, busbw, the fit) are in throughputlab.hardware.collectives, which measures it."""

from __future__ import annotations

from typing import Literal, Optional

from throughputlab.records.base import Record
from throughputlab.records.topology import Topology

SCHEMA_VERSION = 1
Op = Literal["all_reduce", "all_gather", "reduce_scatter"]
OPS: tuple[Op, ...] = ("all_reduce", "all_gather", "reduce_scatter")


class CollectivePoint(Record):
    size_bytes: int  # nccl-tests' size: all-reduce buffer, all-gather output, reduce-scatter input
    count: int  # float32 elements in that buffer
    status: Literal["ok", "incorrect", "error"]
    time_s: Optional[float] = None  # median of samples_s
    algbw_bytes_per_s: Optional[float] = None
    busbw_bytes_per_s: Optional[float] = None
    samples_s: list[float] = []  # one per timed iteration: the slowest rank's time
    error: Optional[str] = None


class CollectiveFit(Record):
    """t(S) = alpha_s + S * bus_factor / busbw_fit_bytes_per_s."""

    alpha_s: float
    busbw_fit_bytes_per_s: Optional[float]  # None when the large sizes give no positive slope
    slope_sizes_bytes: list[int]
    alpha_sizes_bytes: list[int]
    max_rel_error: Optional[float] = None  # max |line - measured| / measured over all ok sizes


class CollectiveOp(Record):
    op: Op
    status: Literal["ok", "unsupported", "error"]
    bus_factor: float
    error: Optional[str] = None
    points: list[CollectivePoint] = []
    fit: Optional[CollectiveFit] = None


class CollectiveBench(Record):
    schema_version: Literal[1] = SCHEMA_VERSION
    backend: Literal["nccl", "gloo"]
    device: Literal["cpu", "cuda"]
    device_name: Optional[str] = None
    world_size: int
    dtype: str = "float32"
    warmup: int
    iters: int
    threads_per_rank: Optional[int] = None  # torch intra-op threads in each rank
    torch_version: Optional[str] = None
    launcher: str = "torch.distributed.run"
    started_at: Optional[str] = None
    wall_s: Optional[float] = None  # the whole run, launcher start-up included
    ops: list[CollectiveOp] = []
    topology: Optional[Topology] = None

    def op(self, name: Op) -> Optional[CollectiveOp]:
        return next((o for o in self.ops if o.op == name), None)
