"""Datasheet peaks: one cited row per device, dense (no structured-sparsity) figures.

Unknown devices give ``None``, never a guessed number. Matching is on the name NVML (or
the user) reports, by the most specific pattern first. Memory is what the driver reports
(nvidia-smi's total, in MiB; rocm-smi's in bytes), not the marketing "80 GB": an 80 GB H100 has
80 GiB of HBM of which nvidia-smi shows 81,559 MiB (the rest holds ECC and the driver's reserve).
"""

from __future__ import annotations

import re
from typing import Optional

from throughputlab.records.machine import DatasheetPeak

T = 1e12
G = 1e9
GiB = 2**30
MiB = 2**20

# (key, name patterns, bandwidth bytes/s, {dtype: dense FLOP/s}, memory bytes, source)
_ROWS: list[tuple[str, tuple[str, ...], float, dict[str, float], Optional[int], str]] = [
    ("GB200", (r"\bGB200\b",), 8000 * G, {"bfloat16": 2500 * T, "float16": 2500 * T, "fp8": 5000 * T},
     189471 * MiB, "NVIDIA GB200 NVL72 page (2025), per-rack figures with sparsity; derived per GPU as rack/72, dense "
     "= sparse/2: 13.4 TB HBM3e/72 = 186 GB (older NVIDIA material: 13.5 TB, 192 GB), 576 TB/s/72 = 8 TB/s, "
     "BF16 360 PF/72/2 = 2.5 PFLOPS dense, FP8 720 PF/72/2 = 5 PFLOPS dense; no FP32 figure taken; memory 189,471 MiB as nvidia-smi reports it on GB200 trays"),
    ("B200", (r"\bB200\b",), 8000 * G, {"bfloat16": 2250 * T, "float16": 2250 * T, "fp8": 4500 * T, "float32": 75 * T},
     183359 * MiB, "NVIDIA DGX B200 / HGX B200 datasheet (2024): 8 TB/s HBM3e, 2.25 PFLOPS dense BF16 per GPU; memory 183,359 MiB as nvidia-smi reports it"),
    ("H200", (r"\bH200\b",), 4800 * G, {"bfloat16": 989.4 * T, "float16": 989.4 * T, "fp8": 1978.9 * T, "float32": 67 * T},
     143771 * MiB, "NVIDIA H200 Tensor Core GPU datasheet (2024), SXM: 4.8 TB/s, 989 TFLOPS BF16 dense (1,979 sparse); memory 143,771 MiB as nvidia-smi reports it"),
    ("H20", (r"\bH20\b(?!.*\b(3e|141))",), 4000 * G,
     {"bfloat16": 148 * T, "float16": 148 * T, "fp8": 296 * T, "float32": 44 * T},
     97871 * MiB, "NVIDIA H20 (2024): no public NVIDIA datasheet; partner spec sheets give 96 GB HBM3, 4.0 TB/s, "
     "148 TFLOPS BF16 and 296 FP8, reported as dense; the 141 GB HBM3e H20 variant is left unmatched; memory 97,871 MiB as nvidia-smi reports it"),
    ("H800 PCIe", (r"\bH800\b.*PCIe",), 2000 * G,
     {"bfloat16": 756.5 * T, "float16": 756.5 * T, "fp8": 1513 * T, "float32": 51 * T},
     81559 * MiB, "NVIDIA H800 Tensor Core GPU datasheet (2023), PCIe: 2 TB/s (some listings 2,039 GB/s), 80 GB, "
     "1,513 TFLOPS BF16 with sparsity, so 756 dense (H100 PCIe compute); memory taken as the H100's 81,559 MiB (same 80 GB HBM; no nvidia-smi figure found)"),
    ("H800 SXM", (r"\bH800\b",), 3350 * G, {"bfloat16": 989.4 * T, "float16": 989.4 * T, "fp8": 1978.9 * T, "float32": 67 * T},
     81559 * MiB, "NVIDIA H800 Tensor Core GPU datasheet (2023), SXM: 3.35 TB/s, 80 GB, 1,979 TFLOPS BF16 with "
     "sparsity, so 989 dense (H100 SXM compute; NVLink cut to 400 GB/s); memory taken as the H100's 81,559 MiB (same 80 GB HBM3; no nvidia-smi figure found)"),
    ("H100 PCIe", (r"\bH100\b.*PCIe", r"\bH100 PCIe"), 2000 * G,
     {"bfloat16": 756.5 * T, "float16": 756.5 * T, "fp8": 1513 * T, "float32": 51 * T},
     81559 * MiB, "NVIDIA H100 Tensor Core GPU datasheet (2023), PCIe: 2.0 TB/s, 756 TFLOPS BF16 dense; memory 81,559 MiB as nvidia-smi reports it"),
    ("H100 NVL", (r"\bH100 NVL",), 3900 * G, {"bfloat16": 835 * T, "float16": 835 * T, "fp8": 1670 * T, "float32": 60 * T},
     95830 * MiB, "NVIDIA H100 Tensor Core GPU datasheet (2023), NVL: 3.9 TB/s, 835 TFLOPS BF16 dense; memory 95,830 MiB as nvidia-smi reports it"),
    ("H100 SXM", (r"\bH100\b",), 3350 * G, {"bfloat16": 989.4 * T, "float16": 989.4 * T, "fp8": 1978.9 * T, "float32": 67 * T},
     81559 * MiB, "NVIDIA H100 Tensor Core GPU datasheet (2023), SXM: 3.35 TB/s, 989 TFLOPS BF16 dense; memory 81,559 MiB as nvidia-smi reports it"),
    ("A100 40GB", (r"\bA100\b.*40GB",), 1555 * G, {"bfloat16": 312 * T, "float16": 312 * T, "float32": 19.5 * T},
     40960 * MiB, "NVIDIA A100 Tensor Core GPU datasheet (2021): 40GB 1,555 GB/s, 312 TFLOPS BF16 dense; memory 40,960 MiB as nvidia-smi reports it"),
    ("A100 80GB PCIe", (r"\bA100\b.*80GB.*PCIe", r"\bA100\b.*PCIe.*80GB"), 1935 * G,
     {"bfloat16": 312 * T, "float16": 312 * T, "float32": 19.5 * T},
     81920 * MiB, "NVIDIA A100 Tensor Core GPU datasheet (2021): 80GB PCIe 1,935 GB/s, 312 TFLOPS BF16 dense; memory 81,920 MiB as nvidia-smi reports it"),
    ("A100 80GB SXM", (r"\bA100\b",), 2039 * G, {"bfloat16": 312 * T, "float16": 312 * T, "float32": 19.5 * T},
     81920 * MiB, "NVIDIA A100 Tensor Core GPU datasheet (2021): 80GB SXM 2,039 GB/s, 312 TFLOPS BF16 dense; memory 81,920 MiB as nvidia-smi reports it"),
    ("A800 80GB PCIe", (r"\bA800\b(?!.*40GB).*PCIe",), 1935 * G, {"bfloat16": 312 * T, "float16": 312 * T, "float32": 19.5 * T},
     81920 * MiB, "NVIDIA A800 Tensor Core GPU datasheet (2022): 80GB PCIe 1,935 GB/s, 312 TFLOPS BF16 dense (A100 "
     "compute, NVLink 400 GB/s); 40GB A800s are left unmatched; memory taken as the A100's 81,920 MiB (no nvidia-smi figure found)"),
    ("A800 80GB SXM", (r"\bA800\b(?!.*40GB)",), 2039 * G, {"bfloat16": 312 * T, "float16": 312 * T, "float32": 19.5 * T},
     81920 * MiB, "NVIDIA A800 Tensor Core GPU datasheet (2022): 80GB SXM 2,039 GB/s, 312 TFLOPS BF16 dense (A100 "
     "compute, NVLink 400 GB/s); memory taken as the A100's 81,920 MiB (no nvidia-smi figure found)"),
    ("L40S", (r"\bL40S\b",), 864 * G, {"bfloat16": 362.05 * T, "float16": 362.05 * T, "fp8": 733 * T, "float32": 91.6 * T},
     46068 * MiB, "NVIDIA L40S datasheet (2023): 864 GB/s, 362 TFLOPS BF16 dense (733 sparse); memory 46,068 MiB as nvidia-smi reports it"),
    ("L4", (r"\bL4\b",), 300 * G, {"bfloat16": 121 * T, "float16": 121 * T, "fp8": 242.5 * T, "float32": 30.3 * T},
     23034 * MiB, "NVIDIA L4 datasheet (2023): 300 GB/s, 121 TFLOPS BF16 dense (242 sparse); memory 23,034 MiB as nvidia-smi reports it"),
    ("A10", (r"\bA10G?\b",), 600 * G, {"bfloat16": 125 * T, "float16": 125 * T, "float32": 31.2 * T},
     23028 * MiB, "NVIDIA A10 datasheet (2021): 600 GB/s, 125 TFLOPS BF16 dense (250 sparse); memory 23,028 MiB as nvidia-smi reports it"),
    ("RTX 4090", (r"RTX 4090",), 1008 * G, {"bfloat16": 165.2 * T, "float16": 165.2 * T, "float32": 82.6 * T},
     24 * GiB, "NVIDIA Ada Lovelace architecture whitepaper v1.1 (2023), RTX 4090: 1,008 GB/s, 165.2 TFLOPS BF16 dense (FP32 accumulate)"),
    ("RTX 3090", (r"RTX 3090",), 936 * G, {"bfloat16": 71 * T, "float16": 71 * T, "float32": 35.6 * T},
     24 * GiB, "NVIDIA Ampere GA102 whitepaper v2.1 (2021), RTX 3090: 936 GB/s, 71 TFLOPS BF16 dense (FP32 accumulate)"),
    ("V100", (r"\bV100\b",), 900 * G, {"float16": 125 * T, "float32": 15.7 * T},
     32768 * MiB, "NVIDIA V100 Tensor Core GPU datasheet (2020), SXM2: 900 GB/s, 125 TFLOPS FP16 tensor (no BF16); memory 32,768 MiB as nvidia-smi reports it (32GB SXM2)"),
    ("MI300X", (r"MI300X",), 5300 * G, {"bfloat16": 1307.4 * T, "float16": 1307.4 * T, "fp8": 2614.9 * T, "float32": 163.4 * T},
     192 * GiB, "AMD Instinct MI300X datasheet (2023): 5.3 TB/s, 1,307 TFLOPS BF16 dense; memory 192 GiB, 206,158,430,208 B as rocm-smi reports it"),
    ("MI325X", (r"MI325X",), 6000 * G, {"bfloat16": 1307.4 * T, "float16": 1307.4 * T, "fp8": 2614.9 * T, "float32": 163.4 * T},
     256 * GiB, "AMD Instinct MI325X datasheet (2024): 256 GB HBM3E, 6 TB/s, 1,307.4 TFLOPS BF16 dense "
     "(2,614.9 sparse), 2,614.9 FP8 dense; memory taken as 256 GiB, 8 HBM3E stacks of 32 GiB (no rocm-smi figure found)"),
]


