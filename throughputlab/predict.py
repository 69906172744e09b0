"""Predictions as profiles: from a fitted profile, or from the model config and a datasheet alone.

The analytic predictor (docs/model.md, "Analytic prediction") evaluates the same formulas as
the fit with ``BW = efficiency x datasheet bandwidth`` and ``PHI = efficiency x datasheet
FLOP/s``. The efficiencies are stated defaults, or measured on another device (``calibrate``:
fitted BW and PHI over that device's peaks), so a CPU or A100 profile can predict an H200.
Every prediction is a ``Profile`` with ``kind="predicted"`` whose ``fit`` holds the model,
so ``report`` and ``decide`` read it like a measured one. No torch.
"""

from __future__ import annotations

import platform
import socket
import sys
from typing import Literal, Optional, Sequence, Union

import pandas as pd
from pydantic import BaseModel, ConfigDict

from throughputlab import roofline as rf
from throughputlab.calibration import DEFAULT_EFFICIENCIES, Efficiencies, calibration_from, efficiencies_for
from throughputlab.errors import UserError
from throughputlab.fit.knees import generation_knee_statement, knee_statement
from throughputlab.fit.load import load_or_fit
from throughputlab.fit.mbu import utilisation
from throughputlab.fit.schema import FitResult
from throughputlab.models.quant import checkpoint_lines
from throughputlab.models.spec import ModelSpec, dtype_bytes
from throughputlab.predict_engine import EngineOptions, check_parts, decode_layer_counts, engine_lines, resolve, size_kv
from throughputlab.predict_engine import t_seq_s as _t_seq_s
from throughputlab.records.base import now_iso
from throughputlab.records.fit import GenerationFit, ParamEstimate, Peaks
from throughputlab.records.machine import Environment, Hardware
from throughputlab.records.peaks import (
    INTER_NODE_BYTES_PER_S,
    balance_vs_reference,
    device_names,
    link_bandwidth,
    lookup,
    peak_flops,
)
from throughputlab.records.profile import EngineInfo, GenPoint, GenPrediction, Profile, TrainPoint, TrainPrediction
from throughputlab.records.settings import SweepSettings
from throughputlab.roofline import ADAM_BYTES_PER_PARAM, Costs
from throughputlab.spread import device_family, published_spread
from throughputlab.throughput import CommParams, DecodeParams, PrefillParams, ThroughputModel, TrainParams

# ---------------------------------------------------------------- analytic model


class Layout(BaseModel):
    """Devices of a prediction: ``gpus`` over ``nodes``, generation engines of ``tp`` devices
    (``gpus / tp`` of them), training with FSDP over every device (``train_tp`` > 1: FSDP x TP, 2D)."""

    model_config = ConfigDict(extra="forbid")
    gpus: int = 1
    tp: int = 1
    nodes: int = 1
    train_tp: int = 1
    activation_checkpointing: Union[bool, Literal["none", "selective", "full"], str] = False  # True: full

    def check(self) -> "Layout":
        try:
            rf.checkpointing_mode(self.activation_checkpointing)
        except ValueError:
            raise UserError(f"--activation-checkpointing {self.activation_checkpointing}: use none, selective (the "
                            "attention core recomputed) or full (each block's forward recomputed)") from None
        for name, v in (("--tp", self.tp), ("--nodes", self.nodes), ("--gpus", self.gpus),  # --gpus: tp x nodes
                        ("--train-tp", self.train_tp)):
            if v < 1:
                raise UserError(f"{name} must be a positive integer, got {v}")
        if self.gpus % self.nodes:
            raise UserError(f"--nodes {self.nodes} does not divide --gpus {self.gpus}: give the same number of "
                            "GPUs on every node")
        per_node = self.gpus // self.nodes
        if self.tp > per_node:
            raise UserError(f"--tp {self.tp} is larger than the {per_node} GPU(s) of a node: tensor parallelism "
                            "stays within a node")
        for flag, tp in (("--tp", self.tp), ("--train-tp", self.train_tp)):
            if tp > per_node or per_node % tp:
                raise UserError(f"{flag} {tp} does not divide the {per_node} GPU(s) of a node: tensor parallelism "
                                "stays within a node")
        return self

    @property
    def engines(self) -> int:
        return self.gpus // self.tp


