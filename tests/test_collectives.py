"""Collective micro-benchmarks on 2 gloo ranks of this CPU, run through PyTorch's launcher as a
user would, and the machine topology.

The process checks watch the run's whole process tree (launcher and ranks) while it runs and
require every process seen to be gone afterwards.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import psutil
import pytest

from throughputlab.errors import UserError
from throughputlab.hardware.collectives import (
    CollectiveRunError,
    bus_factor,
    fit_line,
    measure_collectives,
    point_from_samples,
)
from throughputlab.hardware.topology import cpu_topology, gpu_topology, parse_cpulist
from throughputlab.hardware.torchrun import failure_summary
from throughputlab.records.collectives import CollectiveBench, CollectiveFit, CollectiveOp
from throughputlab.throughput import CommParams

RANK_MODULE = "throughputlab.hardware.collectives_rank"


class TreeWatch:
    """Every descendant of ``root`` seen while the watch runs (sampled every 20 ms)."""

    def __init__(self, root: int):
        self.root, self.seen, self.cmdlines, self.parents, self._stop = root, {}, {}, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.is_set():
            try:
                for p in psutil.Process(self.root).children(recursive=True):
                    p = self.seen.setdefault(p.pid, p)
                    try:  # read again while alive: a fresh child shows its parent's command until it execs
                        cmd = " ".join(p.cmdline())
                    except psutil.Error:
                        cmd = ""
                    if cmd:  # a zombie's is empty
                        self.cmdlines[p.pid] = cmd
                    try:
                        self.parents.setdefault(p.pid, p.ppid())
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
            time.sleep(0.02)

    def ranks(self) -> list[psutil.Process]:
        """The launcher's children running the rank module (not a rank's own short-lived forks)."""
        launchers = {pid for pid, cmd in list(self.cmdlines.items()) if "torch.distributed.run" in cmd}
        return [p for pid, p in list(self.seen.items())
                if RANK_MODULE in self.cmdlines.get(pid, "") and self.parents.get(pid) in launchers]

    def wait_for_ranks(self, n: int, timeout: float = 60.0) -> list[psutil.Process]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ranks = [p for p in self.ranks() if _alive(p)]
            if len(ranks) >= n:
                return ranks
            time.sleep(0.05)
        raise AssertionError(f"{n} ranks never appeared")

    def survivors(self) -> list[psutil.Process]:
        return [p for p in list(self.seen.values()) if _alive(p)]

    def kill_survivors(self) -> None:
        """After the checks: a failed test must not leave its run behind to load the machine."""
        for p in self.survivors():
            try:
                if os.getpgid(p.pid) == p.pid:
                    os.killpg(p.pid, signal.SIGKILL)
                p.kill()
            except (psutil.Error, OSError):
                pass


@pytest.fixture
def watch_tree():
    """``watch_tree(pid)`` starts a TreeWatch; at teardown each is stopped and what it saw is killed."""
    watches = []

    def start(root: int) -> TreeWatch:
        w = TreeWatch(root).__enter__()
        watches.append(w)
        return w

    yield start
    for w in watches:
        w.__exit__(None, None, None)
        w.kill_survivors()


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_ranks_busy(ranks: list[psutil.Process], cpu_s: float = 2.0, timeout: float = 60.0) -> None:
    """Until every rank has used ``cpu_s`` of CPU (past importing torch and the rendezvous)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(sum(r.cpu_times()[:2]) >= cpu_s for r in ranks):
                return
        except psutil.Error:
            return
        time.sleep(0.1)


# ---------------------------------------------------------------- pure arithmetic


def test_busbw_formula_by_hand():
    # 4 ranks, 8 MiB in 2 ms (median of three samples)
    s = 8 * 2**20
    p = point_from_samples(s, [0.003, 0.002, 0.001], 4, "all_reduce")
    assert p.time_s == 0.002 and p.count == s // 4
    assert p.algbw_bytes_per_s == pytest.approx(s / 0.002, rel=1e-12)
    assert p.busbw_bytes_per_s == pytest.approx(s / 0.002 * 1.5, rel=1e-12)  # 2(n-1)/n = 1.5
    g = point_from_samples(s, [0.002], 4, "all_gather")
    assert g.busbw_bytes_per_s == pytest.approx(s / 0.002 * 0.75, rel=1e-12)  # (n-1)/n
    assert bus_factor("reduce_scatter", 8) == 7 / 8 and bus_factor("all_reduce", 2) == 1.0


