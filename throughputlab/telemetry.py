"""Per-point telemetry: a background thread samples the device and the host while a point runs.

With an NVIDIA driver (pynvml): GPU utilisation, memory used, power, SM and memory clocks,
temperature and clock-event (throttle) reasons of the GPUs this process may use. Always, and
as the only source without a driver: CPU utilisation and resident memory of the measured
process tree (the given pids and all their children, so engine subprocesses count). The
summary keeps mean and max per metric and flags throttling other than idle.

Cheap by construction: /proc reads and NVML queries only, the process tree is re-listed once
a second rather than every sample. ``benchmarks/telemetry_overhead.py`` measures the cost.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Optional

from throughputlab.records.profile import TelemetrySummary

log = logging.getLogger(__name__)

# NVML clock-event reason bits (nvml.h, nvmlClocksEventReason*); "gpu_idle" is not throttling.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
_TREE_REFRESH_S = 1.0


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def summarise(samples: list[dict[str, float]], hz: float, source: str, reasons: set[str]) -> TelemetrySummary:
    """Mean and max per metric over the samples that have it."""
    keys = sorted({k for s in samples for k in s})
    mean, peak = {}, {}
    for k in keys:
        xs = [s[k] for s in samples if k in s]
        mean[k] = sum(xs) / len(xs)
        peak[k] = max(xs)
    throttling = sorted(r for r in reasons if r != "gpu_idle")
    return TelemetrySummary(source=source, hz=hz, n_samples=len(samples), mean=mean, max=peak,
                            throttled=bool(throttling), throttle_reasons=throttling)


class _Nvml:
    """GPU readings through pynvml, for the GPUs visible to this process."""

    def __init__(self):
        import pynvml

        pynvml.nvmlInit()  # raises NVMLError_LibraryNotFound / DriverNotLoaded without a driver
        self.nv = pynvml
        count = pynvml.nvmlDeviceGetCount()
        indices = list(range(count))
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and visible.strip():
            picked = [int(x) for x in visible.split(",") if x.strip().isdigit() and int(x) < count]
            indices = picked or indices  # UUIDs or MIG names: fall back to every GPU
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices]
        get = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._reasons = get or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons

    def read(self, reasons: set[str]) -> dict[str, float]:
        nv = self.nv
        util, mem, power, sm, memclk, temp = [], [], [], [], [], []
        for h in self.handles:
            for fn, out in ((lambda: nv.nvmlDeviceGetUtilizationRates(h).gpu, util),
                            (lambda: nv.nvmlDeviceGetMemoryInfo(h).used, mem),
                            (lambda: nv.nvmlDeviceGetPowerUsage(h) / 1e3, power),  # mW -> W
                            (lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM), sm),
                            (lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM), memclk),
                            (lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU), temp)):
                try:
                    out.append(float(fn()))
                except nv.NVMLError:
                    pass  # not supported on this GPU (e.g. power on some boards): leave it out
            try:
                reasons.update(throttle_names(int(self._reasons(h))))
            except nv.NVMLError:
                pass
        s: dict[str, float] = {}
        if util:
            s["gpu_util_pct"] = sum(util) / len(util)
        if mem:
            s["gpu_mem_used_gib"] = sum(mem) / 2**30
        if power:
            s["gpu_power_w"] = sum(power)
        if sm:
            s["gpu_sm_clock_mhz"] = min(sm)
        if memclk:
            s["gpu_mem_clock_mhz"] = min(memclk)
        if temp:
            s["gpu_temp_c"] = max(temp)
        return s

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except Exception:
            pass


class _ProcessTree:
    """CPU utilisation and resident memory of some processes and all their descendants."""

    def __init__(self, pids: Callable[[], list[int]]):
        import psutil

        self.psutil = psutil
        self.pids = pids
        self.procs: dict[int, object] = {}
        self.faults: dict[int, tuple[int, float]] = {}  # pid -> (minor faults, when read)
        self.listed_at = -1e9
        psutil.cpu_percent(None)  # prime the system-wide counter

    def _refresh(self) -> None:
        ps = self.psutil
        roots = []
        for pid in self.pids():
            try:
                roots.append(ps.Process(pid))
            except ps.Error:
                pass
        found = {}
        for r in roots:
            found[r.pid] = r
            try:
                for c in r.children(recursive=True):
                    if _is_profiler(c):
                        continue  # py-spy, when --py-spy runs beside us, is not part of the workload
                    found[c.pid] = c
            except ps.Error:
                pass
        # keep the Process objects we already have: cpu_percent() measures since their last call
        procs = {}
        for pid, p in found.items():
            old = self.procs.get(pid)
            procs[pid] = old if old is not None else p
            if old is None:
                try:
                    p.cpu_percent(None)
                except ps.Error:
                    pass
        self.procs = procs
        self.listed_at = time.monotonic()

    def read(self) -> dict[str, float]:
        ps = self.psutil
        if time.monotonic() - self.listed_at > _TREE_REFRESH_S:
            self._refresh()
        cpu = rss = 0.0
        n = 0
        fault_rate: Optional[float] = None
        now = time.monotonic()
        for pid, p in list(self.procs.items()):
            try:
                with p.oneshot():
                    cpu += p.cpu_percent(None)
                    rss += p.memory_info().rss
                n += 1
            except ps.Error:
                self.procs.pop(pid, None)
                continue
            faults = minor_faults(pid)
            if faults is None:
                continue
            last = self.faults.get(pid)
            self.faults[pid] = (faults, now)
            if last is not None and now > last[1]:
                fault_rate = (fault_rate or 0.0) + (faults - last[0]) / (now - last[1])
        out = {"proc_cpu_pct": cpu,  # summed over the tree; 100 = one core busy
               "proc_rss_gib": rss / 2**30,
               "proc_count": float(n),
               "host_cpu_pct": ps.cpu_percent(None)}  # whole machine, 100 = every core busy
        if fault_rate is not None:
            # pages the kernel had to hand the tree (and zero): on CPU, allocator churn that costs step time
            out["proc_minor_faults_per_s"] = fault_rate
        return out


def minor_faults(pid: int) -> Optional[int]:
    """Minor page faults of a process so far (Linux /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
        return int(text[text.rindex(")") + 2:].split()[7])  # field 10, minflt, after "pid (comm) "
    except (OSError, ValueError, IndexError):
        return None


def _is_profiler(p) -> bool:
    try:
        return p.name() == "py-spy"
    except Exception:
        return False


class TelemetrySampler:
    """Samples at ``hz`` in a daemon thread between ``start()`` and ``stop()``."""

    def __init__(self, pids: Callable[[], list[int]], hz: float = 20.0):
        if not hz > 0:
            from throughputlab.errors import UserError

            raise UserError(f"--telemetry-hz must be positive, got {hz}")
        self.pids = pids
        self.hz = float(hz)
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._samples: list[dict[str, float]] = []
        self._reasons: set[str] = set()
        self._nvml: Optional[_Nvml] = None
        self._tree: Optional[_ProcessTree] = None
        self._t0 = self._t1 = 0.0
        self.source = "host"
        self.cpu_s = 0.0  # CPU time the sampling thread used (its own overhead), set by stop()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("TelemetrySampler already started")
        self._nvml = _open_nvml()
        self.source = "nvml" if self._nvml is not None else "host"
        self._tree = _ProcessTree(self.pids)
        self._tree._refresh()
        self._samples, self._reasons = [], set()
        self._stop.clear()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="throughputlab-telemetry", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        s: dict[str, float] = {}
        try:
            if self._nvml is not None:
                s.update(self._nvml.read(self._reasons))
            s.update(self._tree.read())
        except Exception as e:  # telemetry must never break a measurement
            log.debug("telemetry sample failed: %s", e)
        if s:
            self._samples.append(s)

    def _loop(self) -> None:
        cpu0 = time.thread_time()
        period = 1.0 / self.hz
        # The first reading of a cpu_percent counter covers the time since priming: wait one period.
        next_t = time.monotonic() + period
        while not self._stop.wait(max(0.0, next_t - time.monotonic())):
            self._sample()
            next_t += period
            if next_t < time.monotonic():  # fell behind (a loaded machine): don't burst to catch up
                next_t = time.monotonic() + period
        self.cpu_s = time.thread_time() - cpu0

    def stop(self) -> TelemetrySummary:
        if self._thread is None:
            raise RuntimeError("TelemetrySampler.stop() before start()")
        self._stop.set()
        self._thread.join(timeout=5)
        self._thread = None
        self._t1 = time.monotonic()
        if not self._samples:
            self._sample()  # a point shorter than one period still gets one reading
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None
        span = self._t1 - self._t0
        rate = len(self._samples) / span if span > 0 and len(self._samples) > 1 else self.hz
        return summarise(self._samples, round(rate, 2), self.source, self._reasons)

    @property
    def samples(self) -> list[dict[str, float]]:
        """The raw readings of the last run (the profile keeps only the summary)."""
        return list(self._samples)


def _open_nvml() -> Optional[_Nvml]:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        nv = _Nvml()
    except pynvml.NVMLError as e:  # NVMLError_LibraryNotFound on machines without a driver
        log.debug("no NVML (%s): host telemetry only", e)
        return None
    if not nv.handles:
        nv.close()
        return None
    return nv


def open_sampler(pids: Callable[[], list[int]], hz: float = 20.0) -> TelemetrySampler:
    return TelemetrySampler(pids, hz)
