"""The rank worker: the project's training sweep, run inside every rank under PyTorch's launcher.

    python -m torch.distributed.run --nproc-per-node N [--nnodes M --node-rank R --rdzv-endpoint HOST:PORT] \\
        -m throughputlab.distributed.train_worker JOB.json

(:func:`throughputlab.distributed.launch.run_training_ranks` writes ``JOB.json``, a
:class:`~throughputlab.records.distributed.RankJob`, and runs that command.) Every rank runs
:func:`throughputlab.sweep.run_training` with an FSDP2 backend whose every result is agreed by
all ranks: the sample a rank hands to the sweep is the slowest rank's step, failures are
all-reduced, and the profile the sweep starts from is rank 0's. So each rank's sweep takes the
same decisions (auto doubling, re-measurement, OOM bisection) and reaches the same collectives.

Rank 0 alone writes the profile, after every point, and beside it ``PROFILE.ranks.json`` with
what each rank measured (:class:`~throughputlab.records.distributed.DistributedPoint`). Before
measuring a point for the first time rank 0 records it in the profile as ``error`` (in flight):
if a rank dies, that is what the profile says, and a resumed run measures it again.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Callable, Optional

import torch
from pydantic import PrivateAttr

from throughputlab.allocator import returns_memory
from throughputlab.backends.torch_common import PeakMemory, release
from throughputlab.distributed import comm, fsdp
from throughputlab.distributed.ranks import (  # noqa: F401  (AgreedUserError: raised here, imported from here)
    AgreedUserError,
    RankContext,
    broadcast_object,
    gather_floats,
    init_ranks,
    rank_main,
)
from throughputlab.distributed.trainer import FSDPTrainer, RankFailure, split_batch
from throughputlab.errors import UserError
from throughputlab.records.distributed import (
    BACKEND_NAME,
    IN_FLIGHT,
    CommTime,
    DistributedPoint,
    InFlight,
    RankJob,
    RankMemory,
    RankSample,
    RanksFile,
    ranks_path,
)
from throughputlab.records.layout import ParallelLayout
from throughputlab.records.profile import Profile, TrainPoint, TrainSample
from throughputlab.sweep import Hooks, Point, run_training

log = logging.getLogger(__name__)



class RankedSample(TrainSample):
    """The sweep's sample (the slowest rank's step), carrying every rank's phases for the side file."""

    _ranks: Optional[RankSample] = PrivateAttr(default=None)


class RankProfile(Profile):
    """The profile as every rank holds it; ``save`` writes only where a writer is set (rank 0)."""

    _writer: Optional[Callable[["RankProfile", Path], None]] = PrivateAttr(default=None)

    def save(self, path) -> None:
        if self._writer is not None:
            self._writer(self, Path(path))


# ---------------------------------------------------------------- the backend the sweep drives


