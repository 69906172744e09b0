"""Hardware probe: GPUs through pynvml (or a CPU description without a driver), the probe's
micro-benchmarks (a large copy for bandwidth, a large matmul for FLOP/s), and the datasheet row.

pynvml and torch are imported lazily, inside the functions that need them.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import statistics
import time
from typing import Optional

from throughputlab.records.machine import CpuInfo, GpuInfo, Hardware, MicroBench
from throughputlab.records.peaks import lookup

log = logging.getLogger(__name__)


def cpu_info() -> CpuInfo:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.MULTILINE)
            if m:
                model = m.group(1).strip()
    except OSError:
        pass
    try:
        import psutil

        physical = psutil.cpu_count(logical=False)
        mem = psutil.virtual_memory().total
    except ImportError:  # psutil is a dependency, but the probe must not fail over it
        physical, mem = None, None
    return CpuInfo(model=model, logical_cores=os.cpu_count(), physical_cores=physical, memory_total_bytes=mem)


def gpu_info() -> tuple[list[GpuInfo], Optional[str]]:
    """GPUs and driver version through NVML; ([], None) without a driver or without pynvml."""
    try:
        import pynvml
    except ImportError:
        return [], None
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound / DriverNotLoaded on machines without a GPU
        log.info("NVML unavailable (%s): describing the CPU instead", e)
        return [], None
    try:
        driver = _s(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            gpus.append(GpuInfo(
                index=i,
                name=_s(pynvml.nvmlDeviceGetName(h)),
                memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                driver=driver,
                cuda_capability=_try(lambda: ".".join(map(str, pynvml.nvmlDeviceGetCudaComputeCapability(h)))),
                sm_clock_max_mhz=_try(lambda: int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))),
                mem_clock_max_mhz=_try(lambda: int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM))),
                power_limit_w=_try(lambda: pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0),
            ))
        return gpus, driver
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _try(fn):
    try:
        return fn()
    except Exception:
        return None


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when torch sees a GPU, else 'cpu'. Imports torch."""
    from throughputlab.errors import UserError

    if device not in ("auto", "cpu", "cuda") and not device.startswith("cuda:"):
        raise UserError(f"--device must be auto, cpu, cuda or cuda:N, got {device!r}")
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {device}: torch sees no CUDA device here; use --device cpu")
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    from throughputlab.errors import UserError

    names = {"auto": None, "bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
             "fp32": "float32", "float32": "float32"}
    if dtype not in names:
        raise UserError(f"--dtype must be one of auto, bfloat16, float16, float32, got {dtype!r}")
    if names[dtype]:
        return names[dtype]
    return "bfloat16" if device.startswith("cuda") or cpu_has_native_bf16() else "float32"


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: bf16 matmuls run natively (and faster than fp32), as RL runs train and generate."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def microbench(device: str, dtype: str, *, copy_mib: Optional[int] = None, matmul_n: Optional[int] = None,
               gemv_mib: Optional[int] = None, repeats: int = 5) -> MicroBench:
    """Copy bandwidth (read + write bytes per second), matrix-vector read bandwidth and matmul
    FLOP/s, medians of ``repeats``.

    The matrix-vector figure is what a memory-bound decode step does with every weight matrix:
    one token's activations times a matrix that is read once from memory. Set against the copy
    it shows how much of the memory system the dtype's matrix-vector kernels can use (on CPUs
    often well under the copy figure, on GPUs close to it).
    """
    import torch

    tdtype = getattr(torch, dtype)
    cuda = device.startswith("cuda")
    copy_mib = copy_mib or (2048 if cuda else 256)
    matmul_n = matmul_n or (8192 if cuda else 1536)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    n_el = copy_mib * 2**20 // torch.finfo(tdtype).bits * 8
    src = torch.ones(n_el, dtype=tdtype, device=device)
    dst = torch.empty_like(src)
    copy_t = []
    for i in range(repeats + 1):
        sync()
        t = time.perf_counter()
        dst.copy_(src)
        sync()
        if i:  # first run is the warm-up (page faults, clocks)
            copy_t.append(time.perf_counter() - t)
    nbytes = 2 * src.numel() * src.element_size()
    del src, dst

    # several square matrices, together far beyond the last-level cache, each read once per pass
    gemv_mib = gemv_mib or (2048 if cuda else 256)
    side = 8192 if cuda else 4096
    mat_bytes = side * side * torch.finfo(tdtype).bits // 8
    mats = [torch.randn(side, side, dtype=tdtype, device=device) for _ in range(max(1, gemv_mib * 2**20 // mat_bytes))]
    vec = torch.randn(1, side, dtype=tdtype, device=device)
    gemv_t = []
    for i in range(repeats + 1):
        sync()
        t = time.perf_counter()
        for m in mats:
            torch.nn.functional.linear(vec, m)
        sync()
        if i:
            gemv_t.append(time.perf_counter() - t)
    gemv_bytes = len(mats) * mat_bytes
    del mats, vec

    a = torch.randn(matmul_n, matmul_n, dtype=tdtype, device=device)
    b = torch.randn(matmul_n, matmul_n, dtype=tdtype, device=device)
    mm_t = []
    for i in range(repeats + 1):
        sync()
        t = time.perf_counter()
        torch.mm(a, b)
        sync()
        if i:
            mm_t.append(time.perf_counter() - t)
    del a, b
    if cuda:
        torch.cuda.empty_cache()
    return MicroBench(
        dtype=dtype,
        copy_bandwidth_bytes_per_s=nbytes / statistics.median(copy_t),
        matmul_flops_per_s=2.0 * matmul_n**3 / statistics.median(mm_t),  # 2 FLOPs per multiply-add
        gemv_bandwidth_bytes_per_s=gemv_bytes / statistics.median(gemv_t),
        copy_samples_s=copy_t, matmul_samples_s=mm_t, copy_bytes=nbytes, matmul_n=matmul_n,
        gemv_samples_s=gemv_t, gemv_bytes=gemv_bytes,
    )


def probe(device: str = "cpu", dtype: str = "float32", *, run_microbench: bool = True) -> Hardware:
    """Describe the device the sweep runs on; the micro-benchmarks need torch."""
    gpus, driver = gpu_info()
    cpu = cpu_info()
    if device.startswith("cuda"):
        idx = int(device.split(":")[1]) if ":" in device else 0
        gpu = next((g for g in gpus if g.index == idx), None)
        name = gpu.name if gpu else _torch_gpu_name(idx)
        mem = gpu.memory_total_bytes if gpu else None
        hw = Hardware(device_type="cuda", device_name=name, cpu=cpu, gpus=gpus, driver=driver,
                      memory_total_bytes=mem, datasheet=lookup(name))
    else:
        hw = Hardware(device_type="cpu", device_name=cpu.model, cpu=cpu, gpus=gpus, driver=driver,
                      memory_total_bytes=cpu.memory_total_bytes, datasheet=None)
    if run_microbench:
        hw.microbench = microbench(device, dtype)
        if not device.startswith("cuda"):  # what the benchmarks freed must not count in the first point's peak
            from throughputlab.allocator import release_free_memory

            release_free_memory()
    return hw


def _torch_gpu_name(idx: int) -> str:
    import torch

    return torch.cuda.get_device_name(idx)
