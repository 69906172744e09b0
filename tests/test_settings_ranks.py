"""`bench --resume` of a multi-rank profile with no flags: the ranks come back from the stored spec
(real gloo ranks under torch.distributed.run, the tiny preset)."""

from __future__ import annotations

import pytest

from conftest import assert_user_error, run_cli
from throughputlab.records.profile import Profile

pytestmark = pytest.mark.slow


def test_bare_resume_of_a_two_rank_profile_runs_on_two_ranks(tmp_path):
    out = tmp_path / "ranks.json"
    r = run_cli("bench", "-m", "tiny", "--only", "train", "--nproc-per-node", "2", "--activation-checkpointing",
                "-b", "1", "--seq-len", "16", "--rounds", "1", "--no-telemetry", "--no-collectives", "-o", str(out),
                timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    stored = Profile.load(out).spec.distributed
    assert (stored.nproc_per_node, stored.activation_checkpointing, stored.collectives) == (2, True, False)
    # no rank flag: the stored spec's distributed section, and -b grows the measured axis
    r = run_cli("bench", "--resume", "-b", "1,2", "-o", str(out), timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "2 ranks" in " ".join(r.stdout.split())
    grown = Profile.load(out)
    assert [(p.micro_batch, p.layout.world_size, p.layout.activation_checkpointing) for p in grown.training] == \
        [(1, 2, True), (2, 2, True)]
    assert grown.spec.distributed.nproc_per_node == 2
    # another layout given on resume is refused by the launcher against the ranks' record
    assert_user_error(run_cli("bench", "--resume", "--nproc-per-node", "3", "-o", str(out), timeout=300),
                      "another layout", "nproc_per_node=2 (now 3)")