def _comm(ds_key: str, layout: Layout, eff: Efficiencies) -> tuple[CommParams, str]:
    link, source = link_bandwidth(ds_key)
    per_node = max(layout.gpus // layout.nodes, 1)
    fsdp_bw = rf.fsdp_link_bytes_per_s(link, layout.nodes, INTER_NODE_BYTES_PER_S, per_node)
    if layout.nodes > 1:
        source += f"; across nodes a ring over {per_node} NICs a node (one 400 Gb/s NIC per GPU), under the node's link"
    pcie = "PCIe" in source  # NCCL alone: no custom all-reduce regime
    return CommParams(tp_busbw_bytes_per_s=eff.comm_bw * link, tp_alpha_s=rf.TP_PCIE_ALPHA_S if pcie else eff.tp_alpha_s,
                      tp_small_alpha_s=None if pcie else eff.tp_small_alpha_s,
                      tp_small_busbw_bytes_per_s=None if pcie else eff.tp_small_bw_share * link,
                      fsdp_busbw_bytes_per_s=eff.comm_bw * fsdp_bw, fsdp_alpha_s=eff.fsdp_alpha_s,
                      fsdp_hidden_share=1.0 - fsdp_exposed(layout.nodes, eff)[0], source=source), source


def fsdp_exposed(nodes: int, eff: Efficiencies) -> tuple[float, str]:
    """Exposed share of FSDP's traffic: the published one for the node count, else 1 - eff.fsdp_hidden."""
    return (1.0 - eff.fsdp_hidden, "as given") if eff.fsdp_hidden is not None else rf.fsdp_exposed_share(nodes)


def train_mfu(device: str, dtype: str, eff: Efficiencies, costs: Optional[Costs] = None) -> tuple[float, str]:
    """Training FLOP/s share of peak: as calibrated, else the device family's published figure (for a
    mixture-of-experts model, times its share of a dense model's: roofline.moe_train_share)."""
    if eff.train_phi_measured:
        return eff.train_phi, f"calibrated ({eff.source})"
    mfu, source = rf.train_mfu(device, dtype)
    balance = balance_vs_reference(lookup(device), dtype)
    share, why = rf.moe_train_share(costs, balance) if costs is not None else (1.0, "")
    return mfu * share, source + (f"; {why}" if why else "")


def _model_checkpointing(mode) -> Union[bool, str]:
    """The ThroughputModel's field: on/off as before (full: True), \"selective\" as itself."""
    m = rf.checkpointing_mode(mode)
    return "selective" if m == "selective" else m == "full"


def analytic_model(spec: ModelSpec, gpu: str, dtype: str = "bfloat16", eff: Efficiencies = DEFAULT_EFFICIENCIES,
                   layout: Layout = Layout(), engine: EngineOptions = EngineOptions(), prompt_len: int = 512,
                   output_len: int = 512) -> tuple[ThroughputModel, Hardware, Peaks]:
    """ThroughputModel from the config and the datasheet row of ``gpu`` scaled by ``eff``, for
    ``layout``: per-device rates, weights and KV sharded over an engine's ``tp`` devices, training
    state sharded over every device; the engine's KV cache, caps and fixed costs from ``engine``."""
    layout = layout.check()
    ds = lookup(gpu)
    if ds is None:
        raise UserError(f"--gpu {gpu}: no datasheet row for it; known devices are {', '.join(device_names())}")
    check_parts(spec, ds, layout.gpus, layout.nodes, layout.tp, layout.train_tp)
    spec = spec.with_rope_scaling(engine.check().rope_scaling)
    settings = resolve(engine, spec, ds, layout.tp, prompt_len, output_len)
    bpp = dtype_bytes(dtype)
    phi_peak = peak_flops(ds, dtype)
    if phi_peak is None:
        raise UserError(f"--dtype {dtype}: the {ds.device} datasheet row has no {dtype} figure; "
                        f"use one of {', '.join(ds.flops_per_s)}")
    costs = Costs.from_spec(spec, bpp, rf.kv_value_bytes(bpp, settings.kv_cache_dtype))
    bw = eff.decode_bw * ds.memory_bandwidth_bytes_per_s
    gemm_phi = phi_peak * (eff.fp8_gemm_share if dtype == "fp8" else 1.0)  # decode and prefill GEMMs
    mem = float(ds.memory_bytes) if ds.memory_bytes else None
    settings, kv_tokens = size_kv(settings, costs, layout.tp, mem)  # per engine
    settings = settings.model_copy(update={"host_factor": eff.host_factor})
    t0 = rf.decode_fixed_s(spec.num_layers, step_s=eff.decode_t0_s, gemm_floors=not eff.decode_t0_includes_layers,
                           floor_s=eff.gemm_floor_s, **decode_layer_counts(spec))
    t0 += rf.engine_version_step_s(settings.name, settings.version, settings.scheduler_steps) * eff.host_factor
    comm, _ = _comm(ds.device, layout, eff)
    model = ThroughputModel(
        source="analytic" if eff.source.startswith("stated defaults") else "calibrated",
        costs=costs, engine=settings, max_num_seqs=settings.max_num_seqs,
        decode=DecodeParams(t0_s=t0, bw_bytes_per_s=bw, phi_flops_per_s=eff.decode_phi * gemm_phi,
                            t_seq_s=eff.decode_t_seq_s or eff.host_factor * _t_seq_s(settings, layout.tp),
                            bw_attn_bytes_per_s=eff.attention_bw * ds.memory_bandwidth_bytes_per_s if eff.attention_bw else None),
        prefill=PrefillParams(t0_s=eff.prefill_t0_s, bw_bytes_per_s=bw, phi_flops_per_s=eff.prefill_phi * gemm_phi),
        train=TrainParams(t0_s=eff.train_t0_s, phi_flops_per_s=train_mfu(ds.device, dtype, eff, costs)[0] * phi_peak,
                          mem0_bytes=rf.fsdp_memory_per_rank_bytes(costs, layout.gpus, 0, 0.0),
                          mem_per_sample_bytes=None, device_memory_bytes=mem),
        kv_cache_tokens=kv_tokens, tp=layout.tp, train_devices=layout.gpus, train_tp=layout.train_tp, nodes=layout.nodes,
        activation_checkpointing=_model_checkpointing(layout.activation_checkpointing), comm=comm,
    )
    hw = Hardware(device_type="cuda", device_name=ds.device, memory_total_bytes=ds.memory_bytes, datasheet=ds)
    peaks = Peaks(dtype=dtype, datasheet_device=ds.device, datasheet_bytes_per_s=ds.memory_bandwidth_bytes_per_s,
                  datasheet_flops_per_s=phi_peak, datasheet_source=ds.source)
    return model, hw, peaks


# ---------------------------------------------------------------- predicted profiles


def _environment() -> Environment:
    from throughputlab import __version__

    return Environment(python=sys.version.split()[0], platform=platform.platform(), hostname=socket.gethostname(),
                       packages={"throughputlab": __version__}, command_line=list(sys.argv))


def _check_lists(concurrency: Sequence[int], micro_batches: Sequence[int], prompt_len: int, output_len: int,
                 seq_len: int) -> None:
    for name, xs in (("--concurrency", concurrency), ("--micro-batch", micro_batches)):
        bad = [x for x in xs if not isinstance(x, int) or x <= 0]
        if bad:
            raise UserError(f"{name} values must be positive integers, got {bad[0]}")
    for name, v in (("--prompt-len", prompt_len), ("--output-len", output_len), ("--seq-len", seq_len)):
        if v <= 0:
            raise UserError(f"{name} must be a positive integer, got {v}")


def _predicted_points(model: ThroughputModel, concurrency, prompt_len, output_len, micro_batches, seq_len):
    """Predicted points; a generation point past the engine's admission runs its admitted sequences at a
    time and queues the rest (c requests take c/a batches of a: tokens/s flat past a)."""
    gen, train = [], []
    if model.decode is not None:
        for c in concurrency:
            a = model.admitted(c, prompt_len, output_len)
            if a < 1:
                gen.append(GenPoint(backend="predicted", concurrency=c, prompt_len=prompt_len, output_len=output_len,
                                    status="skipped", error=f"the KV cache ({model.kv_cache_tokens} tokens) holds no "
                                                            f"sequence of {prompt_len + output_len} tokens"))
                continue
            td = model.decode_step_s(a, rf.mean_context(prompt_len, output_len))
            tp = model.prefill_s(a, prompt_len)
            total = float(rf.static_batch_s(tp, td, output_len, model.gen_overhead_s)) * c / a
            band = model.gen_spread.time(total, model.gen_spread.level) if model.gen_spread else None
            gen.append(GenPoint(backend="predicted", concurrency=c, prompt_len=prompt_len, output_len=output_len,
                                status="ok", predicted=GenPrediction(
                                    total_s=total, prefill_s=tp, decode_step_s=td, total_s_interval=band,
                                    tpot_s=model.served_tpot_s(c, prompt_len, output_len),
                                    tpot_s_interval=model.served_tpot_s_interval(c, prompt_len, output_len))))
    if model.train is not None:
        max_b = model.max_micro_batch()
        t = model.train
        for b in micro_batches:
            step = model.train_step_s(b, seq_len) + t.optimizer_step_s
            mem = model.memory_bytes(b)
            mem = None if mem is None else int(mem)
            status, err = "ok", None
            if max_b is not None and b > max_b:
                status, err = "oom", f"predicted peak memory exceeds the device memory (largest micro-batch {max_b})"
            band = model.train_spread.time(step, model.train_spread.level) if model.train_spread else None
            train.append(TrainPoint(backend="predicted", micro_batch=b, seq_len=seq_len, status=status, error=err,
                                    predicted=TrainPrediction(step_s=step, step_s_interval=band), peak_mem_bytes=mem))
    return gen, train


def predict_from_profile(profile: Profile, *, concurrency: Sequence[int] = (), prompt_len: Optional[int] = None,
                         output_len: Optional[int] = None, micro_batches: Sequence[int] = (),
                         seq_len: Optional[int] = None) -> Profile:
    """The fitted model of ``profile`` evaluated at points that were not measured."""
    fit = load_or_fit(profile)
    st = profile.settings
    gen_ok = [p for p in profile.generation if p.status == "ok"]
    train_ok = [p for p in profile.training if p.status == "ok"]
    # a grid's defaults: its longest measured length (the single length of the settings may not be measured)
    prompt_len = prompt_len or max((p.prompt_len for p in gen_ok), default=st.prompt_len)
    output_len = output_len or st.output_len
    seq_len = seq_len or max((p.seq_len for p in train_ok), default=st.seq_len)
    _check_lists(concurrency, micro_batches, prompt_len, output_len, seq_len)
    gen, train = _predicted_points(fit.model, concurrency, prompt_len, output_len, micro_batches, seq_len)
    settings = st.model_copy(update={"prompt_len": prompt_len, "output_len": output_len, "seq_len": seq_len})
    notes = [f"predicted by the {fit.method} model of a profile measured on {profile.hardware.device_name}",
             *profile.notes]
    out = Profile(kind="predicted", model=profile.model, hardware=profile.hardware, environment=_environment(),
                  settings=settings, engine=profile.engine, generation=gen, training=train, notes=notes)
    # the stored fit keeps its parameters and held-out errors; utilisation is of the predicted points
    beyond = _beyond_measured(profile, gen_ok, train_ok, gen, train, prompt_len, output_len, seq_len) \
        + _interval_lines(fit.model)
    out.fit = fit.model_copy(update={"utilisation": utilisation(out, fit.model.costs, fit.peaks),
                                     "assumptions": fit.assumptions + beyond}).model_dump(mode="json")
    return out


def _interval_lines(model: ThroughputModel) -> list[str]:
    """What the tables' tokens_per_s_lo/hi columns are, per phase."""
    return [f"{phase} tokens_per_s_lo/hi: {sp.basis}" if sp else f"{phase}: no interval (too few points to bound it)"
            for phase, sp, part in (("generation", model.gen_spread, model.decode),
                                    ("training", model.train_spread, model.train)) if part is not None]


def _beyond_measured(profile: Profile, gen_ok, train_ok, gen, train, prompt_len: int, output_len: int,
                     seq_len: int) -> list[str]:
    """Where a prediction leaves what the profile measured, and lengths the model cannot run."""
    out = []
    limit = profile.model.context_limit
    if gen and limit and prompt_len + output_len > limit:
        out.append(f"prompt {prompt_len} + output {output_len} is past {profile.model.name}'s {profile.model.context_limit_name} "
                   f"({limit}): the model cannot run it")
    if train and limit and seq_len > limit:
        out.append(f"sequence length {seq_len} is past {profile.model.name}'s {profile.model.context_limit_name} ({limit})")
    past = []
    if gen and gen_ok:
        c_max, ctx_max = max(p.concurrency for p in gen_ok), max(p.prompt_len + p.output_len for p in gen_ok)
        if max(p.concurrency for p in gen) > c_max:
            past.append(f"concurrency above {c_max}")
        if prompt_len + output_len > ctx_max:
            past.append(f"prompt + output above {ctx_max} tokens")
    if train and train_ok:
        b_max, s_max = max(p.micro_batch for p in train_ok), max(p.seq_len for p in train_ok)
        if max(p.micro_batch for p in train) > b_max:
            past.append(f"micro-batch above {b_max}")
        if seq_len > s_max:
            past.append(f"sequence length above {s_max} (the memory line too)")
    if past:
        out.append("extrapolated past what the profile measured: " + ", ".join(past))
    return out


def predict_analytic(spec: ModelSpec, gpu: str, *, dtype: str = "bfloat16", calibrate: Optional[Profile] = None,
                     concurrency: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
                     prompt_len: int = 512, output_len: int = 512, micro_batches: Sequence[int] = (1, 2, 4, 8, 16),
                     seq_len: int = 2048, layout: Layout = Layout(), engine: EngineOptions = EngineOptions()) -> Profile:
    """A predicted profile of ``spec`` on ``gpu`` from the datasheet, with default or calibrated efficiencies.

    With a layout of several devices the generation points are one engine's (``layout.tp``
    devices) and the training points one device's micro-batch under FSDP over ``layout.gpus``;
    ``engine``: the generation engine's settings (its KV rule, caps and fixed costs)."""
    spec = spec.with_rope_scaling(engine.check().rope_scaling)
    _check_lists(concurrency, micro_batches, prompt_len, output_len, seq_len)
    quant_lines = checkpoint_lines(spec, dtype, dtype_bytes(dtype))
    if spec.quantization == "fp8":  # engines run a quantized checkpoint as it is stored
        dtype = "fp8"
    ds = lookup(gpu)  # the defaults are its device family's (calibration.efficiencies_for)
    eff = calibration_from(calibrate) if calibrate is not None else \
        efficiencies_for(ds.device, engine.engine) if ds is not None else DEFAULT_EFFICIENCIES
    model, hw, peaks = analytic_model(spec, gpu, dtype, eff, layout, engine, prompt_len, output_len)
    bpp = dtype_bytes(dtype)
    model.train.mem_per_sample_bytes = rf.activation_bytes_per_sequence(spec, seq_len, bpp,  # TP: sequence parallel
                                                                        layout.activation_checkpointing) / layout.train_tp
    model.train.seq_len = seq_len
    mode = rf.checkpointing_mode(layout.activation_checkpointing)
    act = {"full": "each block's input plus one block's activations per sequence (full checkpointing)",
           "selective": "34*S*h bytes per layer and sequence (selective recompute of the attention core, Korthikanti "
                        "et al. 2022 section 4.2: the attention scores are not kept, as flash attention never keeps them)",
           "none": "34*S*h bytes per layer and sequence (Korthikanti et al. 2022, flash attention)"}[mode]
    kv_seqs = model.kv_sequences(prompt_len, output_len)
    if calibrate is None:  # the published spread is of the stated defaults, not of a calibration
        family = device_family(hw.device_name)
        model.gen_spread = published_spread("generation", family, layout.tp)
        model.train_spread = published_spread("training", family, 1)
    mfu, mfu_source = train_mfu(hw.device_name, dtype, eff, model.costs)
    exposed, exposed_source = fsdp_exposed(layout.nodes, eff)
    assumptions = quant_lines + eff.describe() + engine_lines(model.engine, model.kv_cache_tokens, kv_seqs, prompt_len,
                                                              output_len, layout.tp) + [
        "generation: an engine runs min(concurrency, KV-cache sequences, max_num_seqs) at once and queues the rest",
        f"training FLOP/s: {mfu:.0%} of the {dtype} peak; {mfu_source}",
        f"training activation checkpointing: {mode} (" + {
            "none": "3x forward FLOPs", "full": "4x forward FLOPs: each block's forward recomputed",
            "selective": "3x forward FLOPs + the attention core's forward again"}[mode] + ")",
        f"training memory per device: {ADAM_BYTES_PER_PARAM} bytes/parameter (mixed-precision Adam)"
        + (f" sharded over {layout.gpus} devices (FSDP)" if layout.gpus > 1 else "") + f" plus {act} plus fp32 logits",
    ]
    assumptions += _interval_lines(model)
    if layout.gpus > 1:
        assumptions.append(f"FSDP traffic exposed (not under compute): {exposed:.0%}, {exposed_source}")
        assumptions.append(f"layout: {layout.gpus} GPUs on {layout.nodes} node(s); generation in {layout.engines} "
                           f"engine(s) of TP {layout.tp}; training with FSDP over {layout.gpus} GPUs"
                           + (f" x TP {layout.train_tp} (2D: a micro-batch per TP group, its activations all-reduced "
                              "twice a layer each pass; sharded GEMMs at full efficiency, not modelled)"
                              if layout.train_tp > 1 else "") + f"; links: {model.comm.source}")
    s = rf.mean_context(prompt_len, output_len)
    knee, knee_note = knee_statement(model, s)
    e2e, e2e_note = generation_knee_statement(model, prompt_len, output_len)

    gen_fit = GenerationFit(
        target="decode_step_s", form="max", params=[
            ParamEstimate(name="t0_s", value=model.decode.t0_s, unit="s", note="assumed"),
            ParamEstimate(name="bw_bytes_per_s", value=model.decode.bw_bytes_per_s, unit="B/s",
                          note=f"{eff.decode_bw:.0%} of the datasheet"),
            ParamEstimate(name="phi_flops_per_s", value=model.decode.phi_flops_per_s, unit="FLOP/s",
                          note=f"{model.decode.phi_flops_per_s / peaks.datasheet_flops_per_s:.0%} of the datasheet"),
        ], context_len=s, knee_concurrency=knee, knee_note=knee_note, generation_knee_concurrency=e2e,
        generation_knee_note=e2e_note, n_points=0, points=[])
    fit = FitResult(method="analytic" if calibrate is None else "calibrated", created_at=now_iso(), model=model,
                    peaks=peaks, generation=gen_fit, assumptions=assumptions)
    gen, train = _predicted_points(model, concurrency, prompt_len, output_len, micro_batches, seq_len)
    settings = SweepSettings(dtype=dtype, device="cuda", gen_backend="predicted", train_backend="predicted",
                             prompt_len=prompt_len, output_len=output_len, seq_len=seq_len)
    st = model.engine
    info = EngineInfo(name=st.name, kv_cache_tokens=model.kv_cache_tokens, max_concurrency=kv_seqs,
                      max_num_seqs=st.max_num_seqs, engine_args=st.model_dump(exclude={"name", "kv_rule"}))
    out = Profile(kind="predicted", model=spec, hardware=hw, environment=_environment(), settings=settings,
                  engine=info, generation=gen, training=train,
                  notes=[f"analytic prediction for {hw.device_name}", *assumptions])
    running = [p.model_copy(update={"concurrency": model.admitted(p.concurrency, prompt_len, output_len)})
               for p in gen]  # utilisation of the batch the engine runs
    fit.utilisation = utilisation(out.model_copy(update={"generation": running}), model.costs, peaks)
    out.fit = fit.model_dump(mode="json")
    return out


# ---------------------------------------------------------------- tables for the CLI and the report


def generation_table(model: ThroughputModel, concurrency: Sequence[int], prompt_len: int, output_len: int) -> pd.DataFrame:
    """Per concurrency: the sequences the engine runs at once, decode step, a served run's TPOT (the other requests'
    prefills included, rf.served_tpot_s), decode and end-to-end tokens/s, and the bound: "memory" or "compute" (the
    roofline term that dominates the step), or the admission cap that holds the rest ("admission: KV cache", ...)."""
    s = rf.mean_context(prompt_len, output_len)
    rows = []
    for c in concurrency:
        a = model.admitted(c, prompt_len, output_len)
        held = model.admission_bound(c, prompt_len, output_len)
        if a < 1:
            rows.append({"concurrency": c, "running": 0, "decode_step_ms": float("nan"), "decode_tokens_per_s": 0.0,
                         "tpot_ms": float("nan"), "tokens_per_s": 0.0, "prefill_ms": float("nan"), "bound": held})
            continue
        td = model.decode_step_s(a, s)
        mem, comp = model.decode_terms_s(a, s)
        band = model.served_tokens_per_s_interval(c, prompt_len, output_len, model.gen_spread.level) \
            if model.gen_spread else (float("nan"), float("nan"))
        rows.append({"concurrency": c, "running": a, "decode_step_ms": td * 1e3, "decode_tokens_per_s": a / td,
                     "tpot_ms": model.served_tpot_s(c, prompt_len, output_len) * 1e3,
                     "tokens_per_s": model.served_tokens_per_s(c, prompt_len, output_len),
                     "tokens_per_s_lo": band[0], "tokens_per_s_hi": band[1],
                     "prefill_ms": model.prefill_s(a, prompt_len) * 1e3,
                     "bound": held or ("memory" if mem >= comp else "compute")})
    return pd.DataFrame(rows)


def training_table(model: ThroughputModel, micro_batches: Sequence[int], seq_len: int) -> pd.DataFrame:
    t = model.require("train")
    max_b = model.max_micro_batch()
    rows = []
    for b in micro_batches:
        mem = model.memory_bytes(b)
        band = model.train_tokens_per_s_interval(b, seq_len, model.train_spread.level) \
            if model.train_spread else (float("nan"), float("nan"))
        rows.append({"micro_batch": b, "step_ms": (model.train_step_s(b, seq_len) + t.optimizer_step_s) * 1e3,
                     "tokens_per_s": model.train_tokens_per_s(b, seq_len),
                     "tokens_per_s_lo": band[0], "tokens_per_s_hi": band[1],
                     "peak_mem_gib": None if mem is None else mem / 2**30,
                     "fits": "?" if max_b is None else "yes" if b <= max_b else "no"})
    return pd.DataFrame(rows)