def device_names() -> list[str]:
    return [r[0] for r in _ROWS]


def lookup(name: str) -> Optional[DatasheetPeak]:
    """Datasheet row for a device name ('NVIDIA H200', 'h100 pcie', 'a100-sxm4-80gb'...), or None."""
    if not name:
        return None
    probe = name.replace("-", " ").replace("_", " ")
    for key, patterns, bw, flops, mem, source in _ROWS:
        if any(re.search(p, probe, re.IGNORECASE) for p in patterns):
            return DatasheetPeak(device=key, memory_bandwidth_bytes_per_s=bw, flops_per_s=dict(flops),
                                 memory_bytes=mem, source=source)
    return None


def peak_flops(peak: Optional[DatasheetPeak], dtype: str) -> Optional[float]:
    if peak is None:
        return None
    aliases = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16"}
    return peak.flops_per_s.get(aliases.get(dtype, dtype))


BALANCE_REFERENCE = "H100 SXM"  # the device the published MoE training shares were measured on


def balance_vs_reference(peak: Optional[DatasheetPeak], dtype: str) -> float:
    """A device's FLOP/s per byte/s of memory bandwidth at ``dtype`` over the H100 SXM's (1 where unknown): how
    much more (or less) a memory-bound overhead weighs against compute than on the reference device."""
    ref = lookup(BALANCE_REFERENCE)
    mine, theirs = peak_flops(peak, dtype), peak_flops(ref, dtype)
    if not mine or not theirs:
        mine, theirs = peak_flops(peak, "bfloat16"), peak_flops(ref, "bfloat16")
    if not mine or not theirs or peak is None or not peak.memory_bandwidth_bytes_per_s:
        return 1.0
    return (mine / peak.memory_bandwidth_bytes_per_s) / (theirs / ref.memory_bandwidth_bytes_per_s)


