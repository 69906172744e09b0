"""Predictions: fitted (unmeasured points), analytic (datasheet x efficiencies), calibrated; profile-shaped output."""

from __future__ import annotations

import pytest

from _synth import TRUE, make_profile
from throughputlab.cli import main
from throughputlab.errors import UserError
from throughputlab.fit import fit_profile, load_fit, load_model
from throughputlab.models import resolve_model
from throughputlab.predict import DEFAULT_EFFICIENCIES, calibration_from, predict_analytic, predict_from_profile
from throughputlab.records.peaks import lookup
from throughputlab.records.profile import Profile
from throughputlab.roofline import Costs, decode_step_s, single_stream_bound


def with_fit(prof: Profile) -> Profile:
    """The profile with a stored fit, as `throughputlab fit --bootstrap 0` leaves it: what predict and
    --calibrate then read (load_or_fit) instead of fitting with the default bootstrap."""
    prof.fit = fit_profile(prof, bootstrap=0).model_dump(mode="json")
    return prof


@pytest.fixture(scope="module")
def qwen_h200():
    return predict_analytic(resolve_model("qwen2.5-7b").spec, "h200", concurrency=(1, 8, 64, 512, 4096))


def test_analytic_knee_follows_the_h200_flop_per_byte_ratio(qwen_h200):
    m = load_model(qwen_h200)
    ds = lookup("h200")
    ridge = ds.flops_per_s["bfloat16"] / ds.memory_bandwidth_bytes_per_s  # FLOP per byte of the device
    eff = DEFAULT_EFFICIENCIES
    w_over_f = m.costs.weight_bytes / m.costs.flops_per_token
    assert m.short_context_knee() == pytest.approx(ridge * eff.decode_phi / eff.decode_bw * w_over_f, rel=1e-9)
    assert m.knee(1e-9) == pytest.approx(m.short_context_knee(), rel=1e-6)
    # below the knee the memory term dominates, above it the compute term
    s = qwen_h200.settings.prompt_len + qwen_h200.settings.output_len / 2
    knee = m.knee(s)
    d, k = m.decode, m.costs
    for c, mem_bound in ((knee / 2, True), (knee * 2, False)):
        mem = (k.weight_bytes + c * s * k.kv_bytes_per_token) / d.bw_bytes_per_s
        comp = c * (k.flops_per_token + s * k.attn_flops_per_ctx_token) / d.phi_flops_per_s
        assert (mem > comp) is mem_bound


def test_single_sequence_bounded_by_bandwidth_over_weights(qwen_h200):
    m = load_model(qwen_h200)
    bound = single_stream_bound(m.costs, lookup("h200").memory_bandwidth_bytes_per_s)
    assert m.decode_tokens_per_s(1, 1) < bound
    assert m.decode_tokens_per_s(1, 1) > 0.5 * bound  # 80% bandwidth efficiency, small fixed cost


def test_predicted_profile_is_profile_shaped(qwen_h200, tmp_path):
    p = qwen_h200
    assert p.kind == "predicted" and p.hardware.datasheet.device == "H200"
    assert load_fit(p).method == "analytic" and load_fit(p).assumptions
    p.save(tmp_path / "pred.json")
    back = Profile.load(tmp_path / "pred.json")
    g = next(g for g in back.generation if g.concurrency == 8)
    assert g.tokens_per_s == pytest.approx(load_model(back).generation_tokens_per_s(8, 512, 512), rel=1e-9)
    # 4096 requests are more than the engine runs at once (max_num_seqs 1024 on an H200): it runs the
    # admitted ones and queues the rest, so the point is the plateau's tokens/s, not a skipped point
    m = load_model(back)
    big = next(g for g in back.generation if g.concurrency == 4096)
    a = m.admitted(4096, 512, 512)
    assert big.status == "ok" and a == m.max_num_seqs == 1024
    assert big.tokens_per_s == pytest.approx(m.generation_tokens_per_s(a, 512, 512), rel=1e-9)
    with pytest.raises(UserError, match="prediction"):
        fit_profile(back)


