"""MBU and MFU of measured points: achieved bytes/s and FLOP/s (from the roofline module's byte
and FLOP counts) over the datasheet peak and the probe's micro-benchmarks. No scipy."""

from __future__ import annotations

from typing import Optional

from throughputlab import roofline as rf
from throughputlab.records.fit import Peaks, Utilisation
from throughputlab.records.profile import Profile
from throughputlab.roofline import Costs


def _frac(x: Optional[float], peak: Optional[float]) -> Optional[float]:
    return x / peak if x is not None and peak else None


def _util(phase, x, ctx, status, t, nbytes, flops, peaks: Peaks) -> Utilisation:
    bps = nbytes / t if (t and nbytes is not None) else None
    fps = flops / t if (t and flops is not None) else None
    return Utilisation(
        phase=phase, x=x, context_len=ctx, status=status, time_s=t, achieved_bytes_per_s=bps, achieved_flops_per_s=fps,
        mbu_datasheet=_frac(bps, peaks.datasheet_bytes_per_s), mfu_datasheet=_frac(fps, peaks.datasheet_flops_per_s),
        mbu_microbench=_frac(bps, peaks.microbench_bytes_per_s), mfu_microbench=_frac(fps, peaks.microbench_flops_per_s),
    )


def utilisation(profile: Profile, costs: Costs, peaks: Peaks) -> list[Utilisation]:
    """MBU and MFU of every point (failed points listed with their status and no figures)."""
    out: list[Utilisation] = []
    for p in profile.generation:
        s = rf.mean_context(p.prompt_len, p.output_len)
        t = p.decode_step_s if p.status == "ok" else None
        out.append(_util("decode", p.concurrency, s, p.status, t, rf.decode_bytes(costs, p.concurrency, s),
                         rf.decode_flops(costs, p.concurrency, s), peaks))
        tp = p.prefill_s if p.status == "ok" else None
        if tp:
            out.append(_util("prefill", p.concurrency, p.prompt_len, p.status, tp,
                             rf.prefill_bytes(costs, p.concurrency, p.prompt_len),
                             rf.prefill_flops(costs, p.concurrency, p.prompt_len), peaks))
    for p in profile.training:
        t = p.step_s if p.status == "ok" else None
        out.append(_util("train", p.micro_batch, p.seq_len, p.status, t, None,
                         rf.train_flops(costs, p.micro_batch, p.seq_len), peaks))
    return out