# Links between devices, for predictions without a collective benchmark: the per-GPU
# unidirectional bandwidth of the intra-node fabric, and of the inter-node network.
# (key, intra-node bytes/s, source)
_LINKS: dict[str, tuple[float, str]] = {
    "B200": (900 * G, "NVLink 5: 1.8 TB/s per GPU both directions"),
    "H200": (450 * G, "NVLink 4: 18 links, 900 GB/s per GPU both directions"),
    "H100 SXM": (450 * G, "NVLink 4: 18 links, 900 GB/s per GPU both directions"),
    "H100 NVL": (300 * G, "NVLink bridge: 600 GB/s per GPU pair both directions"),
    "H100 PCIe": (64 * G, "PCIe Gen5 x16: 64 GB/s each way"),
    "A100 80GB SXM": (300 * G, "NVLink 3: 12 links, 600 GB/s per GPU both directions"),
    "A100 40GB": (300 * G, "NVLink 3: 12 links, 600 GB/s per GPU both directions"),
    "A100 80GB PCIe": (32 * G, "PCIe Gen4 x16: 32 GB/s each way"),
    "MI300X": (448 * G, "Infinity Fabric: 7 links x 64 GB/s per GPU each way"),
    "MI325X": (448 * G, "AMD MI325X datasheet (2024), Infinity Fabric: 7 links, 128 GB/s peak per link read as both "
               "directions, so 7 x 64 GB/s each way (one peer alone gets 64 GB/s)"),
    "GB200": (900 * G, "GB200 NVL72 page (2025), NVLink 5: 1.8 TB/s per GPU both directions, across all 72 GPUs"),
    "H20": (450 * G, "partner spec sheets (2024), NVLink 4: 900 GB/s per GPU both directions"),
    "H800 SXM": (200 * G, "H800 datasheet (2023), NVLink: 400 GB/s per GPU both directions"),
    "H800 PCIe": (64 * G, "PCIe Gen5 x16: 64 GB/s each way (the 400 GB/s NVLink bridge joins pairs only)"),
    "A800 80GB SXM": (200 * G, "A800 datasheet (2022), NVLink 3: 400 GB/s per GPU both directions"),
    "A800 80GB PCIe": (32 * G, "PCIe Gen4 x16: 32 GB/s each way (the 400 GB/s NVLink bridge joins pairs only)"),
}
INTER_NODE_BYTES_PER_S = 50 * G  # one 400 Gb/s InfiniBand or RoCE NIC per GPU, as in DGX/HGX nodes
PCIE_GEN4_BYTES_PER_S = 32 * G  # devices without a row: PCIe Gen4 x16


