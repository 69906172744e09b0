"""What a profile was measured on: the hardware record (devices, the probe's micro-benchmarks,
the datasheet row, collectives, topology) and the environment record (package versions, git
hash, threads, the variables that change speed). Probing fills the first
(throughputlab.hardware.probe), throughputlab.machine the second.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from throughputlab.records.base import Record, now_iso
from throughputlab.records.collectives import CollectiveBench
from throughputlab.records.topology import Topology


class Environment(Record):
    python: str
    platform: str
    hostname: str
    packages: dict[str, str] = {}
    git_hash: Optional[str] = None
    command_line: list[str] = []
    torch_threads: Optional[int] = None
    cpu_count: Optional[int] = None
    env_vars: dict[str, str] = {}
    started_at: str = Field(default_factory=now_iso)
    updated_at: Optional[str] = None


class GpuInfo(Record):
    index: int
    name: str
    memory_total_bytes: Optional[int] = None
    driver: Optional[str] = None
    cuda_capability: Optional[str] = None
    sm_clock_max_mhz: Optional[int] = None
    mem_clock_max_mhz: Optional[int] = None
    power_limit_w: Optional[float] = None


class CpuInfo(Record):
    model: str
    logical_cores: Optional[int] = None
    physical_cores: Optional[int] = None
    memory_total_bytes: Optional[int] = None


class MicroBench(Record):
    """The probe's own measurements: a large copy for bandwidth, a large matmul for FLOP/s, and
    matrix-vector products over matrices far larger than the caches (the decode step's access
    pattern) for the bandwidth the dtype's kernels reach."""

    dtype: str
    copy_bandwidth_bytes_per_s: Optional[float] = None  # read + write bytes / time
    matmul_flops_per_s: Optional[float] = None
    gemv_bandwidth_bytes_per_s: Optional[float] = None  # matrix bytes read / time (absent in older profiles)
    copy_samples_s: list[float] = []
    matmul_samples_s: list[float] = []
    gemv_samples_s: list[float] = []
    copy_bytes: Optional[int] = None
    matmul_n: Optional[int] = None
    gemv_bytes: Optional[int] = None


class DatasheetPeak(Record):
    device: str
    memory_bandwidth_bytes_per_s: float
    flops_per_s: dict[str, float]  # dense, by dtype name
    memory_bytes: Optional[int] = None
    source: str


class Hardware(Record):
    device_type: Literal["cuda", "cpu"]
    device_name: str
    cpu: Optional[CpuInfo] = None
    gpus: list[GpuInfo] = []
    driver: Optional[str] = None
    memory_total_bytes: Optional[int] = None  # of the device the sweep ran on
    microbench: Optional[MicroBench] = None
    datasheet: Optional[DatasheetPeak] = None
    collectives: Optional[CollectiveBench] = None  # `throughputlab hardware --collectives N`
    topology: Optional[Topology] = None
