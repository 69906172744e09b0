"""The admission limit in the fit: recorded by the engine, identified from the curve, and told apart
from a compute-bound plateau."""

from __future__ import annotations

import pytest

from tests._synth import make_profile
from throughputlab.fit.admission import admission_of, from_curve
from throughputlab.fit.run import fit_profile
from throughputlab.predict import predict_from_profile
from throughputlab.records.profile import EngineInfo, GenSample

CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64)


def _queued(limit: int, *, engine=None, steps=True, noise=0.01, seed=0):
    """A sweep whose engine runs at most ``limit`` requests at once, timed as vLLM times it: each point past
    it is c/limit batches of the point at ``limit``; its per-step times are a batch of ``limit``'s, its time to
    the first token holds the wait for the batches before, and its decode time is the last batch's."""
    prof = make_profile(concurrencies=CONCURRENCIES, noise=noise, seed=seed, with_steps=steps)
    at = {p.concurrency: p for p in prof.generation}
    out = []
    for p in prof.generation:
        if p.concurrency > limit:
            k = p.concurrency / limit
            samples = [GenSample(total_s=s.total_s * k, output_tokens=int(s.output_tokens * k),
                                 prefill_s=None if s.prefill_s is None else s.prefill_s + (k - 1) * s.total_s,
                                 decode_s=s.decode_s, decode_step_s=s.decode_step_s) for s in at[limit].samples]
            p = p.model_copy(update={"samples": samples})
        out.append(p)
    return prof.model_copy(update={"generation": out, "engine": engine})


@pytest.mark.slow
def test_a_recorded_kv_cache_sets_the_limit_and_the_points_past_it_fit_as_its_batches():
    # 64 + 32 tokens per request in blocks of 16: 96 tokens, so 768 tokens hold 8 requests
    engine = EngineInfo(name="vllm", kv_cache_tokens=768, max_num_seqs=256, engine_args={"block_size": 16})
    prof = _queued(8, engine=engine)
    adm = admission_of(prof, prof.generation)
    assert adm is not None and adm.limit == 8 and adm.bound == "KV cache" and not adm.from_curve
    fit = fit_profile(prof)
    g = fit.generation
    assert g.ceiling == "admission: KV cache" and g.admission_limit == 8 and "768 tokens" in g.admission_note
    # the points past 8, held out of the fit, are predicted as what they are: batches of 8
    assert all(abs(e.loo_rel_error) < 0.02 for e in g.points if e.x > 8)
    assert [e.x for e in g.points] == list(CONCURRENCIES)  # the points keep their own concurrency
    # served tokens/s is flat past the limit
    pred = predict_from_profile(prof, concurrency=[8, 64, 128])
    rates = [p.tokens_per_s for p in pred.generation]
    assert rates[1] == pytest.approx(rates[0], rel=1e-6) and rates[2] == pytest.approx(rates[0], rel=1e-6)


@pytest.mark.slow
def test_without_the_limit_the_same_sweep_is_fitted_worse():
    prof = _queued(8)
    blind = prof.model_copy(update={"generation": prof.generation})
    import throughputlab.fit.run as run

    with_limit = fit_profile(prof)  # identified from the curve (no engine record)
    assert with_limit.generation.ceiling == "admission: the curve" and with_limit.generation.admission_limit == 8
    assert with_limit.model.max_num_seqs == 8  # the cap the curve showed stands for the engine's
    orig = run.admission_of
    run.admission_of = lambda profile, points: None
    try:
        without = fit_profile(blind)
    finally:
        run.admission_of = orig
    assert not without.generation.ceiling.startswith("admission")
    # flat steps and flat tokens/s past 8 fit no roofline: the blind fit misses the points it holds out
    past = lambda f: max(abs(e.loo_rel_error) for e in f.generation.points if e.x > 8)  # noqa: E731
    assert past(with_limit) < 0.05 < past(without)


@pytest.mark.slow
def test_a_compute_bound_plateau_is_not_read_as_admission():
    # the synthetic truth's knee is near concurrency 10: past it tokens/s flattens but the step grows
    prof = make_profile(concurrencies=CONCURRENCIES, noise=0.01)
    assert from_curve(prof.generation) is None
    assert fit_profile(prof).generation.ceiling == "compute"


def test_a_flat_curve_without_step_times_is_left_to_the_roofline():
    prof = _queued(8, steps=False)
    assert from_curve(prof.generation) is None