class FSDPTrainingBackend:
    """A training backend (``start/run/close``, memory, OOM test) whose results all ranks share."""

    name = BACKEND_NAME

    def __init__(self, ctx: RankContext, trainer: FSDPTrainer, *, comm_profile_steps: int = 2):
        self.ctx = ctx
        self.trainer = trainer
        self.device = ctx.device
        self.comm_profile_steps = comm_profile_steps
        self._peak = PeakMemory(ctx.device)
        self._retries_at_reset = 0
        self.current: Optional[tuple[int, int]] = None  # (micro_batch, seq_len) of the point being measured
        self.memory: dict[tuple[int, int], list[RankMemory]] = {}  # first visits of this run
        self.comm: dict[tuple[int, int], CommTime] = {}
        self._profile_pending = False

    def start(self) -> None:
        self.trainer.start()

    def begin_point(self, micro_batch: int, seq_len: int, first_visit: bool) -> None:
        """The sweep is about to visit this point (the hooks say so, on every rank alike)."""
        self.current = (micro_batch, seq_len)
        self._profile_pending = first_visit and self.comm_profile_steps > 0

    def run(self, micro_batch: int, seq_len: int) -> RankedSample:
        key = (micro_batch, seq_len)
        if self._profile_pending and key == self.current:
            self._profile_pending = False  # once, even if it fails: a failure is the point's result
            self._profile_comm(key)
        sample = RankSample(ranks=self.trainer.step(self.trainer.global_ids(micro_batch, seq_len)))
        slow = sample.ranks[sample.slowest_rank]
        out = RankedSample(step_s=sample.step_s, forward_s=slow.forward_s, backward_s=slow.backward_s,
                           optimizer_s=slow.optimizer_s)
        out._ranks = sample
        return out

    def _profile_comm(self, key: tuple[int, int]) -> None:
        """A few untimed steps under torch.profiler before the first step of a point's first visit
        (a warm-up call of the sweep, or before the first timed step when there is none)."""
        b, s = key
        steps = self.comm_profile_steps
        cuda = self.device.startswith("cuda")
        comm_s, exposed_s = comm.profile_steps(lambda: self.trainer.step(self.trainer.global_ids(b, s)), steps, cuda)
        rows = gather_floats(self.ctx, [comm_s, exposed_s])
        self.comm[key] = CommTime(method=comm.method(cuda, steps), profiled_steps=steps,
                                  comm_s=[r[0] for r in rows], exposed_comm_s=[r[1] for r in rows])

    def reset_peak_memory(self) -> None:
        self._peak.reset()
        if self.device.startswith("cuda"):
            self._retries_at_reset = int(torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0))

    def peak_memory_bytes(self) -> Optional[int]:
        """The largest peak over the ranks; every rank's figures are kept for the side file."""
        t, cuda = self.trainer, self.device.startswith("cuda")
        opt_bytes = fsdp.optimizer_state_bytes(t.optimizer) if t.optimizer is not None and t.optimizer.state else None
        if cuda:
            stats = torch.cuda.memory_stats(self.device)
            mine = [torch.cuda.max_memory_allocated(self.device), torch.cuda.max_memory_reserved(self.device),
                    int(stats.get("num_alloc_retries", 0)) - self._retries_at_reset, None]
        else:
            mine = [None, None, None, self._peak.peak_bytes()]
        mine += [fsdp.param_bytes(t.model), opt_bytes, t.grad_bytes]
        rows = gather_floats(self.ctx, [-1.0 if v is None else float(v) for v in mine])
        b = self.current[0] if self.current else 0
        counts = split_batch(b, self.ctx.world_size) if b else [0] * self.ctx.world_size

        def opt(v: float) -> Optional[int]:
            return None if v < 0 else int(v)

        per_rank = [RankMemory(micro_batch=counts[r], peak_allocated_bytes=opt(row[0]), peak_reserved_bytes=opt(row[1]),
                               alloc_retries=opt(row[2]), peak_rss_bytes=opt(row[3]), param_bytes=opt(row[4]),
                               optimizer_state_bytes=opt(row[5]), grad_bytes=opt(row[6]))
                    for r, row in enumerate(rows)]
        if self.current is not None:
            self.memory[self.current] = per_rank
        peaks = [m.peak_allocated_bytes if cuda else m.peak_rss_bytes for m in per_rank]
        known = [p for p in peaks if p is not None]
        return max(known) if known else None

    def is_oom(self, exc: BaseException) -> bool:
        return isinstance(exc, RankFailure) and exc.oom

    def release(self) -> None:
        self.trainer.release()
        release(self.device)

    def pids(self) -> list[int]:
        return [os.getpid()]

    def close(self) -> None:
        self.trainer.close()
        release(self.device)


# ---------------------------------------------------------------- rank 0's records


