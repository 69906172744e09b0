"""Scaling efficiency over world sizes, from profiles of one training point each."""

from __future__ import annotations

from pathlib import Path

import pytest

from _synth import make_profile
from throughputlab.distributed.scaling import per_rank_micro_batches, scaling_rows, world_size_output
from throughputlab.records.layout import ParallelLayout
from throughputlab.records.profile import Profile, TrainPoint, TrainSample


def _profile(n: int, points: dict[int, float]) -> Profile:
    prof = make_profile(model="tiny", concurrencies=(), micro_batches=())
    prof.training = [TrainPoint(backend="torch-fsdp", micro_batch=b, seq_len=100, status="ok",
                                samples=[TrainSample(step_s=s)], layout=ParallelLayout.training(n, fsdp=True))
                     for b, s in points.items()]
    return prof


def test_weak_scaling_efficiency_compares_per_device_throughput_at_the_same_per_rank_batch():
    one = _profile(1, {2: 1.0, 4: 2.0})  # 200 tok/s at 2 per rank
    two = _profile(2, {4: 2.5, 8: 4.0, 6: 3.0})  # per rank 2: 400 tokens over 2.5 s -> 80 per device
    rows = {(r.per_rank, r.world_size): r for r in scaling_rows([one, two])}
    assert rows[(2, 1)].efficiency == 1.0 and rows[(2, 1)].tokens_per_s == pytest.approx(200)
    assert rows[(2, 2)].tokens_per_s == pytest.approx(400 / 2.5)
    assert rows[(2, 2)].tokens_per_s_per_device == pytest.approx(80)
    assert rows[(2, 2)].efficiency == pytest.approx(80 / 200)
    assert rows[(4, 2)].efficiency == pytest.approx((800 / 4.0 / 2) / (400 / 2.0))
    assert rows[(3, 2)].efficiency is None  # no 1-rank point at 3 per rank: nothing to compare with


def test_names_and_per_rank_batches():
    assert world_size_output(Path("out/run.json"), 4) == Path("out/run.ws4.json")
    assert per_rank_micro_batches([1, 2], 4) == [4, 8] and per_rank_micro_batches("auto", 4) == "auto"