@pytest.mark.slow
def test_fitted_prediction_at_unmeasured_concurrency():
    prof = make_profile(concurrencies=(1, 2, 4, 8, 16, 32, 64), micro_batches=(1, 2, 4, 8), noise=0.005)
    pred = predict_from_profile(prof, concurrency=[3, 24, 48], micro_batches=[3, 6])
    c = Costs.from_spec(prof.model, 4)
    s = prof.settings.prompt_len + prof.settings.output_len / 2
    for g in pred.generation:
        true = decode_step_s(g.concurrency, s, c, TRUE["t0"], TRUE["bw"], TRUE["phi"])
        assert g.decode_step_s == pytest.approx(true, rel=0.03)
    assert [t.micro_batch for t in pred.training] == [3, 6]
    with pytest.raises(UserError, match="--concurrency values must be positive"):
        predict_from_profile(prof, concurrency=[0])


@pytest.mark.slow
def test_a_fitted_prediction_says_where_it_leaves_the_measured_range():
    prof = with_fit(make_profile(concurrencies=(1, 2, 4, 8), micro_batches=(1, 2, 4), noise=0.005))
    inside = load_fit(predict_from_profile(prof, concurrency=[3, 8], micro_batches=[3]))
    assert not [a for a in inside.assumptions if "tokens_per_s_lo/hi" not in a]  # only what the intervals are
    limit = prof.model.max_position_embeddings
    out = load_fit(predict_from_profile(prof, concurrency=[3, 64], micro_batches=[16], prompt_len=limit,
                                        output_len=32, seq_len=2 * limit))
    said = " | ".join(out.assumptions)
    assert f"past demo's max_position_embeddings ({limit}): the model cannot run it" in said
    assert f"sequence length {2 * limit} is past" in said
    assert ("extrapolated past what the profile measured: concurrency above 8, prompt + output above 96 tokens, "
            "micro-batch above 4, sequence length above 128") in said


@pytest.mark.slow
def test_a_context_grid_is_predicted_at_its_longest_measured_context_by_default():
    short = make_profile(concurrencies=(1, 2, 4), prompt_len=64, micro_batches=())
    long = make_profile(concurrencies=(1, 2, 4), prompt_len=512, micro_batches=())
    grid = long.model_copy(update={"generation": short.generation + long.generation,
                                   "settings": long.settings.model_copy(update={"prompt_len": 64})})
    with_fit(grid)
    assert predict_from_profile(grid, concurrency=[2]).settings.prompt_len == 512
    assert predict_from_profile(grid, concurrency=[2], prompt_len=100).settings.prompt_len == 100


@pytest.mark.slow
def test_calibration_carries_measured_efficiencies():
    prof = make_profile(concurrencies=(1, 2, 4, 8, 16, 32, 64), micro_batches=(1, 2, 4), noise=0.005)
    eff = calibration_from(prof)
    # relative to the micro-benchmarks (no datasheet on a CPU): 12/14 and 60/70
    assert eff.decode_bw == pytest.approx(TRUE["bw"] / 14e9, rel=0.03)
    assert eff.decode_phi == pytest.approx(TRUE["phi"] / 70e9, rel=0.03)
    lo, hi = eff.intervals["decode_phi"]
    assert lo < eff.decode_phi < hi
    assert eff.intervals["decode_bw"] == (None, None)  # without the overhead probe BW is not identified
    pred = predict_analytic(resolve_model("qwen2.5-7b").spec, "h200", calibrate=prof, concurrency=(1, 64))
    m = load_model(pred)
    assert m.source == "calibrated"
    assert m.decode.bw_bytes_per_s == pytest.approx(eff.decode_bw * 4.8e12, rel=1e-9)


def test_unknown_gpu_lists_known_devices():
    with pytest.raises(UserError, match="known devices are .*H200"):
        predict_analytic(resolve_model("tiny").spec, "voodoo 5")


