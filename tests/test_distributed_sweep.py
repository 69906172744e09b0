"""The training sweep on gloo ranks under torch.distributed.run, through run_training_ranks.

Real ranks, a real FSDP2 model (the tiny preset), the project's sweep runner inside every
rank; failures are injected through the worker's test hook (``THROUGHPUTLAB_TEST_RANK_FAULT``,
read by the ranks only) or by killing a rank. One launch at a time: each takes about 15 s to
start on a 2-core machine.
"""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from throughputlab.distributed.launch import run_training_ranks
from throughputlab.distributed.trainer import FAIL_ENV
from throughputlab.errors import UserError
from throughputlab.records.distributed import BACKEND_NAME, IN_FLIGHT, DistributedSpec, RanksFile, ranks_path
from throughputlab.records.profile import Profile
from throughputlab.records.settings import BenchSpec
from throughputlab.sweep import Hooks

pytestmark = pytest.mark.slow


def _spec(micro_batches) -> BenchSpec:
    return BenchSpec.model_validate({
        "model": "tiny", "only": "train", "dtype": "float32", "device": "cpu",
        "training": {"micro_batches": micro_batches, "seq_len": 32},
        "measurement": {"rounds": 1, "warmup": 1, "repeats": 1, "max_remeasure": 0},
    })


def _layout(n: int = 2) -> DistributedSpec:
    return DistributedSpec(nproc_per_node=n, comm_profile_steps=1, collective_timeout_s=120, collectives=False)


def _run(path, micro_batches, n=2, **kw):
    return run_training_ranks(_spec(micro_batches), _layout(n), path, probe_microbench=False, timeout_s=300,
                              poll_s=0.2, **kw)


class Recorder(Hooks):
    """Progress as the launcher reports it, and every rank process seen while it ran."""

    def __init__(self, on_start=None):
        self.events: list[tuple] = []
        self.ranks: dict[int, psutil.Process] = {}
        self.on_start = on_start

    def _note_ranks(self):
        for p in psutil.Process().children(recursive=True):
            try:
                if "throughputlab.distributed.train_worker" in " ".join(p.cmdline()):
                    self.ranks.setdefault(p.pid, p)
            except psutil.Error:
                pass

    def point_started(self, kind, x):
        self._note_ranks()
        self.events.append(("started", x))
        if self.on_start is not None:
            self.on_start(self, x)

    def point_finished(self, point, resumed=False):
        self.events.append(("finished", point.micro_batch, point.status, resumed))

    def rank_with(self, rank: int) -> psutil.Process:
        for p in self.ranks.values():
            if p.environ().get("RANK") == str(rank):
                return p
        raise AssertionError(f"rank {rank} not found among {list(self.ranks)}")

    def assert_none_left(self):
        assert self.ranks, "no rank process was seen"
        alive = [p.pid for p in self.ranks.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"ranks left behind: {alive}"
        mine = [p for p in psutil.Process().children(recursive=True) if _is_ours(p)]
        assert not mine, f"processes left behind: {[(p.pid, p.cmdline()) for p in mine]}"


def _is_ours(p: psutil.Process) -> bool:
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return False
    return "torch.distributed.run" in cmd or "throughputlab.distributed" in cmd


def _clean_log(result) -> None:
    text = result.log_path.read_text(errors="replace")
    assert "terminate called" not in text, text[-2000:]


def _by_b(profile: Profile) -> dict:
    return {p.micro_batch: p for p in profile.training if p.backend == BACKEND_NAME}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    path = tmp_path_factory.mktemp("two") / "p.json"
    hooks = Recorder()
    return _run(path, [2, 4], hooks=hooks), hooks


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory, two_ranks):  # after two_ranks: never two launches at once
    path = tmp_path_factory.mktemp("one") / "p.json"
    return _run(path, [2], n=1)


