"""Would a measured attention kernel, in place of a fitted attention rate, predict training steps
across sequence lengths within 5%?

Reads a profile with a sequence-length axis (``benchmarks/seqlen_holdout.py`` writes one), times
torch's scaled-dot-product attention (forward and backward, causal, the model's heads and head
size) at every point's micro-batch and length, times the model's layers, and prints each point's
held-out error of the forward + backward time for three forms, each refitted without the point:

- ``t0 + c*N + a*N*S``: a constant attention rate (the shape of the fit's split form);
- ``t0 + c*N + g*A``: the measured attention time ``A``, scaled by a fitted ``g``;
- ``t0 + c*N + A``: the measured attention time as it is.

``N = b*S`` tokens; the columns are the roofline's FLOPs (``train_step_s`` at unit rates). This is an experiment, not the fit: on a CPU the attention kernel's FLOP rate
changes with the length (its blocking), which no constant rate follows.

    python benchmarks/attention_kernel_fit.py --profile reports/.../seqlen_holdout.json

Run it alone (two CPU-bound processes on two cores slow each other several times over).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import nnls

from throughputlab import roofline as rf
from throughputlab.models import resolve_model
from throughputlab.records.profile import Profile


def attention_s(b: int, s: int, heads: int, head_dim: int, dtype: torch.dtype, iters: int = 9) -> float:
    """Median forward + backward of causal SDPA at (b, heads, s, head_dim), after two warm-ups."""
    q, k, v = (torch.randn(b, heads, s, head_dim, dtype=dtype, requires_grad=True) for _ in range(3))
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(torch.ones_like(out))
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def held_out(cols, y: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Each point's measured/predicted - 1, fitted (non-negative least squares, relative) without it."""
    design = np.column_stack(cols)
    errs = []
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        w = 1 / y[keep]
        x, _ = nnls(design[keep] * w[:, None], (y[keep] - offset[keep]) * w)
        errs.append(y[i] / (design[i] @ x + offset[i]) - 1)
    return np.array(errs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, required=True)
    args = ap.parse_args()
    prof = Profile.load(args.profile)
    spec = resolve_model(prof.model.name, random_weights=True).spec
    torch.set_num_threads(torch.get_num_threads())
    pts = sorted((p for p in prof.training if p.status == "ok"), key=lambda p: (p.seq_len, p.micro_batch))
    b = np.array([p.micro_batch for p in pts], float)
    s = np.array([p.seq_len for p in pts], float)
    y = np.array([statistics.median(x.forward_s + x.backward_s for x in p.samples) for p in pts])
    # transformers repeats the KV heads to the query heads before SDPA
    dtype = getattr(torch, prof.settings.dtype)  # the profile's: bfloat16 kernels differ from float32 ones
    attn = np.array([spec.num_layers * attention_s(p.micro_batch, p.seq_len, spec.num_heads, spec.head_dim, dtype)
                     for p in pts])
    costs = rf.Costs.from_spec(spec, dtype.itemsize)
    gemm_flops = rf.train_step_s(b, s, costs, 0.0, 1.0, phi_attn=np.inf)  # 3*b*S*F
    attn_flops = rf.train_step_s(b, s, costs, 0.0, np.inf, phi_attn=1.0)  # 3*b*S*S*a/2
    one, zero = np.ones_like(y), np.zeros_like(y)
    forms = {"t0 + c*N + a*N*S": held_out([one, gemm_flops, attn_flops], y, zero),
             "t0 + c*N + g*A": held_out([one, gemm_flops, attn], y, zero),
             "t0 + c*N + A": held_out([one, gemm_flops], y, attn)}
    print(f"{prof.model.name} ({spec.num_layers} layers, {spec.num_heads} heads of {spec.head_dim}), "
          f"{args.profile}: forward + backward medians; A = layers x SDPA forward + backward in {prof.settings.dtype}, "
          "timed now")
    print("  seq len  micro-batch  f+b ms    A ms  A share  " + "  ".join(f"{k:>18}" for k in forms))
    for i, p in enumerate(pts):
        cells = "  ".join(f"{100 * forms[k][i]:+17.1f}%" for k in forms)
        print(f"  {p.seq_len:7d}  {p.micro_batch:11d}  {1e3 * y[i]:6.1f}  {1e3 * attn[i]:6.1f}  "
              f"{100 * attn[i] / y[i]:6.0f}%  {cells}")
    for k, e in forms.items():
        print(f"{k:>18}: held-out max {100 * np.max(np.abs(e)):.1f}%, mean {100 * np.mean(np.abs(e)):.1f}%")
    rates = {int(p.seq_len): [] for p in pts}
    for i, p in enumerate(pts):
        rates[int(p.seq_len)].append(attn_flops[i] / attn[i])
    print("SDPA's FLOP rate by length: " + ", ".join(f"{k}: {statistics.median(v) / 1e9:.1f} GFLOP/s"
                                                     for k, v in rates.items()))


if __name__ == "__main__":
    main()