# The host link, GPU to host memory, each way per GPU: what vLLM's sleep mode and training offload copy over
# (roofline.rl prices the copies at its HOST_COPY_EFFICIENCY). Hopper and Blackwell HGX hosts are PCIe Gen5 x16:
# nvbandwidth on Azure ND H100 v5 and ND H200 v5 (8 GPUs, Xeon 8480C) measures 51-52 GB/s each way for one GPU
# (github.com/Azure/AI-benchmarking-guide, Azure_Results/ND_H100_v5_results.md @ ae0b6a7, ND_H200_v5 @ 7f20e5f),
# against 25-26 GB/s on A100 (Gen4; ND_A100_v4 @ 3bb66ca, NVIDIA/nvbandwidth issue #42). GB200: the Grace CPU on
# NVLink-C2C (roofline.rl.C2C_BYTES_PER_S). Devices without a row: PCIe Gen4 x16.
PCIE_GEN5_BYTES_PER_S = 64 * G
_GEN5_HOSTS = ("H100 SXM", "H100 NVL", "H100 PCIe", "H200", "H20", "H800 SXM", "H800 PCIe", "B200")
_HOST_SOURCE = ("PCIe Gen5 x16, 64 GB/s each way (nvbandwidth on Azure ND H100 v5 / H200 v5: 51-52 GB/s for one "
                "GPU, Azure/AI-benchmarking-guide)")


