"""Datasheet rows: realistic NVML names map to the right row, and every row is usable."""

from __future__ import annotations

import pytest

from throughputlab.records.peaks import _LINKS, _ROWS, device_names, link_bandwidth, lookup, peak_flops

G = 1e9
T = 1e12


@pytest.mark.parametrize("name, key", [
    # new rows
    ("NVIDIA H20", "H20"),
    ("NVIDIA H800", "H800 SXM"),
    ("NVIDIA H800 PCIe", "H800 PCIe"),
    ("NVIDIA A800-SXM4-80GB", "A800 80GB SXM"),
    ("NVIDIA A800 80GB PCIe", "A800 80GB PCIe"),
    ("NVIDIA GB200", "GB200"),
    ("AMD Instinct MI325X", "MI325X"),
    # old rows must not be captured by the new, look-alike patterns
    ("NVIDIA H200", "H200"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
    ("NVIDIA B200", "B200"),
    ("AMD Instinct MI300X", "MI300X"),
])
def test_nvml_names_map_to_their_row(name, key):
    peak = lookup(name)
    assert peak is not None and peak.device == key


@pytest.mark.parametrize("name", ["NVIDIA GH200 480GB", "NVIDIA H20-3e", "NVIDIA A800 40GB Active"])
def test_variants_without_a_row_give_none_not_a_neighbour(name):
    assert lookup(name) is None


def test_every_key_looks_up_its_own_row():
    for key in device_names():
        assert lookup(key).device == key


def test_every_row_has_bandwidth_memory_a_bf16_figure_and_a_source():
    for key, _patterns, bw, flops, mem, source in _ROWS:
        if key == "V100":  # no BF16 on Volta; its row says so
            assert "no BF16" in source
            continue
        assert bw > 0 and mem and mem > 0, key
        assert flops.get("bfloat16", 0) > 0, key
        assert all(v > 0 for v in flops.values()), key
        assert "(20" in source, key  # names a document and its year


def test_every_link_is_for_a_known_row():
    assert set(_LINKS) <= set(device_names())
    for key in ("H20", "H800 SXM", "H800 PCIe", "A800 80GB SXM", "A800 80GB PCIe", "GB200", "MI325X", "MI300X"):
        assert key in _LINKS


def test_hand_checked_values():
    gb200 = lookup("NVIDIA GB200")
    assert gb200.memory_bandwidth_bytes_per_s == pytest.approx(576e12 / 72)  # NVL72 rack total / 72
    assert peak_flops(gb200, "bf16") == pytest.approx(360e15 / 72 / 2)  # rack sparse / 72 GPUs / 2
    assert peak_flops(gb200, "fp8") == pytest.approx(5000 * T)
    assert gb200.memory_bytes == 189471 * 2**20  # nvidia-smi's MiB, not the page's 186 GB per GPU
    assert "derived" in gb200.source

    h20 = lookup("NVIDIA H20")
    assert (h20.memory_bandwidth_bytes_per_s, peak_flops(h20, "bf16"), h20.memory_bytes) == (4000 * G, 148 * T, 97871 * 2**20)

    h800, h100 = lookup("NVIDIA H800"), lookup("NVIDIA H100 80GB HBM3")
    assert h800.flops_per_s == h100.flops_per_s
    assert h800.memory_bandwidth_bytes_per_s == h100.memory_bandwidth_bytes_per_s == 3350 * G

    a800 = lookup("NVIDIA A800-SXM4-80GB")
    assert (a800.memory_bandwidth_bytes_per_s, peak_flops(a800, "bf16")) == (2039 * G, 312 * T)
    assert lookup("NVIDIA A800 80GB PCIe").memory_bandwidth_bytes_per_s == 1935 * G

    mi325 = lookup("AMD Instinct MI325X")
    assert (mi325.memory_bandwidth_bytes_per_s, mi325.memory_bytes) == (6000 * G, 256 * 2**30)
    assert peak_flops(mi325, "fp8") == pytest.approx(2 * peak_flops(mi325, "bf16"), rel=1e-3)


def test_link_figures_are_one_direction():
    assert link_bandwidth("H800 SXM")[0] == 200 * G  # 400 GB/s both directions
    assert link_bandwidth("A800 80GB SXM")[0] == 200 * G
    assert link_bandwidth("H20")[0] == 450 * G  # 900 GB/s both directions
    assert link_bandwidth("GB200")[0] == 900 * G  # 1.8 TB/s both directions
    assert link_bandwidth("MI325X")[0] == link_bandwidth("MI300X")[0] == 448 * G
    assert link_bandwidth("H800 SXM")[0] < link_bandwidth("H100 SXM")[0]
