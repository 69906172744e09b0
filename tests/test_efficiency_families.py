"""Per-device-family efficiency defaults: one table in calibration.py, resolved from the datasheet key."""

import pytest

from throughputlab.calibration import DEFAULT_EFFICIENCIES, efficiencies_for, family_of
from throughputlab.models import resolve_model
from throughputlab.predict import predict_analytic
from throughputlab.records.peaks import lookup


@pytest.mark.parametrize("name, family", [("NVIDIA H100 80GB HBM3", "NVIDIA Hopper"), ("H20", "NVIDIA Hopper"),
                                          ("A100-SXM4-80GB", "NVIDIA Ampere"), ("L40S", "NVIDIA Ada"),
                                          ("AMD Instinct MI300X", "AMD CDNA3"), ("B200", "NVIDIA Blackwell")])
def test_family_resolves_from_datasheet_key(name, family):
    key = lookup(name).device
    assert family_of(key) == family
    assert family in efficiencies_for(key).source


def test_rows_with_figures_cite_them():
    a100 = efficiencies_for(lookup("a100").device)
    assert a100.decode_bw == pytest.approx(0.77) and "A100" in a100.source
    assert efficiencies_for("MI300X").decode_bw == pytest.approx(0.57)
    assert efficiencies_for("H100 SXM").decode_bw == pytest.approx(0.80)
    assert a100.prefill_phi == DEFAULT_EFFICIENCIES.prefill_phi  # fields without a measurement keep the default


def test_family_without_measurement_and_unknown_device_say_so():
    l40s = efficiencies_for("L40S")
    assert l40s.decode_bw == DEFAULT_EFFICIENCIES.decode_bw and "no published measurement" in l40s.source
    v100 = efficiencies_for(lookup("V100").device)
    assert family_of("V100") is None
    assert v100.model_dump(exclude={"source"}) == DEFAULT_EFFICIENCIES.model_dump(exclude={"source"})
    assert "V100: no device-family row" in v100.source


def test_predicted_header_names_the_row():
    pred = predict_analytic(resolve_model("qwen2.5-7b").spec, "a100", concurrency=(1,))
    header = next(n for n in pred.notes if n.startswith("efficiencies from"))
    assert "NVIDIA Ampere row" in header and "decode_bw 77%" in header
    assert pred.fit["model"]["source"] == "analytic"
