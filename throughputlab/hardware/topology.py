"""How the devices of one machine are connected: GPU pairs over NVLink or PCIe (through NVML),
and the CPU's sockets, NUMA nodes and cores (from sysfs, else ``lscpu``).

A collective's speed depends on the path between the ranks, so a collective benchmark records
the topology beside its figures. Nothing here fails for want of a driver or a file: what
cannot be read is ``None`` (or an empty list) and the record says which source it came from.
pynvml is imported lazily.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from pathlib import Path
from typing import Literal, Optional

from throughputlab.records.topology import CpuTopology, GpuLinks, GpuPair, GpuTopology, LinkKind, NumaNode, Topology

log = logging.getLogger(__name__)

_SYS_NODE = Path("/sys/devices/system/node")
_SYS_CPU = Path("/sys/devices/system/cpu")


def topology() -> Topology:
    return Topology(cpu=cpu_topology(), gpu=gpu_topology())


# ---------------------------------------------------------------- CPU


def cpu_topology() -> CpuTopology:
    """Sockets, physical cores and NUMA nodes from sysfs; ``lscpu -p`` where sysfs lacks them."""
    try:
        usable = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = []
    nodes = _sysfs_numa_nodes()
    sockets, cores = _sysfs_sockets_cores()
    source: Literal["sysfs", "lscpu", "none"] = "sysfs" if nodes else "none"
    if not nodes or sockets is None:
        l_nodes, l_sockets, l_cores = _lscpu()
        if not nodes and l_nodes:
            nodes, source = l_nodes, "lscpu"
        sockets = sockets if sockets is not None else l_sockets
        cores = cores if cores is not None else l_cores
    return CpuTopology(source=source, sockets=sockets, physical_cores=cores, logical_cores=os.cpu_count(),
                       numa_nodes=nodes, usable_cpus=usable)


def parse_cpulist(text: str) -> list[int]:
    """The kernel's CPU list format ("0-3,8,10-11") as a sorted list."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def _sysfs_numa_nodes() -> list[NumaNode]:
    nodes = []
    try:
        entries = sorted(_SYS_NODE.glob("node[0-9]*"), key=lambda p: int(p.name[4:]))
    except OSError:
        return []
    for d in entries:
        try:
            cpus = parse_cpulist((d / "cpulist").read_text())
        except (OSError, ValueError):
            continue
        mem = None
        try:
            m = re.search(r"MemTotal:\s+(\d+)\s*kB", (d / "meminfo").read_text())
            mem = int(m.group(1)) * 1024 if m else None
        except OSError:
            pass
        nodes.append(NumaNode(index=int(d.name[4:]), cpus=cpus, memory_total_bytes=mem))
    return nodes


def _sysfs_sockets_cores() -> tuple[Optional[int], Optional[int]]:
    packages, cores = set(), set()
    for d in _SYS_CPU.glob("cpu[0-9]*/topology"):
        try:
            pkg = int((d / "physical_package_id").read_text())
            core = int((d / "core_id").read_text())
        except (OSError, ValueError):
            return None, None
        packages.add(pkg)
        cores.add((pkg, core))
    return (len(packages), len(cores)) if packages else (None, None)


def _lscpu() -> tuple[list[NumaNode], Optional[int], Optional[int]]:
    """``lscpu -p=CPU,CORE,SOCKET,NODE``: one line per logical CPU, '#' comments."""
    try:
        out = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET,NODE"], capture_output=True, text=True, timeout=10,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return [], None, None
    by_node: dict[int, list[int]] = {}
    sockets, cores = set(), set()
    for line in out.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        fields = line.split(",")
        try:
            cpu, core, sock = int(fields[0]), int(fields[1]), int(fields[2])
        except (IndexError, ValueError):
            continue
        node = int(fields[3]) if len(fields) > 3 and fields[3].strip().isdigit() else 0
        by_node.setdefault(node, []).append(cpu)
        sockets.add(sock)
        cores.add((sock, core))
    nodes = [NumaNode(index=i, cpus=sorted(c)) for i, c in sorted(by_node.items())]
    return nodes, (len(sockets) or None), (len(cores) or None)


