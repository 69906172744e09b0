"""The probe's micro-benchmarks, run for real on the CPU at small sizes."""

from __future__ import annotations

import os

import pytest

from _synth import make_profile
from throughputlab.fit import fit_profile, summary_lines
from throughputlab.hardware.probe import microbench
from throughputlab.records.machine import MicroBench


def test_microbench_measures_copy_matrix_vector_and_matmul():
    mb = microbench("cpu", "float32", copy_mib=8, matmul_n=64, gemv_mib=96, repeats=2)
    side_bytes = 4096 * 4096 * 4  # one float32 matrix of the CPU size
    assert mb.gemv_bytes == side_bytes  # 96 MiB asked: one 64 MiB matrix (whole matrices only)
    assert len(mb.gemv_samples_s) == 2 and len(mb.copy_samples_s) == 2 and len(mb.matmul_samples_s) == 2
    # each figure is its bytes (or FLOPs) over the median of its own samples
    assert mb.gemv_bandwidth_bytes_per_s * sorted(mb.gemv_samples_s)[0] <= mb.gemv_bytes * (1 + 1e-9)
    assert mb.gemv_bandwidth_bytes_per_s * sorted(mb.gemv_samples_s)[-1] >= mb.gemv_bytes * (1 - 1e-9)
    assert mb.copy_bytes == 2 * 8 * 2**20
    assert mb.gemv_bandwidth_bytes_per_s > 1e8 and mb.copy_bandwidth_bytes_per_s > 1e8


@pytest.mark.slow
def test_fit_summary_sets_bandwidth_against_copy_and_matrix_vector():
    prof = make_profile(seed=3)
    prof.hardware.microbench = MicroBench(dtype="float32", copy_bandwidth_bytes_per_s=14e9, matmul_flops_per_s=70e9,
                                          gemv_bandwidth_bytes_per_s=7e9)
    r = fit_profile(prof)
    bw = next(e.value for e in r.generation.params if e.name == "bw_bytes_per_s")
    assert r.peaks.microbench_gemv_bytes_per_s == 7e9
    line = next(x for x in summary_lines(r) if "BW vs microbench" in x)
    assert f"BW vs microbench {bw / 14e9:.2f}x (matrix-vector {bw / 7e9:.2f}x)" in line
    # an older profile without the matrix-vector figure says nothing about it
    prof.hardware.microbench.gemv_bandwidth_bytes_per_s = None
    line = next(x for x in summary_lines(fit_profile(prof)) if "BW vs microbench" in x)
    assert "matrix-vector" not in line



@pytest.mark.slow
def test_the_probe_hands_back_what_its_benchmarks_freed_under_tcmalloc():
    """A caching allocator keeps the micro-benchmarks' freed buffers (about 500 MiB here); the
    first point's peak RSS would count them unless the probe releases them."""
    import subprocess
    import sys

    from throughputlab.allocator import find_library

    lib = find_library()
    if lib is None or "tcmalloc" not in lib:
        pytest.skip("no tcmalloc on this machine (apt install libtcmalloc-minimal4)")
    code = (
        "import re, torch\n"
        "from throughputlab.hardware.probe import probe\n"
        "rss = lambda: int(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) * 1024\n"
        "before = rss(); probe('cpu', 'float32'); print(rss() - before)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "LD_PRELOAD": lib})
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[-1]) < 128 * 2 ** 20, r.stdout
