"""Two gloo ranks under torch.distributed.run take the same step as one process.

One launch of ``throughputlab.distributed.parity`` (tiny preset, global micro-batch 4 and 3,
float32 and bfloat16, activation checkpointing on and off): the gradients FSDP2 leaves after
the reduce-scatter, gathered in full, and the parameters after one AdamW step, against the
single-process step on the same ids. The same launch also runs two cases with FSDP summing
the gradients instead of averaging them (gradient divide factor 1, the failure PyTorch issue
#162338 reports for gloo): the gradient check must reject them.

Tolerances. float32: gradients ``rtol=1e-5`` (plus ``atol`` of 1e-5 of the tensor's largest
gradient); parameters ``rtol=1e-5``, ``atol=lr/100`` (each element's AdamW update within 1% of
the learning rate: the first update is about ``lr * g/|g|``, so an element whose gradient is
near 0 may move by a fraction of ``lr`` either way). bfloat16 (float32 master weights,
bf16 compute, fp32 reduction): each gradient tensor within 1e-2 of its norm (relative L2; bf16
rounds to 2**-8), and every parameter within ``2*lr`` of the reference (a near-zero gradient may
flip its update's sign: only elements whose gradient is within 1% of the tensor's largest may
differ by more than ``lr``), 99% of them within ``lr/100``. Summed gradients are off by 100% of
the norm. AdamW's update hardly depends on the gradient's scale, which is why the gradients
themselves are compared.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

LR = 1e-3


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity") / "parity.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "throughputlab.distributed.parity", "--model", "tiny", "--seq-len", "32",
           "--case", "float32:4", "--case", "float32:3", "--case", "bfloat16:4", "--case", "float32:4:ac",
           "--case", "float32:4:sum", "--case", "bfloat16:4:sum", "--lr", str(LR), "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "terminate called" not in res.stderr
    data = torch.load(out)
    assert data["world_size"] == 2 and data["lr"] == LR
    return data["cases"]


def _pick(cases, dtype, b, summed=False, ac=False):
    (c,) = [c for c in cases if (c["dtype"], c["micro_batch"], c["summed"], c["activation_checkpointing"]) ==
            (dtype, b, summed, ac)]
    return c["fsdp"], c["reference"]


def _assert_fp32_grads(fsdp, ref):
    assert set(fsdp["grads"]) == set(ref["grads"]) and len(ref["grads"]) > 10
    for name, g in ref["grads"].items():
        torch.testing.assert_close(fsdp["grads"][name], g, rtol=1e-5, atol=1e-5 * g.abs().max().item(),
                                   msg=lambda m: f"{name}: {m}")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.slow
@pytest.mark.parametrize("b,ac", [(4, False), (3, False), (4, True)])  # 3: ranks of 2 and 1 sequences
def test_fp32_gradients_and_step_equal_one_process(cases, b, ac):
    fsdp, ref = _pick(cases, "float32", b, ac=ac)
    _assert_fp32_grads(fsdp, ref)
    for name, p in ref["params"].items():
        torch.testing.assert_close(fsdp["params"][name], p, rtol=1e-5, atol=LR / 100, msg=lambda m: f"{name}: {m}")


@pytest.mark.slow
def test_bf16_gradients_and_step_match_one_process_within_bf16_rounding(cases):
    fsdp, ref = _pick(cases, "bfloat16", 4)
    for name, g in ref["grads"].items():
        assert _rel(fsdp["grads"][name], g) < 1e-2, name
    diffs = torch.cat([(fsdp["params"][n] - p).abs().flatten() for n, p in ref["params"].items()])
    # the first AdamW update is about lr * sign(g): an element whose gradient rounds to the other
    # side of 0 moves the other way, 2 lr apart; that happens only where the gradient is near 0
    assert diffs.max().item() <= 2 * LR * 1.01
    assert (diffs > LR / 100).float().mean().item() < 0.01
    for name, p in ref["params"].items():
        g = ref["grads"][name]
        apart = (fsdp["params"][name] - p).abs() > LR * 1.01
        assert (g[apart].abs() <= 1e-2 * g.abs().max()).all(), name


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_summed_gradients_fail_the_check(cases, dtype):
    """What the gloo bug would look like: the same checks reject it."""
    fsdp, ref = _pick(cases, dtype, 4, summed=True)
    with pytest.raises(AssertionError):
        _assert_fp32_grads(fsdp, ref)
    rel = [_rel(fsdp["grads"][n], g) for n, g in ref["grads"].items()]
    assert min(rel) > 0.9  # 2g against g: off by the whole norm