def test_two_ranks_sweep_writes_ok_points_and_rank_records(two_ranks):
    result, hooks = two_ranks
    assert result.ok and result.returncode == 0, result.message
    _clean_log(result)
    points = _by_b(result.profile)
    assert {b: p.status for b, p in points.items()} == {2: "ok", 4: "ok"}
    assert all(p.samples and p.samples[0].step_s > 0 for p in points.values())
    side = RanksFile.load(ranks_path(result.output))
    assert side.state == "finished" and side.world_size == 2 and side.in_flight is None
    for rec in side.points:
        point = points[rec.micro_batch]
        assert rec.rank_micro_batches == [rec.micro_batch // 2] * 2
        assert len(rec.samples) == len(point.samples) and all(len(s.ranks) == 2 for s in rec.samples)
        # the profile's sample is the slowest rank's step, phases included
        for s, r in zip(point.samples, rec.samples):
            assert s.step_s == pytest.approx(r.step_s) and s.forward_s == r.ranks[r.slowest_rank].forward_s
        assert rec.tokens_per_s == pytest.approx(point.tokens_per_s)
        assert rec.tokens_per_s_per_device == pytest.approx(point.tokens_per_s / 2)
        assert len(rec.memory) == 2 and all(m.peak_rss_bytes and m.param_bytes for m in rec.memory)
        assert point.peak_mem_bytes == max(m.peak_rss_bytes for m in rec.memory)
        assert rec.comm is not None and rec.comm.profiled_steps == 1 and "torch.profiler" in rec.comm.method
        assert all(0 < e <= c + 1e-9 for c, e in zip(rec.comm.comm_s, rec.comm.exposed_comm_s))
    # progress came through the hooks: each point started, then finished
    finished = [e for e in hooks.events if e[0] == "finished"]
    assert finished == [("finished", 2, "ok", False), ("finished", 4, "ok", False)]
    assert ("started", 2) in hooks.events and ("started", 4) in hooks.events
    hooks.assert_none_left()


def test_each_rank_holds_half_the_parameter_and_optimizer_bytes(two_ranks, one_rank):
    two, _ = two_ranks
    assert one_rank.ok, one_rank.message
    (single,) = [m for p in one_rank.ranks.points for m in p.memory]
    full = single.param_bytes + single.optimizer_state_bytes
    assert single.param_bytes == 3_950_848 * 4  # the tiny preset's fp32 parameters, measured on the rank
    for m in [m for p in two.ranks.points for m in p.memory]:
        assert m.param_bytes + m.optimizer_state_bytes == pytest.approx(full / 2, rel=0.01)
        assert m.grad_bytes == pytest.approx(single.grad_bytes / 2, rel=0.01)


def test_resume_refuses_another_layout_or_spec(two_ranks):
    result, _ = two_ranks
    with pytest.raises(UserError, match="another layout: nproc_per_node=2 \\(now 4\\)"):
        run_training_ranks(_spec([2, 4]), DistributedSpec(nproc_per_node=4, comm_profile_steps=1,
                                                           collective_timeout_s=120), result.output, resume=True)
    with pytest.raises(UserError, match="other settings: training.seq_len=32"):
        bigger = _spec([2, 4]).model_copy(update={"training": _spec([2, 4]).training.model_copy(update={"seq_len": 64})})
        run_training_ranks(bigger, _layout(), result.output, resume=True)


def test_oom_on_one_rank_is_an_oom_on_all_and_the_sweep_bisects(tmp_path):
    path = tmp_path / "p.json"
    result = _run(path, [2, 4, 8], env={FAIL_ENV: "oom:rank=1:micro_batch=8"})
    assert result.ok, result.message
    _clean_log(result)
    points = _by_b(result.profile)
    assert points[8].status == "oom" and "rank 1" in points[8].error and "out of memory" in points[8].error
    # bisection between 4 (ok) and 8 (oom): 6, then 7 (ranks of 4 and 3 sequences)
    assert {b: p.status for b, p in points.items()} == {2: "ok", 4: "ok", 8: "oom", 6: "ok", 7: "ok"}
    assert [r.rank_micro_batches for r in result.ranks.points if r.micro_batch == 7] == [[4, 3]]


def test_killed_rank_marks_its_point_error_leaves_nothing_and_resume_finishes(tmp_path):
    path = tmp_path / "p.json"

    def kill_rank_1(rec: Recorder, x: int) -> None:
        if x == 4:
            os.kill(rec.rank_with(1).pid, signal.SIGKILL)

    hooks = Recorder(on_start=kill_rank_1)
    # rank 1 stalls at micro-batch 4, so the kill lands while that point is measured
    result = _run(path, [2, 4, 8], hooks=hooks, env={FAIL_ENV: "sleep:rank=1:micro_batch=4:seconds=120"})
    assert not result.ok and result.failed_point == 4, result.message
    assert "micro-batch 4" in result.message
    hooks.assert_none_left()
    points = _by_b(Profile.load(path))
    assert points[2].status == "ok" and points[4].status == "error" and points[4].error == IN_FLIGHT
    assert 8 not in points

    again = Recorder()
    # the resumed run may also grow the sweep: 16 is added, 2 is not measured again
    resumed = _run(path, [2, 4, 8, 16], hooks=again, resume=True)
    assert resumed.ok, resumed.message
    points = _by_b(resumed.profile)
    assert {b: p.status for b, p in points.items()} == {2: "ok", 4: "ok", 8: "ok", 16: "ok"}
    assert ("finished", 2, "ok", True) in again.events  # not measured again
    assert ("started", 2) not in again.events
    assert [r.micro_batch for r in resumed.ranks.points] == [2, 4, 8, 16]
    assert resumed.profile.spec.training.micro_batches == [2, 4, 8, 16]
    again.assert_none_left()


def test_ctrl_c_stops_every_process(tmp_path):
    def interrupt(rec: Recorder, x: int) -> None:
        if x == 4:
            raise KeyboardInterrupt

    hooks = Recorder(on_start=interrupt)
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "p.json", [2, 4, 8], hooks=hooks)
    hooks.assert_none_left()
    points = _by_b(Profile.load(tmp_path / "p.json"))
    assert points[2].status == "ok" and points[4].error == IN_FLIGHT