class RankRecords:
    """Rank 0's side file: the layout, one DistributedPoint per training point, the point in flight."""

    def __init__(self, job: RankJob, ctx: RankContext, backend: FSDPTrainingBackend, side: RanksFile):
        self.job, self.ctx, self.backend, self.side = job, ctx, backend, side
        self.path = ranks_path(job.output)

    def write_profile(self, profile: Profile, path: Path) -> None:
        Profile.save(profile, path)
        self.update(profile)
        self.side.save(self.path)

    def update(self, profile: Profile) -> None:
        t = self.backend.trainer
        for point in profile.training:
            if point.backend != BACKEND_NAME:
                continue
            key = (point.micro_batch, point.seq_len)
            old = self.side.find(point.key)
            rec = old.model_copy(deep=True) if old is not None else DistributedPoint(
                micro_batch=point.micro_batch, seq_len=point.seq_len, world_size=self.ctx.world_size,
                nodes=self.ctx.nodes, activation_checkpointing=self.job.layout.activation_checkpointing,
                param_dtype=t.dtype, master_dtype=t.master_dtype, reduce_dtype=t.reduce_dtype,
                rank_micro_batches=split_batch(point.micro_batch, self.ctx.world_size))
            samples = []
            for i, s in enumerate(point.samples):
                if isinstance(s, RankedSample) and s._ranks is not None:
                    samples.append(s._ranks)
                elif old is not None and i < len(old.samples):
                    samples.append(old.samples[i])
            rec.samples = samples
            if key in self.backend.memory:
                rec.memory = self.backend.memory[key]
            if key in self.backend.comm:
                rec.comm = self.backend.comm[key]
            if point.status == "skipped" or (point.status == "error" and point.error == IN_FLIGHT):
                continue  # not measured (yet)
            self.side.put(rec)
        order = {p.key: i for i, p in enumerate(profile.training)}
        self.side.points.sort(key=lambda p: order.get(p.key, len(order)))


class RankHooks(Hooks):
    """Tells the backend which point is measured; on rank 0 records the point in flight first."""

    def __init__(self, ctx: RankContext, profile: RankProfile, path: Path, seq_len: int,
                 backend: FSDPTrainingBackend, records: Optional[RankRecords]):
        self.ctx, self.profile, self.path, self.seq_len = ctx, profile, path, seq_len
        self.backend, self.records = backend, records

    def point_started(self, kind: str, x: int) -> None:
        key = ("training", BACKEND_NAME, x, self.seq_len)
        done = self.profile.find(key)
        first = done is None or done.status not in ("ok", "oom")
        self.backend.begin_point(x, self.seq_len, first)
        if first:  # the same on every rank: the profiles stay alike
            self.profile.add_point(TrainPoint(backend=BACKEND_NAME, micro_batch=x, seq_len=self.seq_len,
                                              status="error", error=IN_FLIGHT))
        if self.records is not None:
            self.records.side.in_flight = InFlight(micro_batch=x, seq_len=self.seq_len, first_visit=first)
            self.profile.save(self.path)

    def point_finished(self, point: Point, resumed: bool = False) -> None:
        if self.records is not None and self.records.side.in_flight is not None:
            self.records.side.in_flight = None
            self.records.side.save(self.records.path)


# ---------------------------------------------------------------- the job


def _prepare(job: RankJob, resolved, dtype: str, device: str) -> tuple[str, str]:
    """Rank 0: the profile and side file to start from (new, or the ones being resumed), as JSON."""
    from throughputlab.distributed.launch import check_resumable
    from throughputlab.hardware.probe import probe
    from throughputlab.machine import environment
    from throughputlab.records.settings import SweepSettings

    spec, layout, path = job.spec, job.layout, Path(job.output)
    side_path = ranks_path(path)
    if job.resume:
        profile = Profile.load(path)
        side = check_resumable(profile, side_path, spec, layout) or RanksFile(
            layout=layout, world_size=layout.world_size, nodes=layout.nnodes)
        side.state, side.error, side.in_flight = "running", None, None
        profile.environment.command_line = job.command_line or profile.environment.command_line
        if profile.spec is not None:
            profile.spec = spec  # the same, apart from the instruments and any axis this run extends
    else:
        hardware = probe(device, dtype, run_microbench=job.probe_microbench)
        if job.collectives is not None:  # timed by the launcher on these ranks' devices
            hardware.collectives = job.collectives
            hardware.topology = job.collectives.topology or hardware.topology
        note = (f"training on {layout.world_size} rank(s) over {layout.nnodes} node(s) under torch.distributed.run, "
                f"FSDP2 (fully_shard per decoder block, then the root), compute in {dtype}, float32 master weights "
                f"and reductions, activation checkpointing {'on' if layout.activation_checkpointing else 'off'}; "
                f"what each rank measured is in {side_path.name}")
        profile = Profile(model=resolved.spec, hardware=hardware, environment=environment(job.command_line),
                          settings=SweepSettings.from_spec(spec, dtype, device.split(":")[0]), spec=spec, notes=[note])
        side = RanksFile(layout=layout, world_size=layout.world_size, nodes=layout.nnodes)
    return profile.model_dump_json(), side.model_dump_json()


