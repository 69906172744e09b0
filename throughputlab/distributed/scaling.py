"""Scaling over world sizes: the training sweep on 1, 2, 4, ... ranks of one machine, one profile
each, and how the throughput per device holds up (weak scaling: the same micro-batch per rank).

``world_size_output(path, n)`` names each run's profile; ``scaling_rows(profiles)`` compares them.
No torch import.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from throughputlab.errors import UserError
from throughputlab.records.profile import Profile


def world_size_output(path: Path, n: int) -> Path:
    """``run.json`` -> ``run.ws2.json``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.ws{n}{path.suffix or '.json'}")


def check_world_sizes(sizes: list[int], cores_or_gpus: Optional[int] = None) -> list[int]:
    out = sorted(set(sizes))
    if cores_or_gpus is not None and out[-1] > cores_or_gpus:
        raise UserError(f"--world-sizes {out[-1]} needs {out[-1]} devices, this machine has {cores_or_gpus}: "
                        "drop the larger sizes")
    return out


def per_rank_micro_batches(micro_batches, n: int):
    """The global micro-batches of an n-rank run for per-rank values (``auto`` stays ``auto``)."""
    return micro_batches if micro_batches == "auto" else [b * n for b in micro_batches]


@dataclass
class ScalingRow:
    per_rank: int  # sequences per rank per micro-step
    world_size: int
    tokens_per_s: float  # all ranks together
    tokens_per_s_per_device: float
    efficiency: Optional[float]  # per-device tokens/s over the smallest world size's, same per-rank micro-batch


def scaling_rows(profiles: list[Profile]) -> list[ScalingRow]:
    """One row per (per-rank micro-batch, world size) measured ok, in that order."""
    measured: dict[tuple[int, int], float] = {}
    for prof in profiles:
        for p in prof.training:
            n = p.parallel.world_size
            if p.status == "ok" and p.tokens_per_s and p.micro_batch % n == 0:
                measured[(p.micro_batch // n, n)] = p.tokens_per_s
    rows = []
    for m in sorted({m for m, _ in measured}):
        sizes = sorted(n for mm, n in measured if mm == m)
        base = measured[(m, sizes[0])] / sizes[0]
        for n in sizes:
            per_dev = measured[(m, n)] / n
            eff = None if len(sizes) == 1 else per_dev / base  # nothing to compare with at this batch
            rows.append(ScalingRow(m, n, measured[(m, n)], per_dev, eff))
    return rows