# ---------------------------------------------------------------- GPU


def gpu_topology() -> GpuTopology:
    """NVLink or PCIe for every GPU pair through NVML; ``source="unavailable"`` without a driver."""
    try:
        import pynvml
    except ImportError:
        return GpuTopology(source="unavailable", note="pynvml (nvidia-ml-py) is not installed")
    try:
        pynvml.nvmlInit()
    except Exception as e:  # NVMLError_LibraryNotFound / DriverNotLoaded without a GPU
        return GpuTopology(source="unavailable", note=f"NVML: {type(e).__name__}: {e}")
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        gpus = [_links(pynvml, i, h) for i, h in enumerate(handles)]
        remotes = [_remote_bus_ids(pynvml, h) for h in handles]
        pairs = []
        for a in range(len(handles)):
            for b in range(a + 1, len(handles)):
                pairs.append(_pair(pynvml, handles, gpus, remotes, a, b))
        return GpuTopology(source="nvml", gpus=gpus, pairs=pairs)
    except Exception as e:
        log.info("NVML topology query failed: %s", e)
        return GpuTopology(source="unavailable", note=f"NVML query failed: {type(e).__name__}: {e}")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _norm_bus_id(bus_id) -> str:
    s = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
    # NVML writes the domain with 4 or 8 hex digits depending on the call
    dom, _, rest = s.lower().partition(":")
    return f"{int(dom, 16):04x}:{rest}" if rest else s.lower()


def _max_links(pynvml) -> int:
    return int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))


def _links(pynvml, index: int, h) -> GpuLinks:
    bus = None
    try:
        bus = _norm_bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId)
    except Exception:
        pass
    active: Optional[int] = 0
    for link in range(_max_links(pynvml)):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(h, link) == pynvml.NVML_FEATURE_ENABLED:
                active += 1
        except pynvml.NVMLError as e:
            # NOT_SUPPORTED: a GPU or link without NVLink; INVALID_ARGUMENT: past its last link
            if not isinstance(e, (getattr(pynvml, "NVMLError_NotSupported", ()),
                                  getattr(pynvml, "NVMLError_InvalidArgument", ()))):
                active = None
            break
    return GpuLinks(index=index, pci_bus_id=bus, nvlink_active_links=active)


def _remote_bus_ids(pynvml, h) -> set[str]:
    """PCI bus ids at the far end of this GPU's active NVLinks (another GPU, or an NVSwitch)."""
    out = set()
    get = getattr(pynvml, "nvmlDeviceGetNvLinkRemotePciInfo_v2", None) or pynvml.nvmlDeviceGetNvLinkRemotePciInfo
    for link in range(_max_links(pynvml)):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(h, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            out.add(_norm_bus_id(get(h, link).busId))
        except Exception:
            break
    out.discard("0000:00:00.0")  # a far end NVML could not name is no evidence of a shared switch
    return out


_PCIE_LEVELS = {0: "same_board", 10: "single_switch", 20: "multiple_switches", 30: "host_bridge", 40: "numa_node",
                50: "system"}


def _pair(pynvml, handles, gpus: list[GpuLinks], remotes: list[set[str]], a: int, b: int) -> GpuPair:
    p2p: Optional[bool] = None
    try:
        status = pynvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
        p2p = status == pynvml.NVML_P2P_STATUS_OK
    except Exception:
        pass
    path = None
    try:
        path = _PCIE_LEVELS.get(int(pynvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])))
    except Exception:
        pass
    direct = gpus[b].pci_bus_id in remotes[a] or gpus[a].pci_bus_id in remotes[b]
    # GPUs behind NVSwitches see the switches' bus ids, not each other's: a shared far end counts too
    shared = bool(remotes[a] & remotes[b])
    known = p2p is not None or (gpus[a].nvlink_active_links is not None and gpus[b].nvlink_active_links is not None)
    if p2p or direct or shared:
        link: LinkKind = "nvlink"
    elif known:
        link = "pcie"
    else:
        link = "unknown"
    return GpuPair(gpu_a=a, gpu_b=b, link=link, nvlink_p2p=p2p, pcie_path=path)
