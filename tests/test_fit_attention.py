"""The attention as its own term: on a context axis the fit chooses between one roofline over the
summed bytes and FLOPs and the per-kernel form by held-out error, and says which it used."""

from __future__ import annotations

import numpy as np
import pytest

from _synth import TRUE, make_profile
from throughputlab.fit import fit_profile


def _grid(true, contexts=(64, 256, 1024), concurrencies=(1, 2, 4, 8, 16, 32), noise=0.005):
    profiles = [make_profile(model="demo", true=true, prompt_len=ctx, concurrencies=concurrencies,
                             micro_batches=(), noise=noise, seed=i) for i, ctx in enumerate(contexts)]
    prof = profiles[0]
    prof.generation = [p for q in profiles for p in q.generation]
    return prof


def _fit(prof):
    r = fit_profile(prof, bootstrap=0)
    return r.generation.model_dump(), r.model


@pytest.mark.slow
def test_per_kernel_truth_is_fitted_with_the_per_kernel_form_and_its_attention_bandwidth():
    true = {**TRUE, "bw_attn": 3e9}  # the KV reads four times slower than the weight stream
    gen, model = _fit(_grid(true))
    assert gen["form"] == "split", gen["form_loo_mean_abs_error"]
    assert "per-kernel form" in gen["attention_note"]
    assert model.decode.bw_attn_bytes_per_s == pytest.approx(3e9, rel=0.1)
    # a held-out context: the model predicts the step at 2,048 tokens of context
    far = make_profile(model="demo", true=true, prompt_len=2048, concurrencies=(4, 16), micro_batches=(), noise=0.0)
    for p in far.generation:
        s = p.prompt_len + p.output_len / 2
        assert model.decode_step_s(p.concurrency, s) == pytest.approx(p.decode_step_s, rel=0.03)
    share = model.attention_share(16, 2048.0)
    assert 0.3 < share < 1.0


@pytest.mark.slow
def test_summed_truth_keeps_todays_form_and_says_the_per_kernel_one_was_not_kept():
    gen, model = _fit(_grid(TRUE))
    assert gen["form"] in ("max", "smooth") and "split" in gen["form_loo_mean_abs_error"]
    assert "not kept" in gen["attention_note"]
    assert model.decode.bw_attn_bytes_per_s is None


def test_one_context_says_the_attention_terms_are_not_identified_and_what_stands_in():
    gen, model = _fit(make_profile(model="demo", micro_batches=(), noise=0.005))
    assert gen["form"] != "split" and "split" not in gen["form_loo_mean_abs_error"]
    note = gen["attention_note"]
    assert "not identified" in note and "one context" in note and "BW stands in for the KV reads" in note


def test_per_kernel_step_is_slower_than_the_summed_one_at_large_concurrency_and_context():
    from throughputlab import roofline as rf
    from throughputlab.models import resolve_model

    k = rf.Costs.from_spec(resolve_model("qwen2.5-7b").spec, 2)
    summed = rf.decode_step_s(np.array([1.0, 256.0]), np.array([100.0, 3000.0]), k, 1e-3, 2.7e12, 4e14)
    split = rf.decode_step_s(np.array([1.0, 256.0]), np.array([100.0, 3000.0]), k, 1e-3, 2.7e12, 4e14,
                             bw_attn=2.7e12)
    assert split[0] == pytest.approx(summed[0], rel=1e-3)  # weights dominate: the forms agree
    assert split[1] / summed[1] > 1.1  # GEMMs and attention no longer overlap
    # the continuous-batching step without prefill is the decode step, in both forms
    assert rf.mixed_step_s(k, 256, 256 * 3000, 0, 0, 1e-3, 2.7e12, 4e14, 5e14, bw_attn=2.7e12) == \
        pytest.approx(split[1])



@pytest.mark.slow
@pytest.mark.parametrize("contexts", [(64,), (64, 256, 512)])
def test_kv_reads_at_the_probes_read_bandwidth_where_the_fit_would_carry_a_faster_one(contexts):
    """The weights' fitted BW (t0 and W/BW not separately identified, caches) can exceed what the
    memory reads; the KV cache of a long context is streamed from memory every step. With the
    probe's matrix-vector figure the fitted model reads KV no faster than it and predicts 2,048
    tokens from short contexts (one context too); without it the weights' rate carries over."""
    true = {**TRUE, "bw_mem": 6e9}  # weights at 12 GB/s, the KV at the memory's 6 GB/s
    far = make_profile(model="demo", true=true, prompt_len=2048, concurrencies=(4, 16), micro_batches=(), noise=0.0)

    def fitted(gemv):
        profiles = [make_profile(model="demo", true=true, prompt_len=ctx, concurrencies=(1, 2, 4, 8, 16, 32),
                                 micro_batches=(), noise=0.01, seed=i, microbench=(14e9, 70e9, gemv))
                    for i, ctx in enumerate(contexts)]
        prof = profiles[0]
        prof.generation = [p for q in profiles for p in q.generation]
        gen, model = _fit(prof)
        return gen, model, [model.decode_step_s(p.concurrency, p.prompt_len + p.output_len / 2) / p.decode_step_s - 1
                            for p in far.generation]

    gen, model, errs = fitted(6e9)
    assert model.decode.bw_mem_bytes_per_s == 6e9 and model.decode.bw_bytes_per_s > 9e9
    assert "memory's measured read bandwidth, 6 GB/s" in gen["attention_note"]
    assert max(abs(e) for e in errs) < 0.03, errs
    _, uncapped, errs_fast = fitted(None)
    assert uncapped.decode.bw_mem_bytes_per_s is None
    assert min(errs_fast) < -0.15, errs_fast  # the weights' rate carried to the KV reads at 2,048 tokens


@pytest.mark.slow
def test_an_http_engines_points_get_no_ceiling_from_this_machines_probe():
    prof = make_profile(model="demo", micro_batches=(), noise=0.005, microbench=(14e9, 70e9, 6e9))
    _, model = _fit(prof)
    assert model.decode.bw_mem_bytes_per_s == 6e9
    for p in prof.generation:
        p.backend = "openai"
    _, remote = _fit(prof)
    assert remote.decode.bw_mem_bytes_per_s is None