def test_fit_recovers_a_line():
    sizes = [4**k * 1024 for k in range(1, 9)]
    alpha, busbw, f = 30e-6, 20e9, 1.5
    times = [alpha + s * f / busbw for s in sizes]
    fit = fit_line(sizes, times, f)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert fit.busbw_fit_bytes_per_s == pytest.approx(busbw, rel=1e-9)
    assert fit.slope_sizes_bytes == sizes[4:] and fit.alpha_sizes_bytes == sizes[:2]
    assert fit.max_rel_error == pytest.approx(0, abs=1e-9)
    assert fit_line(sizes[:2], times[:2], f) is None  # too few sizes for a line


def test_comm_params_from_the_fits():
    def op(name, busbw, alpha):
        fit = CollectiveFit(alpha_s=alpha, busbw_fit_bytes_per_s=busbw, slope_sizes_bytes=[], alpha_sizes_bytes=[])
        return CollectiveOp(op=name, status="ok", bus_factor=bus_factor(name, 8), fit=fit)

    bench = CollectiveBench(backend="nccl", device="cuda", world_size=8, warmup=1, iters=1,
                            ops=[op("all_reduce", 300e9, 20e-6), op("all_gather", 200e9, 10e-6),
                                 op("reduce_scatter", 100e9, 40e-6)])
    c = CommParams.from_collectives(bench)
    assert (c.tp_busbw_bytes_per_s, c.tp_alpha_s) == (300e9, 20e-6)
    assert c.fsdp_busbw_bytes_per_s == pytest.approx(3 / (2 / 200e9 + 1 / 100e9))  # 150 GB/s
    assert c.fsdp_alpha_s == pytest.approx(20e-6)


_TORCHRUN_FAILURE = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
throughputlab.hardware.collectives FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-12-01_13:10:59
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 18908)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 18908
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-01_13:10:59
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 18909)
  error_file: /tmp/torchelastic_x/error.json
  traceback : Traceback (most recent call last):
    File "collectives_rank.py", line 40, in main
      raise RuntimeError("boom")
  RuntimeError: boom
