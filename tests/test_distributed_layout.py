"""The pieces of a distributed run that need no process group: batch split, the torchrun
command, refusals before launch, the records, sharding helpers on a plain model."""

import json
import os

import pytest
import torch

from throughputlab.distributed.fsdp import decoder_blocks, local_bytes, optimizer_state_bytes, param_bytes
from throughputlab.distributed.launch import check_run, torchrun_command
from throughputlab.distributed.trainer import FAIL_ENV, Fault, loss_weight, split_batch
from throughputlab.errors import UserError
from throughputlab.records.distributed import (
    IN_FLIGHT,
    DistributedPoint,
    DistributedSpec,
    RankPhases,
    RankSample,
    RanksFile,
    ranks_path,
)
from throughputlab.records.settings import BenchSpec


@pytest.mark.parametrize("b,n,expected", [(4, 2, [2, 2]), (3, 2, [2, 1]), (1, 2, [1, 0]), (7, 4, [2, 2, 2, 1])])
def test_split_batch_and_weights_average_to_the_global_mean(b, n, expected):
    counts = split_batch(b, n)
    assert counts == expected and sum(counts) == b
    # FSDP averages over n ranks the weighted mean loss of each: every sequence must count 1/b
    for c in counts:
        if c:
            assert loss_weight(c, b, n) / c / n == pytest.approx(1 / b)


@pytest.mark.slow
def test_torchrun_command_on_one_machine_and_on_several(tmp_path):
    job = tmp_path / "job.json"
    one = torchrun_command(job, DistributedSpec(nproc_per_node=2), python="py")
    assert one == ["py", "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "0", "--standalone",
                   "-m", "throughputlab.distributed.train_worker", str(job)]
    many = torchrun_command(job, DistributedSpec(nproc_per_node=8, nnodes=2, node_rank=1,
                                                 rdzv_endpoint="node0:29500"), python="py")
    assert many[many.index("--nnodes"):many.index("-m", 3)] == [
        "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "node0:29500"]
    with pytest.raises(UserError, match="rendezvous endpoint"):
        torchrun_command(job, DistributedSpec(nnodes=2))


def _spec(**kw) -> BenchSpec:
    return BenchSpec.model_validate({"model": "tiny", "only": "train", **kw})


def test_refusals_before_any_process_starts(tmp_path):
    out = tmp_path / "p.json"
    with pytest.raises(UserError, match="training only"):
        check_run(_spec(only="gen"), DistributedSpec(), out, resume=False, force=False)
    with pytest.raises(UserError, match="float32 or bfloat16"):
        check_run(_spec(dtype="fp16"), DistributedSpec(), out, resume=False, force=False)
    with pytest.raises(UserError, match="nothing to resume"):
        check_run(_spec(), DistributedSpec(), out, resume=True, force=False)
    out.write_text("{}")
    with pytest.raises(UserError, match="exists"):
        check_run(_spec(), DistributedSpec(), out, resume=False, force=False)
    with pytest.raises(UserError, match="below nnodes"):
        check_run(_spec(), DistributedSpec(nnodes=2, node_rank=2, rdzv_endpoint="h:1"), out, resume=False, force=True)


def test_records_derive_the_step_from_the_slowest_rank_and_round_trip(tmp_path):
    s = RankSample(ranks=[RankPhases(forward_s=1, backward_s=2, optimizer_s=1),
                          RankPhases(forward_s=1, backward_s=3, optimizer_s=0.5)])
    assert s.step_s == 4.5 and s.slowest_rank == 1
    p = DistributedPoint(micro_batch=4, seq_len=10, world_size=2, nodes=1, param_dtype="bfloat16",
                         master_dtype="float32", reduce_dtype="float32", rank_micro_batches=[2, 2], samples=[s])
    assert p.tokens_per_s == pytest.approx(40 / 4.5) and p.tokens_per_s_per_device == pytest.approx(20 / 4.5)
    f = RanksFile(layout=DistributedSpec(), world_size=2, nodes=1, points=[p])
    path = ranks_path(tmp_path / "run.json")
    assert path.name == "run.ranks.json"
    f.save(path)
    assert RanksFile.load(path) == f
    data = json.loads(path.read_text())
    data["points"][0]["surprise"] = 1
    path.write_text(json.dumps(data))
    with pytest.raises(UserError, match="not a valid ranks file"):
        RanksFile.load(path)


def test_fault_hook_parses_and_fires_only_where_asked(monkeypatch):
    monkeypatch.setenv(FAIL_ENV, "oom:rank=1:micro_batch=8")
    f = Fault.from_env()
    f.fire(0, 8)
    f.fire(1, 4)
    with pytest.raises(torch.OutOfMemoryError):
        f.fire(1, 8)
    monkeypatch.delenv(FAIL_ENV)
    assert Fault.from_env() is None


def test_decoder_blocks_and_bytes_of_a_plain_model():
    from throughputlab.backends.torch_common import build_model
    from throughputlab.models import resolve_model

    model = build_model(resolve_model("tiny"), "float32", "cpu", 0)
    blocks = decoder_blocks(model)
    assert [n for n, _ in blocks] == [f"model.layers.{i}" for i in range(4)]
    assert param_bytes(model) == sum(p.numel() for p in model.parameters()) * 4
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(4, 100, (1, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    n_params = len(list(model.parameters()))
    assert optimizer_state_bytes(opt) == 2 * param_bytes(model) + 4 * n_params  # exp_avg, exp_avg_sq, step
    assert local_bytes([None, torch.zeros(3, dtype=torch.bfloat16)]) == 6


class _Events:
    def __init__(self):
        self.events = []

    def point_started(self, kind, x):
        self.events.append(("started", x))

    def point_finished(self, point, resumed=False):
        self.events.append(("finished", getattr(point, "concurrency", None) or point.micro_batch, resumed))


def test_a_point_measured_between_two_polls_is_still_reported_started_then_finished(tmp_path):
    """The ranks may write a point in flight and then finished before the launcher's next look at the
    profile: the progress hooks must still see it start, once, before it finishes."""
    from tests._synth import make_profile
    from throughputlab.distributed import launch, replicas

    path = tmp_path / "p.json"
    prof = make_profile(concurrencies=(1, 2), micro_batches=(1, 2))
    gen, train = prof.generation, prof.training
    # generation: point 1 seen in flight, then both finished in one write (point 2 was never seen in flight)
    hooks = _Events()
    watch = replicas._Watch(path, hooks, resume=False)
    flight = gen[0].model_copy(update={"status": "error", "error": IN_FLIGHT, "samples": []})
    prof.model_copy(update={"generation": [flight], "training": []}).save(path)
    watch.poll()
    os.utime(path, ns=(1, 1))
    prof.model_copy(update={"generation": gen, "training": []}).save(path)
    watch.poll()
    assert hooks.events == [("started", 1), ("finished", 1, False), ("started", 2), ("finished", 2, False)]
    # training under torchrun: a finished point with no in-flight record seen
    hooks = _Events()
    watch = launch._Watch(path, hooks, resume=False)
    train = [p.model_copy(update={"backend": launch.BACKEND_NAME}) for p in train]
    prof.model_copy(update={"generation": [], "training": train}).save(path)
    watch.poll()
    assert hooks.events == [("started", 1), ("finished", 1, False), ("started", 2), ("finished", 2, False)]
