"""What a distributed training run is asked to do and what it records per point; no torch import.

:class:`DistributedSpec` is the parallel layout (ranks, nodes, activation checkpointing) beside
the bench spec; :class:`RankJob` is the file every rank reads. :class:`DistributedPoint` is the
per-point record of what each rank measured. Until the profile's ``TrainPoint`` carries it, the
records live in a side file next to the profile, ``PROFILE.ranks.json`` (:class:`RanksFile`),
written by rank 0 whenever it writes the profile. ``DistributedPoint.samples[i]`` belongs to
``TrainPoint.samples[i]`` of the point with the same key.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Annotated, Literal, Optional

from pydantic import Field, ValidationError

from throughputlab.errors import UserError
from throughputlab.records.base import Record, now_iso, write_atomic
from throughputlab.records.collectives import CollectiveBench
from throughputlab.records.settings import BenchSpec

RANKS_SCHEMA_VERSION = 1
BACKEND_NAME = "torch-fsdp"  # TrainPoint.backend of points measured on ranks
IN_FLIGHT = "in flight: the ranks stopped before this point finished"  # error of a point marked before measuring


class DistributedSpec(Record):
    """The parallel layout of a training run under ``torch.distributed.run``."""

    nproc_per_node: Annotated[int, Field(gt=0)] = 2
    nnodes: Annotated[int, Field(gt=0)] = 1
    node_rank: Annotated[int, Field(ge=0)] = 0
    rdzv_endpoint: Optional[str] = None  # host:port of node 0; None on one machine (a free local port)
    activation_checkpointing: bool = False  # non-reentrant, each decoder block, applied before sharding
    threads_per_rank: Optional[Annotated[int, Field(gt=0)]] = None  # None: 1 on CPU, torch's default on CUDA
    comm_profile_steps: Annotated[int, Field(ge=0)] = 2  # steps under torch.profiler per point (0: none)
    collective_timeout_s: Annotated[float, Field(gt=0)] = 600.0  # a rank stuck this long in a collective stops
    lr: Annotated[float, Field(gt=0)] = 1e-5  # AdamW, as the single-process torch backend
    collectives: bool = True  # time the collectives on these ranks' devices before the sweep (one machine)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


class RankJob(Record):
    """The settings file every rank reads (the launcher writes it)."""

    spec: BenchSpec
    layout: DistributedSpec
    output: str  # the profile; rank 0 writes it and ``ranks_path(output)``
    resume: bool = False
    probe_microbench: bool = True  # the hardware probe's copy/matmul benchmarks (rank 0, a few seconds)
    collectives: Optional[CollectiveBench] = None  # measured by the launcher before the sweep
    device: Optional[str] = None  # generation replicas: "cuda" or "cpu", as the launcher resolved it
    devices: list[str] = []  # generation replicas: per local rank, its CUDA devices ("0,1") or CPU cores ("0|1")
    command_line: list[str] = []


# ---------------------------------------------------------------- per point


class RankPhases(Record):
    """One rank's phases of one micro-step, each timed between this rank's device synchronisations."""

    forward_s: float
    backward_s: float
    optimizer_s: float

    @property
    def step_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s


class RankSample(Record):
    """One micro-step on every rank (index = global rank). The step's time is the slowest rank's."""

    ranks: list[RankPhases]

    @property
    def step_s(self) -> float:
        return max(r.step_s for r in self.ranks)

    @property
    def slowest_rank(self) -> int:
        return max(range(len(self.ranks)), key=lambda i: self.ranks[i].step_s)


class RankMemory(Record):
    """One rank's memory over a point's first visit; the bytes of its shards as measured on the
    rank (sum of the local tensors' sizes), not computed from the parameter count."""

    micro_batch: int  # sequences of the global micro-batch this rank trained on
    peak_allocated_bytes: Optional[int] = None  # CUDA allocator peak
    peak_reserved_bytes: Optional[int] = None  # CUDA allocator peak reserved
    alloc_retries: Optional[int] = None  # CUDA num_alloc_retries during the point (cache flushes to fit)
    peak_rss_bytes: Optional[int] = None  # CPU: the process's peak resident set
    param_bytes: Optional[int] = None  # this rank's parameter shards
    optimizer_state_bytes: Optional[int] = None  # this rank's AdamW states (exp_avg, exp_avg_sq, step)
    grad_bytes: Optional[int] = None  # this rank's gradient shards after the reduce-scatter


class CommTime(Record):
    """Communication per micro-step from a few profiled steps, per rank (index = global rank)."""

    method: str  # how it was measured, in words
    profiled_steps: int
    comm_s: list[float]  # collectives' busy time per step (union of their spans)
    exposed_comm_s: list[float]  # the part of it no compute overlapped


class DistributedPoint(Record):
    """What one training point measured on every rank."""

    backend: str = BACKEND_NAME
    micro_batch: int  # global: the sequences of one micro-step over all ranks
    seq_len: int
    world_size: int
    nodes: int
    fsdp: bool = True
    activation_checkpointing: bool = False
    param_dtype: str  # the dtype the forward and backward run in
    master_dtype: str  # the dtype of the sharded parameters and AdamW states
    reduce_dtype: str  # the gradients' reduce-scatter dtype
    rank_micro_batches: list[int]  # sequences per rank (a rank with 0 runs one sequence at loss weight 0)
    samples: list[RankSample] = []  # aligned with the TrainPoint's samples
    memory: list[RankMemory] = []  # per rank, first visit
    comm: Optional[CommTime] = None
    measured_at: str = Field(default_factory=now_iso)

    @property
    def key(self) -> tuple:
        return ("training", self.backend, self.micro_batch, self.seq_len)

    @property
    def step_s(self) -> Optional[float]:
        return statistics.median([s.step_s for s in self.samples]) if self.samples else None

    @property
    def tokens_per_s(self) -> Optional[float]:
        """All ranks together: the global micro-batch's tokens over the slowest rank's step."""
        t = self.step_s
        return self.micro_batch * self.seq_len / t if t else None

    @property
    def tokens_per_s_per_device(self) -> Optional[float]:
        t = self.tokens_per_s
        return t / self.world_size if t is not None else None


class InFlight(Record):
    """The point the ranks are measuring now (rank 0 writes it before measuring)."""

    micro_batch: int
    seq_len: int
    first_visit: bool
    started_at: str = Field(default_factory=now_iso)


class RanksFile(Record):
    """``PROFILE.ranks.json``: the layout of the run and one record per training point."""

    schema_version: Literal[1] = RANKS_SCHEMA_VERSION
    layout: DistributedSpec
    world_size: int
    nodes: int
    points: list[DistributedPoint] = []
    in_flight: Optional[InFlight] = None
    state: Literal["running", "finished", "failed"] = "running"
    error: Optional[str] = None  # why the ranks stopped, when they know

    def find(self, key: tuple) -> Optional[DistributedPoint]:
        return next((p for p in self.points if p.key == key), None)

    def put(self, point: DistributedPoint) -> None:
        self.points = [p for p in self.points if p.key != point.key] + [point]

    def save(self, path: str | os.PathLike) -> None:
        write_atomic(Path(path), self.model_dump_json(indent=1))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RanksFile":
        path = Path(path)
        try:
            return cls.model_validate(json.loads(path.read_text()))
        except FileNotFoundError:
            raise UserError(f"{path} does not exist") from None
        except (ValueError, ValidationError) as e:
            raise UserError(f"{path} is not a valid ranks file: {str(e).splitlines()[0]}") from None


def ranks_path(profile_path: str | os.PathLike) -> Path:
    """The side file of a profile: ``run.json`` -> ``run.ranks.json``."""
    p = Path(profile_path)
    return p.with_name(p.stem + ".ranks.json")
