"""How the devices of one machine are connected, as a record: GPU pairs over NVLink or PCIe,
and the CPU's sockets, NUMA nodes and cores (throughputlab.hardware.topology reads them).
What could not be read is ``None`` (or an empty list), and each part says which source it
came from."""

from __future__ import annotations

from typing import Literal, Optional

from throughputlab.records.base import Record


class NumaNode(Record):
    index: int
    cpus: list[int]
    memory_total_bytes: Optional[int] = None


class CpuTopology(Record):
    source: Literal["sysfs", "lscpu", "none"]  # where the NUMA nodes were read
    sockets: Optional[int] = None
    physical_cores: Optional[int] = None
    logical_cores: Optional[int] = None
    numa_nodes: list[NumaNode] = []
    usable_cpus: list[int] = []  # this process's affinity (containers and taskset restrict it)


PciePath = Literal["same_board", "single_switch", "multiple_switches", "host_bridge", "numa_node", "system"]
LinkKind = Literal["nvlink", "pcie", "unknown"]


class GpuLinks(Record):
    index: int
    pci_bus_id: Optional[str] = None
    nvlink_active_links: Optional[int] = None  # None: NVML could not say (no NVLink support reads as 0)


class GpuPair(Record):
    gpu_a: int
    gpu_b: int
    link: LinkKind
    nvlink_p2p: Optional[bool] = None  # NVML's NVLink peer-to-peer status for the pair
    pcie_path: Optional[PciePath] = None  # nearest common PCIe ancestor (nvidia-smi topo -m: PIX, PXB, PHB, NODE, SYS)


class GpuTopology(Record):
    source: Literal["nvml", "unavailable"]
    note: Optional[str] = None  # why NVML could not be read
    gpus: list[GpuLinks] = []
    pairs: list[GpuPair] = []


class Topology(Record):
    cpu: CpuTopology
    gpu: GpuTopology
