"""NVLink domains larger than a node: GB200 NVL72 joins 72 GPUs (4 per compute tray) over NVLink, so
FSDP, EP and engine TP between trays of one rack run at NVLink rates; an HGX node's domain is the node."""

from __future__ import annotations

import pytest

from throughputlab.calibration import DEFAULT_EFFICIENCIES
from throughputlab.decide.calculator import DecideSpec, decide_from_spec
from throughputlab.decide.cluster import ClusterSpec, generation_model, placements, training_model
from throughputlab.decide.devices import link_domain
from throughputlab.fit import load_model
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, predict_analytic
from throughputlab.records.peaks import _DOMAINS, INTER_NODE_BYTES_PER_S, device_names, nvlink_domain
from throughputlab.records.profile import Profile

SHAPE = {"prompt_len": 512, "response": {"dist": "fixed:len=512"}}


def test_the_datasheet_rows_carry_the_nvlink_domain():
    gpus, node, source = nvlink_domain("GB200")
    assert (gpus, node) == (72, 4) and "NVL72" in source and "130 TB/s" in source
    for hgx in ("H100 SXM", "H200", "B200", "A100 80GB SXM", "H20"):
        assert nvlink_domain(hgx)[:2] == (8, 8), hgx  # the node
    assert nvlink_domain("L4")[:2] == (None, None)
    assert set(_DOMAINS) <= set(device_names())  # every row names a datasheet row


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    """qwen2.5-7b predicted on 16 GB200 over 4 trays and on 16 H100 over 2 HGX nodes."""
    root = tmp_path_factory.mktemp("domain")
    spec = resolve_model("qwen2.5-7b").spec
    out = {}
    for name, device, nodes in (("gb200", "gb200", 4), ("h100", "h100", 2)):
        path = root / f"{name}.json"
        predict_analytic(spec, device, layout=Layout(gpus=16, nodes=nodes)).save(path)
        out[name] = str(path)
    return out


def _train_comm(path: str, nodes: int):
    prof = Profile.load(path)
    model = load_model(prof)
    domain, _ = link_domain(prof.hardware)
    pl = placements(model, ClusterSpec(gpus=16, nodes=nodes), domain)[0]
    return model, pl, training_model(model, pl, False, 1024, None).comm


def test_fsdp_over_gb200_trays_of_one_rack_runs_at_nvlink_rate(profiles):
    model, pl, comm = _train_comm(profiles["gb200"], 4)
    network = DEFAULT_EFFICIENCIES.comm_bw * INTER_NODE_BYTES_PER_S
    # the profile: 4 nodes of 4 GPUs, a ring over each tray's 4 NICs
    assert model.comm.fsdp_busbw_bytes_per_s == pytest.approx(4 * network)
    assert (pl.per_node, pl.link_group, pl.train_domains) == (4, 72, 1)
    assert comm.fsdp_busbw_bytes_per_s == pytest.approx(comm.tp_busbw_bytes_per_s)  # NVLink
    assert comm.fsdp_busbw_bytes_per_s > 10 * network and comm.fsdp_hidden_share == 1.0  # as within a node


def test_fsdp_over_two_h100_nodes_runs_at_the_network_rate(profiles):
    _, pl, comm = _train_comm(profiles["h100"], 2)
    assert (pl.per_node, pl.link_group, pl.train_domains) == (8, 8, 2)
    nic = DEFAULT_EFFICIENCIES.comm_bw * INTER_NODE_BYTES_PER_S
    # a ring over each node's 8 NICs, no faster than the node's own NVLink
    assert comm.fsdp_busbw_bytes_per_s == pytest.approx(min(8 * nic, comm.tp_busbw_bytes_per_s))
    # an HGX node's domain is the node: 4 GPUs used on each of 4 nodes do not join over NVLink, and their ring
    # crosses the network through 4 NICs a node
    _, pl4, comm4 = _train_comm(profiles["h100"], 4)
    assert pl4.link_group == 4 and comm4.fsdp_busbw_bytes_per_s == pytest.approx(4 * nic)


def test_an_engine_over_gb200_trays_keeps_its_nvlink_all_reduces(profiles):
    prof = Profile.load(profiles["gb200"])
    model = load_model(prof)
    domain, _ = link_domain(prof.hardware)
    pl = placements(model, ClusterSpec(gpus=16, nodes=4, engine_tp=8), domain)[0]
    eng = generation_model(model, pl, ClusterSpec(gpus=16, nodes=4, engine_tp=8))
    assert eng.comm.tp_busbw_bytes_per_s == pytest.approx(model.comm.tp_busbw_bytes_per_s)
    across = placements(model, ClusterSpec(gpus=16, nodes=4, engine_tp=8))[0]  # without the domain: the network
    assert generation_model(model, across, ClusterSpec()).comm.tp_busbw_bytes_per_s < eng.comm.tp_busbw_bytes_per_s


def test_the_decision_says_the_gpus_share_one_nvlink_domain(profiles):
    spec = DecideSpec.model_validate({"profile": profiles["gb200"], "prompts": [64], "group": 8, "shape": SHAPE,
                                      "cluster": {"gpus": 16, "nodes": 4}})
    d = decide_from_spec(spec)[0]
    assert any("all in one NVLink domain" in n and "NVL72" in n for n in d.notes), d.notes
    h = DecideSpec.model_validate({"profile": profiles["h100"], "prompts": [64], "group": 8, "shape": SHAPE,
                                   "cluster": {"gpus": 16, "nodes": 2}})
    assert not any("NVLink domain" in n for n in decide_from_spec(h)[0].notes)
