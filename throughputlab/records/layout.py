"""The parallel layout a point was measured with: how many devices, and how they were used.

A point without a layout (profiles written before layouts were recorded, and single-device
runs of older versions) is one device: world size 1, no tensor or data parallelism, no FSDP.
No torch import.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from throughputlab.records.base import Record

Count = Annotated[int, Field(gt=0)]


class ParallelLayout(Record):
    """Devices of one point and their roles.

    Generation: ``dp`` engine replicas of ``tp`` devices each, measured together (``world_size``
    = dp * tp). Training: ``world_size`` FSDP ranks (``fsdp``), with activation checkpointing
    or not."""

    world_size: Count = 1
    nodes: Count = 1
    tp: Count = 1  # tensor parallel: devices per generation engine
    dp: Count = 1  # data parallel: generation engine replicas, or training ranks
    fsdp: bool = False
    activation_checkpointing: bool = False

    @classmethod
    def generation(cls, tp: int = 1, dp: int = 1, nodes: int = 1) -> "ParallelLayout":
        return cls(world_size=tp * dp, nodes=nodes, tp=tp, dp=dp)

    @classmethod
    def training(cls, world_size: int = 1, nodes: int = 1, *, fsdp: bool = False,
                 activation_checkpointing: bool = False) -> "ParallelLayout":
        return cls(world_size=world_size, nodes=nodes, dp=world_size, fsdp=fsdp,
                   activation_checkpointing=activation_checkpointing)

    def describe(self) -> str:
        if self.world_size == 1 and not self.fsdp:
            return "1 device"
        parts = [f"{self.world_size} devices"] + ([f"{self.nodes} nodes"] if self.nodes > 1 else [])
        if self.fsdp:
            parts.append("FSDP" + (", activation checkpointing" if self.activation_checkpointing else ""))
        else:
            parts.append(f"{self.dp} engine(s) x TP {self.tp}")
        return ", ".join(parts)


SINGLE = ParallelLayout()
