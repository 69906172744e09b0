"""Partial rollouts (APRIL): over-provision, stop when the batch's prompts are done, carry the rest."""

from __future__ import annotations

import pytest

from conftest import assert_user_error, run_cli
from throughputlab.decide.lengths import LengthDist
from throughputlab.decide.partial import simulate_partial
from throughputlab.decide.rollout import EngineCaps, simulate_rollout
from throughputlab.decide.steptime import RLShape, StepModel
from throughputlab.models import resolve_model
from throughputlab.roofline import Costs
from throughputlab.throughput import DecodeParams, PrefillParams, ThroughputModel, TrainParams


def model() -> ThroughputModel:
    """Memory-bound decode (the regime where a rollout's length, not its tokens, sets its time)."""
    return ThroughputModel(
        source="analytic", costs=Costs.from_spec(resolve_model("demo").spec, 4),
        decode=DecodeParams(t0_s=2e-3, bw_bytes_per_s=10e9, phi_flops_per_s=80e12),
        prefill=PrefillParams(t0_s=5e-3, bw_bytes_per_s=12e9, phi_flops_per_s=150e12),
        train=TrainParams(t0_s=0.01, phi_flops_per_s=50e9, optimizer_step_s=0.2, mem0_bytes=2e9,
                          mem_per_sample_bytes=0.5e9, device_memory_bytes=8e9))


def _partial(dist: LengthDist, over: float, caps: EngineCaps, prompts: int = 32, group: int = 4):
    return simulate_partial(model(), 64, caps, prompts, group, group, over,
                            lambda n, k: dist.sample(n * group, 100 + k))


@pytest.mark.parametrize("cap", [None, 64])
def test_a_long_tail_ends_sooner_and_trains_some_older_tokens(cap):
    dist = LengthDist(kind="lognormal", mean=100, sigma=1.2, max_tokens=2000)
    caps = EngineCaps(max_num_seqs=cap)
    full = simulate_rollout(model(), dist.sample(32 * 4, 100), 64, caps, group=4)
    roll, off, carried = _partial(dist, 0.25, caps)
    assert roll.wall_s < 0.9 * full.wall_s
    assert 0 < off < 1 and carried > 0
    assert roll.recompute_s > 0  # carried responses recompute their KV when they resume


def test_fixed_lengths_save_nothing():
    dist = LengthDist(kind="fixed", high=100)
    for caps in (EngineCaps(), EngineCaps(max_num_seqs=64)):
        full = simulate_rollout(model(), dist.sample(32 * 4), 64, caps, group=4)
        roll, _, _ = _partial(dist, 0.25, caps)
        assert roll.wall_s == pytest.approx(full.wall_s, rel=1e-9)


def test_no_over_provisioning_is_the_full_rollout_every_step():
    dist = LengthDist(kind="lognormal", mean=100, sigma=1.2, max_tokens=2000)
    roll, off, carried = _partial(dist, 0.0, EngineCaps(max_num_seqs=64))
    again = simulate_rollout(model(), dist.sample(32 * 4, 103), 64, EngineCaps(max_num_seqs=64), group=4)
    assert roll.wall_s == pytest.approx(again.wall_s, rel=1e-9) and off == 0 and carried == 0


def test_the_step_reports_the_saving_against_full_rollouts():
    shape = RLShape.model_validate(dict(prompt_len=64, partial_rollout=0.25,
                                        response={"dist": "lognormal:mean=100,sigma=1.2,max=2000"}))
    st = StepModel(model(), shape).step(32, 4)
    pr = st.partial
    assert pr is not None and st.gen_s == pr.gen_s < pr.full_gen_s
    assert pr.saved_share == pytest.approx(1 - pr.gen_s / pr.full_gen_s) and 0 < pr.off_policy_token_share < 1
    assert StepModel(model(), shape.model_copy(update={"partial_rollout": 0.0})).step(32, 4).partial is None


@pytest.mark.slow
@pytest.mark.parametrize("value, says", [("-0.1", "between 0 and 1"), ("1.5", "between 0 and 1"),
                                         ("nan", "finite number")])
def test_bad_over_provisioning_is_a_one_line_error(tmp_path, value, says):
    r = run_cli("decide", "--profile", str(tmp_path / "none.json"), "--prompts", "8", "--partial-rollout", value)
    assert_user_error(r, "partial_rollout", says)