def test_cli_predict_analytic(capsys):
    with pytest.raises(SystemExit) as e:
        main(["predict", "--model", "qwen2.5-7b", "--gpu", "h200", "-c", "1,64,256"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "knee at concurrency" in out and "single-sequence bound" in out


def test_cli_predict_needs_one_source(capsys):
    with pytest.raises(SystemExit) as e:
        main(["predict", "--gpu", "h200"])
    assert e.value.code == 2
    assert "either --profile" in capsys.readouterr().err


def test_predicted_profiles_carry_no_invented_samples_or_residuals(qwen_h200):
    for p in [*qwen_h200.generation, *qwen_h200.training]:
        assert p.samples == [] and p.predicted is not None
    g = next(p for p in qwen_h200.generation if p.status == "ok")
    m = load_model(qwen_h200)
    assert g.tokens_per_s == pytest.approx(m.generation_tokens_per_s(g.concurrency, g.prompt_len, g.output_len))
    assert g.cv is None and g.tokens_per_s_samples == []
    assert load_fit(qwen_h200).generation.rms_rel_residual is None
    t = qwen_h200.training[0]
    assert t.step_s == pytest.approx(m.train_step_s(t.micro_batch, t.seq_len) + m.train.optimizer_step_s)


@pytest.mark.slow
def test_a_profile_that_is_not_utf8_is_a_one_line_error(tmp_path):
    from conftest import assert_user_error, run_cli

    bad = tmp_path / "bin.json"
    bad.write_bytes(b"\xff\xfe\x00binary")
    for args in (["fit", str(bad)], ["report", str(bad), "-o", str(tmp_path / "r.html")],
                 ["predict", "--profile", str(bad)]):
        assert_user_error(run_cli(*args), "not utf-8")


def test_the_printed_tables_flag_micro_batches_that_do_not_fit_and_concurrency_past_the_kv_cache(qwen_h200):
    from throughputlab.predict import generation_table, training_table

    m = load_model(qwen_h200)
    max_b = m.max_micro_batch()
    t = training_table(m, [1, max_b, max_b + 1], 2048)
    assert list(t["fits"]) == ["yes", "yes", "no"]
    # past the engine's caps the row is named by the cap that holds the rest in the queue (admission)
    seqs = m.max_num_seqs
    g = generation_table(m, [1, seqs + 1], 512, 512)
    assert list(g["bound"]) == ["memory", "admission: max_num_seqs"] and list(g["running"]) == [1, seqs]
    m.max_num_seqs = 10**6
    g = generation_table(m, [m.kv_sequences(512, 512) + 1], 512, 512)
    assert list(g["bound"]) == ["admission: KV cache"]


@pytest.mark.slow
def test_calibration_caps_impossible_efficiencies_and_keeps_defaults_for_floors():
    """A fitted rate above the calibration device's reference is no efficiency: capped at 100% and
    said. A FLOP rate that is only a floor (every point memory-bound) keeps the stated default."""
    prof = make_profile(concurrencies=(1, 2, 4, 8, 16, 32, 64), micro_batches=(1, 2, 4), noise=0.005,
                        microbench=(14e9, 30e9))  # matmul benchmark below the fitted 60 and 40 GFLOP/s
    eff = calibration_from(prof)
    assert eff.decode_phi == 1.0 and eff.train_phi == 1.0
    said = " | ".join(eff.cautions)
    assert "decode_phi: 200% of the probe's micro-benchmarks on the calibration device; capped at 100%" in said
    assert "train_phi: 13" in said and "% of the probe's micro-benchmarks" in said and "calibrated on a CPU" in said
    assert all(hi <= 1.0 for lo, hi in eff.intervals.values() if hi is not None)

    floor = make_profile(concurrencies=(1, 2, 4), micro_batches=(1, 2, 4), noise=0.005,
                         probe={"hidden_size": 64, "intermediate_size": 64})
    eff = calibration_from(floor)
    assert eff.decode_phi == DEFAULT_EFFICIENCIES.decode_phi
    assert "decode_phi: the profile's phi_flops_per_s is not identified, so the default 50% stays" in eff.cautions
    pred = predict_analytic(resolve_model("qwen2.5-7b").spec, "h200", calibrate=floor, concurrency=(1,))
    assert any(a.startswith("caution: decode_phi") for a in load_fit(pred).assumptions)


def test_a_model_folder_with_only_its_config_is_predicted(tmp_path):
    """An analytic prediction reads the config alone: a folder without weights is enough, and gives the
    preset's own figures."""
    import json

    from conftest import run_main
    from throughputlab.models import resolve_model

    folder = tmp_path / "Qwen2.5-7B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(resolve_model("qwen2.5-7b").spec.config))
    outs = []
    for model in (str(folder), "qwen2.5-7b"):
        r = run_main("predict", "--model", model, "--gpu", "h100", "-c", "1,64", "-o", str(tmp_path / "p.json"))
        assert r.exit_code == 0, r.output
        outs.append([p["predicted"]["total_s"] for p in json.loads((tmp_path / "p.json").read_text())["generation"]])
    assert outs[0] == outs[1]