============================================================
"""


def test_failure_summary_names_the_first_failure_first():
    assert failure_summary(_TORCHRUN_FAILURE) == ("rank 1 exit code 1: RuntimeError: boom; "
                                                  "rank 0 exit code -15 (SIGTERM)")
    assert failure_summary("a\nb\nlast line\n") == "a | b | last line"


def test_bad_arguments_name_the_option():
    with pytest.raises(UserError, match="--nproc"):
        measure_collectives(1)
    with pytest.raises(UserError, match="--ops"):
        measure_collectives(2, ops=["broadcast"])
    with pytest.raises(UserError, match="--sizes"):
        measure_collectives(2, sizes=[4])


# ---------------------------------------------------------------- real runs


@pytest.mark.slow
def test_two_gloo_ranks_measure_three_ops(watch_tree):
    sizes = [4096, 65536, 262144]
    watch = watch_tree(os.getpid())
    bench = measure_collectives(2, "cpu", sizes, iters=5, warmup=1, timeout_s=120)
    # the launcher exits 0 only when every rank did
    assert bench.backend == "gloo" and bench.world_size == 2 and bench.threads_per_rank == 1
    assert [o.op for o in bench.ops] == ["all_reduce", "all_gather", "reduce_scatter"]
    for o in bench.ops:
        if o.status == "unsupported":  # gloo builds without reduce-scatter say so
            assert o.op == "reduce_scatter" and o.error and not o.points
            continue
        assert o.status == "ok", (o.op, o.error)
        assert [p.size_bytes for p in o.points] == sizes
        for p in o.points:
            assert p.status == "ok", (o.op, p)  # the values were checked on every rank
            assert len(p.samples_s) == 5 and p.time_s == statistics.median(p.samples_s)
            assert p.algbw_bytes_per_s == pytest.approx(p.size_bytes / p.time_s, rel=1e-12)
            f = 1.0 if o.op == "all_reduce" else 0.5
            assert p.busbw_bytes_per_s == pytest.approx(p.size_bytes / p.time_s * f, rel=1e-12)
        assert o.fit is not None and o.fit.alpha_sizes_bytes == [4096]
    assert bench.topology is not None and bench.topology.cpu.numa_nodes
    assert CollectiveBench.model_validate_json(bench.model_dump_json()) == bench
    assert len(watch.ranks()) == 2, "the watch never saw the two ranks"
    assert not watch.survivors(), watch.survivors()


@pytest.mark.slow
def test_timeout_kills_the_launcher_and_ranks(watch_tree):
    t0 = time.monotonic()
    watch = watch_tree(os.getpid())
    with pytest.raises(CollectiveRunError, match=r"did not finish within 10 s"):
        measure_collectives(2, "cpu", [64 * 2**20], iters=10_000, warmup=0, timeout_s=10, record_topology=False)
    assert time.monotonic() - t0 < 25
    assert len(watch.ranks()) == 2
    assert not watch.survivors(), watch.survivors()


@pytest.mark.slow
def test_killed_rank_gives_a_clear_error_and_leaves_nothing(watch_tree):
    killed = {}

    def kill_rank_1():
        ranks = watch.wait_for_ranks(2)
        _wait_ranks_busy(ranks)
        r1 = next(p for p in ranks if p.environ().get("LOCAL_RANK") == "1")
        killed["pid"] = r1.pid
        r1.kill()

    watch = watch_tree(os.getpid())
    killer = threading.Thread(target=kill_rank_1, daemon=True)
    killer.start()
    with pytest.raises(CollectiveRunError) as err:
        measure_collectives(2, "cpu", [64 * 2**20], iters=10_000, warmup=0, timeout_s=60, record_topology=False)
    killer.join()
    assert killed, "rank 1 was never killed"
    assert "rank 1 exit code -9 (SIGKILL)" in str(err.value)
    assert not watch.survivors(), watch.survivors()


_CALLER = ("from throughputlab.hardware.collectives import measure_collectives\n"
           "measure_collectives(2, 'cpu', [64 * 2**20], iters=10_000, warmup=0, timeout_s=120)\n")


def _start_caller() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CALLER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _end_caller(caller: subprocess.Popen) -> None:
    if caller.poll() is None:  # a Ctrl-C first, so that the caller cleans up as it should
        caller.send_signal(signal.SIGINT)
        try:
            caller.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(caller.pid, signal.SIGKILL)
            caller.communicate()


@pytest.mark.slow
def test_ctrl_c_leaves_nothing(watch_tree):
    caller = _start_caller()
    try:
        watch = watch_tree(caller.pid)
        _wait_ranks_busy(watch.wait_for_ranks(2))
        caller.send_signal(signal.SIGINT)
        _, err = caller.communicate(timeout=30)
    finally:
        _end_caller(caller)
    assert "KeyboardInterrupt" in err
    assert not watch.survivors(), watch.survivors()


@pytest.mark.slow
def test_killed_caller_leaves_nothing(watch_tree):
    caller = _start_caller()
    try:
        watch = watch_tree(caller.pid)
        _wait_ranks_busy(watch.wait_for_ranks(2))
        caller.kill()  # SIGKILL: no cleanup in the caller; the ranks notice and end the run
        caller.communicate(timeout=30)
        deadline = time.monotonic() + 15
        while watch.survivors() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        _end_caller(caller)
    assert len(watch.ranks()) == 2
    assert not watch.survivors(), watch.survivors()


# ---------------------------------------------------------------- topology


def test_cpu_topology_lists_numa_nodes_and_cores():
    t = cpu_topology()
    assert t.source in ("sysfs", "lscpu")
    assert len(t.numa_nodes) >= 1
    assert t.logical_cores == os.cpu_count()
    assert t.physical_cores is not None and 1 <= t.physical_cores <= t.logical_cores
    assert t.sockets is not None and t.sockets >= 1
    node_cpus = {c for n in t.numa_nodes for c in n.cpus}
    assert set(t.usable_cpus) <= node_cpus and len(node_cpus) == t.logical_cores


def test_parse_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("5") == [5]


def test_gpu_topology_without_a_driver_falls_back():
    g = gpu_topology()
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        has_nvml = True
    except Exception:
        has_nvml = False
    if has_nvml:
        assert g.source == "nvml"
        n = len(g.gpus)
        assert len(g.pairs) == n * (n - 1) // 2
    else:
        assert g.source == "unavailable" and g.note and not g.pairs


@pytest.mark.slow
def test_hardware_command_records_the_collectives_and_a_fit_uses_them(tmp_path):
    """`throughputlab hardware --collectives 2 -o hw.json`: the record carries the benchmark and
    the topology; a profile whose hardware holds it gets the measured rates in its model."""
    import json

    from conftest import run_cli
    from throughputlab.fit import fit_profile
    from throughputlab.records.machine import Hardware

    out = tmp_path / "hw.json"
    r = run_cli("hardware", "--device", "cpu", "--no-bench", "--collectives", "2", "-o", str(out), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "all_reduce" in r.stdout or "all-reduce" in r.stdout
    hw = Hardware.model_validate(json.loads(out.read_text()))
    assert hw.collectives.world_size == 2 and hw.topology is not None
    from _synth import make_profile

    prof = make_profile(concurrencies=(1, 2, 4, 8), micro_batches=(1, 2, 4))
    prof.hardware.collectives = hw.collectives
    comm = fit_profile(prof).model.comm
    assert comm is not None and comm.tp_busbw_bytes_per_s == CommParams.from_collectives(hw.collectives).tp_busbw_bytes_per_s
