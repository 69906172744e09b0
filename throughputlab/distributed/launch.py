"""Start a distributed training sweep under ``torch.distributed.run`` and see it through.

:func:`run_training_ranks` writes the job file, starts PyTorch's launcher as a child in its
own session, reports progress through :class:`throughputlab.sweep.Hooks` by watching the
profile and its side file, and leaves no process behind: on Ctrl-C, on a failed or killed rank
and at the end :func:`throughputlab.hardware.torchrun.run_launcher` stops the launcher's whole
tree (its process group, then every descendant it has seen, since torchrun starts each rank in
a session of its own). The ranks also die with the launcher's agent (``PR_SET_PDEATHSIG``).

Several machines: call it on each with the same spec and layout, ``layout.node_rank`` set to
the machine's index and ``layout.rdzv_endpoint`` to ``host:port`` of node 0; rank 0 lives on
node 0 (static rendezvous) and the profile is written there.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from throughputlab import scratch
from throughputlab.errors import UserError
from throughputlab.hardware.torchrun import run_launcher
from throughputlab.records.distributed import BACKEND_NAME, IN_FLIGHT, DistributedSpec, RankJob, RanksFile, ranks_path
from throughputlab.records.profile import Profile, TrainPoint
from throughputlab.records.settings import BenchSpec
from throughputlab.spec import resume_differences
from throughputlab.sweep import Hooks

log = logging.getLogger(__name__)

WORKER = "throughputlab.distributed.train_worker"


@dataclass
class RanksResult:
    """How a distributed sweep ended."""

    status: Literal["finished", "failed"]
    returncode: int
    output: Path
    log_path: Path
    profile: Optional[Profile] = None  # None on nodes other than 0 (rank 0 writes it)
    ranks: Optional[RanksFile] = None
    failed_point: Optional[int] = None  # micro-batch in flight when the ranks stopped (recorded `error`)
    message: Optional[str] = None  # why it failed, in a line

    @property
    def ok(self) -> bool:
        return self.status == "finished"


def torchrun_command(job_path: Path, layout: DistributedSpec, python: str = sys.executable,
                     worker: str = WORKER) -> list[str]:
    """``python -m torch.distributed.run`` for the worker; ``--standalone`` on one machine without an endpoint."""
    cmd = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(layout.nproc_per_node),
           "--max-restarts", "0"]
    if layout.nnodes == 1 and layout.rdzv_endpoint is None:
        cmd += ["--standalone"]
    else:
        if layout.rdzv_endpoint is None:
            raise UserError("a run on several nodes needs the rendezvous endpoint of node 0 (rdzv_endpoint HOST:PORT)")
        cmd += ["--nnodes", str(layout.nnodes), "--node-rank", str(layout.node_rank),
                "--rdzv-endpoint", layout.rdzv_endpoint]
    return cmd + ["-m", worker, str(job_path)]


def check_run(spec: BenchSpec, layout: DistributedSpec, output: Path, *, resume: bool, force: bool) -> None:
    """What can be refused before any process starts (node 0 holds the files)."""
    spec.check()
    if not spec.run_train:
        raise UserError("a distributed run measures training only: set only=train")
    if layout.node_rank >= layout.nnodes:
        raise UserError(f"node_rank {layout.node_rank} must be below nnodes {layout.nnodes}")
    if spec.dtype in ("float16", "fp16"):
        raise UserError("--dtype float16: training on ranks takes float32 or bfloat16")
    if layout.node_rank != 0:
        return
    if resume and force:
        raise UserError("--resume and --force contradict each other: choose one")
    if resume:
        if not output.exists():
            raise UserError(f"--resume: {output} does not exist, there is nothing to resume")
        check_resumable(Profile.load(output), ranks_path(output), spec, layout)
    elif output.exists() and not force:
        raise UserError(f"{output} exists: pass resume to continue it or force to overwrite it")


def check_resumable(profile: Profile, side_path: Path, spec: BenchSpec, layout: DistributedSpec) -> Optional[RanksFile]:
    """A resumed run continues a profile only with the same spec (its measured axes may grow) and
    layout (the node's own rank and the endpoint may change); returns the side file, if there is one."""
    if profile.spec is not None:
        diffs, _ = resume_differences(profile.spec, spec)  # the measured axes may grow
        if diffs:
            raise UserError("--resume: the profile was measured with other settings: "
                            + ", ".join(f"{k}={a!r} (now {b!r})" for k, (a, b) in diffs.items()))
    if not side_path.exists():
        return None
    side = RanksFile.load(side_path)
    old = side.layout.model_dump(exclude={"node_rank", "rdzv_endpoint"})
    new = layout.model_dump(exclude={"node_rank", "rdzv_endpoint"})
    if old != new:
        changed = ", ".join(f"{k}={old[k]!r} (now {new[k]!r})" for k in old if old[k] != new[k])
        raise UserError(f"--resume: the profile was measured on another layout: {changed}")
    return side


def run_training_ranks(spec: BenchSpec, layout: DistributedSpec, output: Path, *, resume: bool = False,
                       force: bool = False, hooks: Hooks = Hooks(), env: Optional[dict[str, str]] = None,
                       probe_microbench: bool = True, log_path: Optional[Path] = None, poll_s: float = 0.5,
                       grace_s: float = 15.0, timeout_s: Optional[float] = None,
                       python: str = sys.executable) -> RanksResult:
    """Measure ``spec``'s training sweep on ``layout``'s ranks; returns when the ranks are gone.

    ``env`` adds variables for the ranks; their ``OMP_NUM_THREADS`` is ``layout.threads_per_rank``
    (default 1: on CPU, ranks sharing cores with more threads slow each other 5-10x). The ranks'
    output goes to ``log_path`` (default ``PROFILE.ranks.log``). A rank that dies leaves the
    point it was measuring recorded as ``error``; ``resume=True`` later finishes the sweep
    without re-measuring finished points.
    ``timeout_s`` bounds the whole run (then it is stopped and reported failed).
    """
    output = Path(output)
    spec = spec.model_copy(update={"only": "train"}) if spec.only is None else spec
    check_run(spec, layout, output, resume=resume, force=force)
    log_path = Path(log_path) if log_path is not None else output.with_name(output.stem + ".ranks.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    collectives = measure_rank_collectives(spec, layout) if not resume else None
    with scratch.folder("throughputlab-ranks-") as tmp:
        job_path = Path(tmp) / "job.json"
        cmd = torchrun_command(job_path, layout, python)
        job = RankJob(spec=spec, layout=layout, output=str(output.resolve()), resume=resume,
                      probe_microbench=probe_microbench, command_line=cmd, collectives=collectives)
        job_path.write_text(job.model_dump_json(indent=1))
        # TMPDIR: the launcher's log folders (torchelastic_*) and the ranks' temporary files go in
        # this run's folder, removed with it, rather than one more folder in /tmp per run
        child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1",
                     "OMP_NUM_THREADS": str(layout.threads_per_rank or 1), "TMPDIR": tmp}
        values = None if spec.training.micro_batches == "auto" else list(spec.training.micro_batches)
        hooks.sweep_started("training", len(values) * spec.measurement.rounds if values is not None else None)
        watch = _Watch(output if layout.node_rank == 0 else None, hooks, resume)
        returncode, timed_out = run_launcher(cmd, child_env, log_path, append=resume, poll=watch.poll,
                                             timeout_s=timeout_s, poll_s=poll_s, grace_s=grace_s)
        hooks.sweep_finished("training")
    return _result(output, log_path, returncode, layout, timed_out, timeout_s)


def measure_rank_collectives(spec: BenchSpec, layout: DistributedSpec):
    """The collective benchmark on the ranks' devices of this machine, before the sweep (the
    hardware record keeps it, and the fit takes its rates); None when off, on several machines, or
    when it fails (said in the log: the sweep does not depend on it)."""
    if not layout.collectives or layout.nnodes > 1 or layout.nproc_per_node < 2:
        return None
    from throughputlab.hardware.collectives import CollectiveRunError, measure_collectives

    device = spec.device.split(":")[0]
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        return measure_collectives(layout.nproc_per_node, device, iters=10, warmup=3, timeout_s=300)
    except (CollectiveRunError, UserError) as e:
        log.warning("collectives benchmark skipped: %s", e)
        return None


def _result(output: Path, log_path: Path, returncode: int, layout: DistributedSpec, timed_out: bool,
            timeout_s: Optional[float]) -> RanksResult:
    profile = ranks = None
    if layout.node_rank == 0:
        try:
            profile = Profile.load(output)
        except UserError:
            pass
        side = ranks_path(output)
        if side.exists():
            try:
                ranks = RanksFile.load(side)
            except UserError:
                pass
    in_flight = [p.micro_batch for p in (profile.training if profile else [])
                 if p.backend == BACKEND_NAME and p.status == "error" and p.error == IN_FLIGHT]
    finished = returncode == 0 and (ranks is None or ranks.state == "finished") and not timed_out
    if finished:
        return RanksResult("finished", returncode, output, log_path, profile, ranks)
    reasons = [f"stopped after {timeout_s:g} s (timeout_s)"] if timed_out else []
    if returncode != 0:
        reasons.append(_log_reason(log_path) or f"torch.distributed.run exited with code {returncode}")
    if ranks is not None and ranks.error:
        reasons.append(f"rank 0: {ranks.error}")
    message = "; ".join(reasons) or "the ranks stopped before the sweep finished"
    if in_flight:
        message = f"micro-batch {in_flight[0]} in flight, recorded as error; {message}"
    return RanksResult("failed", returncode, output, log_path, profile, ranks,
                       failed_point=in_flight[0] if in_flight else None, message=message)


def _log_reason(log_path: Path) -> Optional[str]:
    """torchrun's account of the first failure ("Root Cause" in its summary), in a line."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()[-300:]
    except OSError:
        return None
    starts = [i for i, ln in enumerate(lines) if "Root Cause" in ln]
    if starts:
        fields = {}
        for ln in lines[starts[-1] + 1:]:
            key, sep, value = ln.strip().partition(":")
            if sep and key.strip() in ("rank", "exitcode", "traceback") and key.strip() not in fields:
                fields[key.strip()] = value.strip()
            if ln.startswith("====="):
                break
        if fields:
            return "; ".join(f"{k} {v}" for k, v in fields.items())
    hits = [ln.strip() for ln in lines if "Error" in ln]
    return hits[-1][:300] if hits else None


# ---------------------------------------------------------------- progress


class _Watch:
    """Turns rank 0's writes of the profile and side file into hook calls."""

    def __init__(self, output: Optional[Path], hooks: Hooks, resume: bool):
        self.output, self.hooks = output, hooks
        self.side = ranks_path(output) if output is not None else None
        self.seen: dict[tuple, tuple] = {}
        self.mtimes: dict[Path, float] = {}
        self.in_flight: Optional[tuple] = None
        self.announced: set = set()  # (micro-batch, seq_len) started and not yet finished
        if output is not None and resume:
            for p in self._points() or []:
                self.seen[p.key] = _signature(p)
                if p.status in ("ok", "oom"):
                    hooks.point_finished(p, True)

    def _changed(self, path: Path) -> bool:
        try:
            m = path.stat().st_mtime_ns
        except OSError:
            return False
        if self.mtimes.get(path) == m:
            return False
        self.mtimes[path] = m
        return True

    def _points(self) -> Optional[list[TrainPoint]]:
        try:
            return [p for p in Profile.load(self.output).training if p.backend == BACKEND_NAME]
        except UserError:  # not written yet
            return None

    def poll(self) -> None:
        if self.output is None:
            return
        if self._changed(self.side):
            try:
                flight = RanksFile.load(self.side).in_flight
            except UserError:
                flight = None
            now = (flight.micro_batch, flight.started_at) if flight is not None else None
            if now is not None and now != self.in_flight:
                self._start(flight.micro_batch, flight.seq_len)
            self.in_flight = now
        if self._changed(self.output):
            for p in self._points() or []:
                sig = _signature(p)
                if self.seen.get(p.key) != sig:
                    self.seen[p.key] = sig
                    if not (p.status == "error" and p.error == IN_FLIGHT):
                        self._start(p.micro_batch, p.seq_len)  # measured between two polls: never seen in flight
                        self.announced.discard((p.micro_batch, p.seq_len))
                        self.hooks.point_finished(p, False)

    def _start(self, micro_batch: int, seq_len: int) -> None:
        if (micro_batch, seq_len) not in self.announced:
            self.announced.add((micro_batch, seq_len))
            self.hooks.point_started("training", micro_batch)


def _signature(p) -> tuple:
    """What changes when a point (training or generation) is measured further."""
    return (p.status, p.error, len(p.samples), p.rounds, p.remeasured)