def host_link(device_key: str, c2c_bytes_per_s: float) -> tuple[float, str]:
    """The GPU-to-host link of a datasheet row (bytes/s each way per GPU) and its source: NVLink-C2C on GB200
    (``c2c_bytes_per_s``, the roofline's figure), PCIe Gen5 x16 on Hopper and Blackwell HGX, else Gen4 x16."""
    if device_key == "GB200":
        return c2c_bytes_per_s, "GB200: NVLink-C2C to the Grace CPU"
    if device_key in _GEN5_HOSTS:
        return PCIE_GEN5_BYTES_PER_S, f"{device_key}: {_HOST_SOURCE}"
    return PCIE_GEN4_BYTES_PER_S, f"{device_key}: PCIe Gen4 x16, 32 GB/s each way"


def link_bandwidth(device_key: str) -> tuple[float, str]:
    """Intra-node link bandwidth per GPU (bytes/s, one direction) and where the figure comes from."""
    if device_key in _LINKS:
        bw, src = _LINKS[device_key]
        return bw, f"{device_key} datasheet: {src}"
    return PCIE_GEN4_BYTES_PER_S, f"{device_key}: no NVLink figure, PCIe Gen4 x16 (32 GB/s each way) assumed"


# NVLink domains: the GPUs one NVLink fabric joins, where collectives between them run at the link above
# rather than the network's, and the GPUs of the device's node (a tray). HGX/DGX baseboards join their node's
# 8 GPUs over NVSwitch (the domain is the node); GB200 NVL72 joins 72 GPUs, 4 per compute tray (a node),
# through the rack's NVLink switch trays. Devices without a row: the node.
# (key, GPUs in one domain, GPUs per node, source)
_HGX = "HGX/DGX baseboard: 8 GPUs on NVSwitch, the node"
_DOMAINS: dict[str, tuple[int, int, str]] = {
    "GB200": (72, 4, "NVIDIA GB200 NVL72 datasheet: 72 Blackwell GPUs in one NVLink domain, 130 TB/s of NVLink "
                     "bandwidth in the rack (fifth-generation NVLink and NVLink Switch), 1.8 TB/s per GPU; 4 GPUs "
                     "per compute tray, so one domain spans 18 trays"),
    "B200": (8, 8, f"{_HGX} (NVLink 5)"),
    "H200": (8, 8, f"{_HGX} (NVLink 4)"),
    "H100 SXM": (8, 8, f"{_HGX} (NVLink 4)"),
    "H20": (8, 8, f"{_HGX} (NVLink 4)"),
    "H800 SXM": (8, 8, f"{_HGX} (NVLink 4 at 400 GB/s)"),
    "A100 80GB SXM": (8, 8, f"{_HGX} (NVLink 3)"),
    "A100 40GB": (8, 8, f"{_HGX} (NVLink 3)"),
    "A800 80GB SXM": (8, 8, f"{_HGX} (NVLink 3 at 400 GB/s)"),
}


def nvlink_domain(device_key: str) -> tuple[Optional[int], Optional[int], str]:
    """GPUs in one NVLink domain of the device and GPUs per node (None, None: no NVLink fabric beyond the
    node), and where the figures come from. The domain spans nodes where it holds more than a node."""
    if device_key in _DOMAINS:
        gpus, node, src = _DOMAINS[device_key]
        return gpus, node, f"{device_key} datasheet: {src}"
    return None, None, f"{device_key}: no NVLink domain beyond the node"