def test_two_nodes_through_nnodes_node_rank_and_rdzv_endpoint(tmp_path):
    """Two single-rank "machines" on this one: node 1's launcher in another process, node 0's here."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"127.0.0.1:{port}"
    node1 = (f"from pathlib import Path\n"
             f"from tests.test_distributed_sweep import _spec\n"
             f"from throughputlab.distributed.launch import run_training_ranks\n"
             f"from throughputlab.records.distributed import DistributedSpec\n"
             f"r = run_training_ranks(_spec([2]), DistributedSpec(nproc_per_node=1, nnodes=2, node_rank=1, "
             f"rdzv_endpoint={endpoint!r}, comm_profile_steps=1), Path({str(tmp_path / 'node1' / 'p.json')!r}), "
             f"probe_microbench=False, timeout_s=300)\n"
             f"raise SystemExit(0 if r.ok and r.profile is None else 1)\n")
    other = subprocess.Popen([sys.executable, "-c", node1], cwd=os.path.dirname(os.path.dirname(__file__)))
    try:
        layout = DistributedSpec(nproc_per_node=1, nnodes=2, node_rank=0, rdzv_endpoint=endpoint, comm_profile_steps=1)
        result = run_training_ranks(_spec([2]), layout, tmp_path / "p.json", probe_microbench=False, timeout_s=300)
        assert other.wait(timeout=120) == 0
    finally:
        if other.poll() is None:
            other.kill()
    assert result.ok, result.message
    assert result.ranks.world_size == 2 and result.ranks.nodes == 2
    (rec,) = result.ranks.points
    assert rec.nodes == 2 and rec.world_size == 2 and rec.rank_micro_batches == [1, 1] and len(rec.memory) == 2
    assert not (tmp_path / "node1" / "p.json").exists()  # only rank 0, on node 0, writes the profile


def test_cli_bench_on_two_ranks_writes_ok_points_and_leaves_nothing(tmp_path):
    """`throughputlab bench -m tiny --only train --nproc-per-node 2` as a user runs it."""
    import json

    import psutil

    from conftest import assert_user_error, run_cli
    from throughputlab.records.profile import Profile

    out = tmp_path / "ranks.json"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    tmp_before = _launcher_folders()
    r = run_cli("bench", "-m", "tiny", "--only", "train", "--nproc-per-node", "2", "-b", "1,2", "--seq-len", "16",
                "--rounds", "1", "--repeats", "2", "--no-telemetry", "-o", str(out), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "2 ranks" in " ".join(r.stdout.split())
    shown = " ".join(r.stdout.split())
    assert "per rank (2 ranks)" in shown and "optim" in shown and "exposed" in shown  # each rank's shards, measured
    prof = Profile.load(out)
    assert [(p.micro_batch, p.status) for p in prof.training] == [(1, "ok"), (2, "ok")]
    side = json.loads(out.with_name("ranks.ranks.json").read_text())
    assert side["world_size"] == 2
    for p in prof.training:  # every point records its layout
        assert p.layout.world_size == 2 and p.layout.fsdp and not p.layout.activation_checkpointing
    # the launcher timed the collectives on the two ranks first; the hardware record keeps them
    bench = prof.hardware.collectives
    assert bench is not None and bench.world_size == 2 and bench.backend == "gloo"
    assert {op.op for op in bench.ops} == {"all_reduce", "all_gather", "reduce_scatter"}
    assert not ({p.pid for p in psutil.Process().children(recursive=True)} - before)
    # neither launch (the collectives', the sweep's) left its torchelastic_* log folder in the temp folder
    assert _launcher_folders() == tmp_before
    assert_user_error(run_cli("bench", "-m", "tiny", "--nproc-per-node", "2", "-o", str(tmp_path / "x.json")),
                      "add --only train")
    # a bare --resume (the ranks are not in the spec) continues on the two ranks the profile ran on
    r = run_cli("bench", "--resume", "-b", "1,2,3", "-o", str(out), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "2 ranks" in " ".join(r.stdout.split())
    grown = Profile.load(out)
    assert [(p.micro_batch, p.layout.world_size) for p in grown.training] == [(1, 2), (2, 2), (3, 2)]
    assert not ({p.pid for p in psutil.Process().children(recursive=True)} - before)


def _launcher_folders() -> set[str]:
    import glob
    import tempfile

    return set(glob.glob(os.path.join(tempfile.gettempdir(), "torchelastic_*")))


def test_cli_world_sizes_writes_one_profile_per_size_and_prints_the_scaling(tmp_path):
    """`bench --only train --world-sizes 1,2 -b 1,2`: -b per rank, one profile per world size."""
    from conftest import assert_user_error, run_cli
    from throughputlab.records.profile import Profile

    out = tmp_path / "ws.json"
    r = run_cli("bench", "-m", "tiny", "--only", "train", "--world-sizes", "1,2", "-b", "1,2", "--seq-len", "16",
                "--rounds", "1", "--no-telemetry", "--no-collectives", "-o", str(out), timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    for n in (1, 2):
        prof = Profile.load(tmp_path / f"ws.ws{n}.json")
        assert [(p.micro_batch, p.status) for p in prof.training] == [(n, "ok"), (2 * n, "ok")]
        assert all(p.layout.world_size == n and p.layout.fsdp for p in prof.training)
    text = " ".join(r.stdout.split())
    assert "scaling over world sizes" in text and "efficiency" in text and "%" in text
    # a finished size is not measured again by a resumed run
    again = run_cli("bench", "-m", "tiny", "--only", "train", "--world-sizes", "1,2", "-b", "1,2", "--seq-len", "16",
                    "--rounds", "1", "--no-telemetry", "--no-collectives", "-o", str(out), "--resume", timeout=400)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "(resumed)" in again.stdout
    assert_user_error(run_cli("bench", "-m", "tiny", "--world-sizes", "1,2", "-o", str(tmp_path / "x.json")),
                      "add --only train")
    assert_user_error(run_cli("bench", "-m", "tiny", "--only", "train", "--world-sizes", "1,2", "-o", str(out)),
                      "exists: pass --resume")
