"""What a profile's device says about the cluster around it: its NVLink domain, how many of it a node
holds, and its host link (each from the datasheet row the profile's device name finds)."""

from __future__ import annotations

from typing import Optional

from throughputlab.roofline import rl as rf_rl


def link_domain(hardware) -> tuple[Optional[int], str]:
    """GPUs in one NVLink domain of a profile's device where the domain spans nodes (GB200 NVL72: 72;
    records.peaks.nvlink_domain), and its source; None: the node (an HGX baseboard is its node)."""
    from throughputlab.records.peaks import lookup, nvlink_domain

    if getattr(hardware, "device_type", None) != "cuda":
        return None, "not a GPU: no NVLink domain"
    ds = getattr(hardware, "datasheet", None) or lookup(getattr(hardware, "device_name", "") or "")
    if ds is None:
        return None, "no datasheet row: the node"
    domain, node, source = nvlink_domain(ds.device)
    return (domain if domain and node and domain > node else None), source


def gpus_per_node_limit(hardware) -> Optional[tuple[str, int]]:
    """A profile's device and the most of it one node holds (predict's table); None: not a known GPU."""
    from throughputlab.predict_engine import MAX_GPUS_PER_NODE, SXM_GPUS_PER_NODE
    from throughputlab.records.peaks import lookup

    if getattr(hardware, "device_type", None) != "cuda":
        return None
    ds = getattr(hardware, "datasheet", None) or lookup(getattr(hardware, "device_name", "") or "")
    return None if ds is None else (ds.device, MAX_GPUS_PER_NODE.get(ds.device, SXM_GPUS_PER_NODE))


def host_link_rate(hardware) -> tuple[Optional[float], str]:
    """A profile's device's host link each way per GPU (records.peaks.host_link) and its source; None where the
    profile names no GPU with a datasheet row (the placement's default then)."""
    from throughputlab.records.peaks import host_link, lookup

    if getattr(hardware, "device_type", None) != "cuda":
        return None, "not a GPU"
    ds = getattr(hardware, "datasheet", None) or lookup(getattr(hardware, "device_name", "") or "")
    if ds is None:
        return None, "no datasheet row: PCIe Gen4 x16 assumed"
    return host_link(ds.device, rf_rl.C2C_BYTES_PER_S)