def run_job(ctx: RankContext, job: RankJob, dtype: str) -> None:
    from throughputlab.models import resolve_model

    spec = job.spec
    resolved = resolve_model(spec.model, random_weights=spec.random_weights, trust_remote_code=spec.trust_remote_code)
    shared: tuple = (None, None, None)
    if ctx.is_main:
        try:
            shared = (*_prepare(job, resolved, dtype, ctx.device), None)
        except UserError as e:
            shared = (None, None, str(e))
    profile_json, side_json, err = broadcast_object(ctx, shared)
    if err is not None:
        raise AgreedUserError(err)
    profile = RankProfile.model_validate_json(profile_json)
    side = RanksFile.model_validate_json(side_json)
    layout, path = job.layout, Path(job.output)
    trainer = FSDPTrainer(ctx, resolved, dtype=dtype, seed=spec.seed, lr=layout.lr,
                          activation_checkpointing=layout.activation_checkpointing)
    backend = FSDPTrainingBackend(ctx, trainer, comm_profile_steps=layout.comm_profile_steps)
    records = RankRecords(job, ctx, backend, side) if ctx.is_main else None
    if records is not None:
        profile._writer = records.write_profile
    values = None if spec.training.micro_batches == "auto" else list(spec.training.micro_batches)
    point_layout = ParallelLayout.training(ctx.world_size, ctx.nodes, fsdp=True,
                                           activation_checkpointing=layout.activation_checkpointing)
    limit = resolved.spec.max_position_embeddings
    try:
        backend.start()
        profile.save(path)
        for seq_len in spec.training.all_seq_lens:  # the sequence-length axis
            if limit and seq_len > limit:
                continue
            run_training(profile, path, backend, values, seq_len=seq_len, hygiene=spec.measurement,
                         hooks=RankHooks(ctx, profile, path, seq_len, backend, records), layout=point_layout,
                         warm_each_visit=returns_memory(ctx.device))
        side.state, side.in_flight = "finished", None
    except BaseException as e:
        # on the way out: the launcher's SIGTERM (a peer died) must not cut the last save short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        side.state, side.error = "failed", f"{type(e).__name__}: {e}".strip()[:500]
        log.warning("the sweep stopped: %s", side.error)
        raise
    finally:
        profile.environment.torch_threads = torch.get_num_threads()
        profile.save(path)
        backend.close()


def resolve_run_dtype(dtype: str, device: str) -> str:
    from throughputlab.hardware.probe import resolve_dtype

    resolved = resolve_dtype(dtype, device)
    if resolved not in ("float32", "bfloat16"):
        raise UserError(f"--dtype {dtype}: training on ranks takes float32 or bfloat16 (bf16 compute, fp32 master "
                        "weights), not float16")
    return resolved


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point of one rank; always ends the process (0: the sweep finished)."""
    def body(job: RankJob) -> None:
        device = "cuda" if job.spec.device.startswith("cuda") or (
            job.spec.device == "auto" and torch.cuda.is_available()) else "cpu"
        dtype = resolve_run_dtype(job.spec.dtype, device)
        ctx = init_ranks(device, threads=job.layout.threads_per_rank, timeout_s=job.layout.collective_timeout_s)
        run_job(ctx, job, dtype)

    rank_main(argv, "throughputlab.distributed.train_worker", body)


if __name__ == "__main__":
    main()
