"""Telemetry sampler: real readings of a real process tree (pynvml when a driver is present)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from throughputlab.errors import UserError
from throughputlab.telemetry import TelemetrySampler, summarise, throttle_names

BUSY = "import time\nt = time.time()\nwhile time.time() - t < {s}: sum(i * i for i in range(1000))\n"


def _has_nvml() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def test_summary_mean_max_and_throttle_flag():
    s = summarise([{"a": 1.0, "b": 10.0}, {"a": 3.0}], hz=20.0, source="nvml", reasons={"gpu_idle"})
    assert s.mean == {"a": 2.0, "b": 10.0} and s.max == {"a": 3.0, "b": 10.0}
    assert s.n_samples == 2 and not s.throttled and s.throttle_reasons == []
    s = summarise([{"a": 1.0}], hz=20.0, source="nvml", reasons={"gpu_idle", "sw_thermal_slowdown"})
    assert s.throttled and s.throttle_reasons == ["sw_thermal_slowdown"]


def test_throttle_reason_bits():
    assert throttle_names(0x1) == ["gpu_idle"]
    assert throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert throttle_names(0) == []


@pytest.mark.slow
def test_samples_the_process_tree_including_children():
    """A busy child process of the measured pid shows up in CPU utilisation and the process count."""
    child = subprocess.Popen([sys.executable, "-c", BUSY.format(s=3)])
    try:
        time.sleep(0.3)  # let the interpreter start
        sampler = TelemetrySampler(lambda: [os.getpid()], hz=20)
        sampler.start()
        time.sleep(1.5)
        summary = sampler.stop()
    finally:
        child.kill()
        child.wait()
    assert summary.source == ("nvml" if _has_nvml() else "host")
    assert summary.n_samples >= 15  # at least 10 Hz over 1.5 s
    assert summary.hz >= 10
    assert summary.max["proc_count"] >= 2
    assert summary.mean["proc_cpu_pct"] > 50  # the child spins one core
    assert summary.mean["proc_rss_gib"] > 0.005
    assert 0 <= summary.mean["host_cpu_pct"] <= 100
    if summary.source == "nvml":
        assert "gpu_util_pct" in summary.mean and "gpu_mem_used_gib" in summary.mean


@pytest.mark.slow
def test_without_driver_falls_back_to_host():
    if _has_nvml():
        pytest.skip("an NVIDIA driver is present")
    import pynvml

    with pytest.raises(pynvml.NVMLError):
        pynvml.nvmlInit()  # the real library error the sampler turns into host mode
    sampler = TelemetrySampler(lambda: [os.getpid()], hz=50)
    sampler.start()
    time.sleep(0.2)
    s = sampler.stop()
    assert s.source == "host" and not any(k.startswith("gpu_") for k in s.mean)


@pytest.mark.slow
def test_short_point_still_has_a_sample_and_bad_rate_is_refused():
    sampler = TelemetrySampler(lambda: [os.getpid()], hz=10)
    sampler.start()
    s = sampler.stop()
    assert s.n_samples >= 1
    with pytest.raises(UserError, match="--telemetry-hz must be positive"):
        TelemetrySampler(lambda: [os.getpid()], hz=0)


CHURN = """
import time
t = time.time()
while time.time() - t < {s}:
    b = bytearray(64 * 2**20)  # fresh pages from the kernel each time (above the mmap threshold)
    del b
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_minor_fault_rate_shows_allocator_churn():
    def rate(code: str) -> float:
        proc = subprocess.Popen([sys.executable, "-c", code])
        try:
            time.sleep(0.5)
            sampler = TelemetrySampler(lambda: [proc.pid], hz=20)
            sampler.start()
            time.sleep(1.0)
            summary = sampler.stop()
        finally:
            proc.kill()
            proc.wait()
        return summary.mean["proc_minor_faults_per_s"]

    assert rate(CHURN.format(s=5)) > 20_000  # 16k pages per 64 MiB block, many blocks a second
    assert rate("import time; time.sleep(5)") < 1_000
