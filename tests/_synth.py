"""Synthetic profiles for the fit, predict and report tests: points generated from known
parameters through the model's own formulas, with multiplicative noise on every raw sample."""

from __future__ import annotations

import numpy as np

from throughputlab.models import resolve_model
from throughputlab.models.spec import spec_from_config
from throughputlab.records.machine import CpuInfo, Environment, Hardware, MicroBench
from throughputlab.records.profile import EngineInfo, GenPoint, GenSample, Profile, TrainPoint, TrainSample
from throughputlab.records.settings import SweepSettings
from throughputlab.roofline import Costs, decode_step_s, prefill_s, train_step_s

TRUE = dict(t0=2e-3, bw=12e9, phi=60e9, pre_t0=4e-3, pre_phi=90e9, train_t0=0.05, train_phi=40e9,
            mem0=1.6e9, mem_per=0.25e9)


def make_profile(*, model="demo", noise=0.01, seed=0, concurrencies=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64),
                 micro_batches=(1, 2, 4, 8), prompt_len=64, output_len=32, seq_len=128, repeats=3,
                 true=TRUE, name=None, with_steps=True, microbench=(14e9, 70e9), oom_at=None,
                 datasheet=None, probe=None) -> Profile:
    """``microbench``: (copy B/s, matmul FLOP/s[, matrix-vector B/s]). ``probe``: config overrides of an overhead probe, whose step times are generated too
    (same t0, t_seq, BW, PHI; the probe's own W and F)."""
    rng = np.random.default_rng(seed)
    spec = resolve_model(model).spec
    if name is not None:
        spec = spec.model_copy(update={"name": name})
    costs = Costs.from_spec(spec, 4)
    probe_costs = Costs.from_spec(spec_from_config({**spec.config, **probe}, "probe", "preset"), 4) if probe else None
    t_seq = true.get("t_seq", 0.0)
    s = prompt_len + output_len / 2
    gen = []
    for c in concurrencies:
        td = decode_step_s(c, s, costs, true["t0"], true["bw"], true["phi"], true.get("p"), t_seq, true.get("bw_attn"),
                           true.get("bw_mem"))
        tprobe = decode_step_s(c, s, probe_costs, true["t0"], true["bw"], true["phi"], true.get("p"), t_seq,
                               true.get("bw_attn")) \
            if probe else None
        tp = prefill_s(c, prompt_len, costs, true["pre_t0"], true["bw"], true["pre_phi"])
        samples = []
        for _ in range(repeats):
            e = 1 + noise * rng.standard_normal()
            steps = [td * (1 + noise * rng.standard_normal()) for _ in range(output_len - 1)] if with_steps else []
            dec = td * (output_len - 1) * e
            pre = tp * (1 + noise * rng.standard_normal())
            psteps = [tprobe * (1 + noise * rng.standard_normal()) for _ in range(output_len - 1)] if probe else []
            samples.append(GenSample(total_s=pre + dec, output_tokens=c * output_len,
                                     prefill_s=pre if with_steps else None, decode_s=dec if with_steps else None,
                                     decode_step_s=steps, probe_decode_step_s=psteps))
        gen.append(GenPoint(backend="hf", concurrency=c, prompt_len=prompt_len, output_len=output_len, status="ok",
                            samples=samples))
    train = []
    for b in micro_batches:
        t = train_step_s(b, seq_len, costs, true["train_t0"], true["train_phi"])
        samples = [TrainSample(step_s=t * (1 + noise * rng.standard_normal())) for _ in range(repeats)]
        train.append(TrainPoint(backend="torch", micro_batch=b, seq_len=seq_len, status="ok", samples=samples,
                                peak_mem_bytes=int(true["mem0"] + b * true["mem_per"] * (1 + noise * rng.standard_normal()))))
    if oom_at:
        train.append(TrainPoint(backend="torch", micro_batch=oom_at, seq_len=seq_len, status="oom", error="out of memory"))
    mb = MicroBench(dtype="float32", copy_bandwidth_bytes_per_s=microbench[0], matmul_flops_per_s=microbench[1],
                    gemv_bandwidth_bytes_per_s=microbench[2] if len(microbench) > 2 else None) if microbench else None
    return Profile(
        model=spec,
        hardware=Hardware(device_type="cpu", device_name="Test CPU", cpu=CpuInfo(model="Test CPU", logical_cores=2),
                          memory_total_bytes=8 * 2**30, microbench=mb, datasheet=datasheet),
        environment=Environment(python="3.11", platform="linux", hostname="test"),
        settings=SweepSettings(dtype="float32", device="cpu", gen_backend="hf", train_backend="torch",
                               prompt_len=prompt_len, output_len=output_len, seq_len=seq_len, repeats=repeats),
        engine=EngineInfo(name="transformers", overhead_probe=probe) if probe else None,
        generation=gen, training=train,
    )
