"""The throughput model of one model on one device: the rates (fitted, predicted or calibrated)
and their evaluation through the roofline module.

``fit`` estimates the parameters, ``predict`` fills them from a datasheet, ``decide`` and
``report`` evaluate them; every cost comes from :mod:`throughputlab.roofline`. Methods take
floats or numpy arrays. No torch, no scipy.
"""

from __future__ import annotations

import math
from typing import Literal, Optional, Union

from throughputlab import roofline as rf
from throughputlab.errors import UserError
from throughputlab.records.base import Record
from throughputlab.records.collectives import CollectiveBench, CollectiveFit, Op
from throughputlab.roofline import Costs, EngineSettings
from throughputlab.roofline.rl import megatron_microbatch_s, megatron_tp_comm_s
from throughputlab.spread import LEVEL, Spread


class DecodeParams(Record):
    t0_s: float
    bw_bytes_per_s: float
    phi_flops_per_s: float
    smooth_p: Optional[float] = None  # None: the hard max form
    t_seq_s: float = 0.0  # per-sequence cost per step, fitted only with an overhead probe
    # the per-kernel form: the attention's own bandwidth (KV reads), fitted from a context axis;
    # None: today's form, one roofline over the summed bytes and FLOPs
    bw_attn_bytes_per_s: Optional[float] = None
    # the most cached tokens (concurrency x context) one measured decode step read; past it the
    # attention term is extrapolated. None: not recorded (a prediction, or a fit stored before it)
    measured_cached_tokens: Optional[float] = None
    # the KV reads' ceiling: the memory's measured read bandwidth (the probe's matrix-vector figure,
    # or the datasheet's); None: no ceiling (a fit without micro-benchmarks, or stored before it)
    bw_mem_bytes_per_s: Optional[float] = None


class PrefillParams(Record):
    t0_s: float
    bw_bytes_per_s: float
    phi_flops_per_s: float
    smooth_p: Optional[float] = None  # only when the decode's parameters stand in (fitted end to end)


class TrainParams(Record):
    t0_s: float
    phi_flops_per_s: float
    optimizer_step_s: float = 0.0  # per mini-batch (AdamW update)
    mem0_bytes: Optional[float] = None  # M(b) = M0 + b*m
    mem_per_sample_bytes: Optional[float] = None
    device_memory_bytes: Optional[float] = None
    smallest_oom_micro_batch: Optional[int] = None  # measured: the memory line is capped below it
    seq_len: Optional[int] = None  # the sequence length of the memory line's per-sample slope
    # the causal attention's own FLOP rate, fitted from several sequence lengths; None: PHI for all FLOPs
    phi_attn_flops_per_s: Optional[float] = None
    # share of the per-sample slope at seq_len growing as S^2 (fitted from several lengths; 0: linear in S)
    mem_sq_share: float = 0.0
    smallest_oom_by_seq_len: dict[int, int] = {}  # several lengths: the smallest OOM micro-batch at each


class CommParams(Record):
    """Collective rates between the devices of a layout, nccl-tests' bus bandwidth and a latency:
    within an engine (tensor parallel) and across the training devices (FSDP)."""

    tp_busbw_bytes_per_s: float
    tp_alpha_s: float
    fsdp_busbw_bytes_per_s: float
    fsdp_alpha_s: float
    fsdp_hidden_share: float = 0.0  # share of FSDP's collectives hidden under compute
    source: str = ""
    # small tensor-parallel all-reduces (custom all-reduce): their own latency and bus bandwidth; None: one line
    tp_small_alpha_s: Optional[float] = None
    tp_small_busbw_bytes_per_s: Optional[float] = None

    @classmethod
    def from_collectives(cls, bench: CollectiveBench, source: str = "") -> CommParams:
        """The rates of a collective benchmark's fits: tensor parallel from the all-reduce; FSDP from
        all-gather and reduce-scatter, their busbw combined as FSDP's micro-step uses them (two
        all-gathers per reduce-scatter, a weighted harmonic mean), the all-gather alone where
        reduce-scatter has no fit. Raises ValueError without fits."""

        def fitted(name: Op) -> Optional[CollectiveFit]:
            o = bench.op(name)
            return o.fit if o and o.fit and o.fit.busbw_fit_bytes_per_s else None

        ar, ag, rs = fitted("all_reduce"), fitted("all_gather"), fitted("reduce_scatter")
        if ar is None or ag is None:
            raise ValueError("the collective rates need fitted all-reduce and all-gather bandwidths")
        if rs is not None:
            fsdp_bw = 3 / (2 / ag.busbw_fit_bytes_per_s + 1 / rs.busbw_fit_bytes_per_s)
            fsdp_alpha = (2 * ag.alpha_s + rs.alpha_s) / 3
        else:
            fsdp_bw, fsdp_alpha = ag.busbw_fit_bytes_per_s, ag.alpha_s
        src = source or f"collectives: {bench.backend} on {bench.world_size} {bench.device} ranks"
        return cls(tp_busbw_bytes_per_s=ar.busbw_fit_bytes_per_s, tp_alpha_s=ar.alpha_s,
                   fsdp_busbw_bytes_per_s=fsdp_bw, fsdp_alpha_s=fsdp_alpha, source=src)


Part = Literal["decode", "prefill", "train"]
_PART_NAMES = {"decode": "decode", "prefill": "prefill", "train": "training"}


class ThroughputModel(Record):
    """Everything needed to evaluate step times for one model on one device."""

    source: Literal["fit", "analytic", "calibrated"]
    costs: Costs
    decode: Optional[DecodeParams] = None
    prefill: Optional[PrefillParams] = None
    train: Optional[TrainParams] = None
    kv_cache_tokens: Optional[int] = None  # engine KV capacity, when known
    max_num_seqs: Optional[int] = None
    gen_overhead_s: float = 0.0  # per generate call, outside prefill and decode steps (setup, sampling glue)
    # the layout: generation engines of `tp` devices (rates per device, costs sharded, TP all-reduces);
    # training with FSDP over `train_devices` ranks (micro-batches per device). A model fitted to an
    # engine as a whole keeps tp = 1: its rates are the engine's. train_tp > 1: FSDP x TP (2D), each
    # micro-batch on a TP group of train_tp devices, FSDP over train_devices / train_tp groups.
    tp: int = 1
    train_devices: int = 1
    train_tp: int = 1
    nodes: int = 1
    activation_checkpointing: Union[bool, Literal["selective"]] = False  # True: full; roofline.recompute_passes
    comm: Optional[CommParams] = None
    engine: Optional[EngineSettings] = None  # a prediction's engine settings (KV rule, caps, chunked prefill)
    # how far predictions of this kind have been from measurements (throughputlab.spread): None, no interval
    gen_spread: Optional[Spread] = None
    train_spread: Optional[Spread] = None

    @property
    def device_costs(self) -> Costs:
        """One device's share of the model constants in a generation engine."""
        return rf.tp_shard(self.costs, self.tp)

    def _tp_comm(self, tokens):
        if self.tp <= 1 or self.comm is None:
            return 0.0
        c = self.comm
        return rf.tp_comm_s(self.costs, tokens, self.tp, c.tp_busbw_bytes_per_s, c.tp_alpha_s, c.tp_small_alpha_s,
                            c.tp_small_busbw_bytes_per_s)

    def _elementwise(self, tokens):
        """The decode tokens' small kernels beyond their floor (rf.decode_elementwise_s). A fitted model's measured
        steps hold them already; a calibrated one's rates hold one device's, so it adds what a TP group's ranks
        move beyond a 1/TP share of them (the hidden-width passes every rank repeats)."""
        if self.source == "fit" or self.decode is None:
            return 0.0
        bw = self.decode.bw_bytes_per_s
        out = rf.decode_elementwise_s(self.costs, tokens, self.tp, bw)
        if self.source == "calibrated":
            out = out - rf.decode_elementwise_s(self.costs, tokens, 1, bw) / max(self.tp, 1)
        return out

    def _fsdp_comm(self, backward: bool = True) -> float:
        if self.train_devices <= 1 or self.comm is None:
            return 0.0
        c = self.comm
        tp = max(self.train_tp, 1)  # FSDP x TP: each rank gathers its TP shard over the data-parallel ranks
        return rf.fsdp_comm_s(rf.tp_shard(self.costs, tp), self.train_devices // tp, c.fsdp_busbw_bytes_per_s,
                              c.fsdp_alpha_s, backward=backward)

    def _train_tp(self, one_gpu_s, tokens, backward: bool):
        """A micro-batch on a TP group: the compute one device would take split over it, plus the TP
        collectives of its forward (and backward, and recomputed forward) (roofline.rl)."""
        if self.train_tp <= 1 or self.comm is None:
            return one_gpu_s
        c = self.comm
        coll = megatron_tp_comm_s(self.costs, tokens, self.train_tp, c.tp_busbw_bytes_per_s, c.tp_alpha_s,
                                     backward=backward, recompute=self.activation_checkpointing if backward else False)
        return megatron_microbatch_s(one_gpu_s, self.train_tp, 1, 0.0, coll)

    def require(self, part: Part):
        """The parameters of ``part``, or a UserError saying the model lacks it."""
        x = getattr(self, part)
        if x is None:
            what = _PART_NAMES[part]
            raise UserError(f"the throughput model has no {what} part: measure or predict {what} first")
        return x

    def prefill_rates(self) -> PrefillParams:
        """The prefill's parameters; without a prefill fit, the decode's (same physics and form: an
        end-to-end fit evaluates its prefill so)."""
        if self.prefill is not None:
            return self.prefill
        d = self.require("decode")
        return PrefillParams(t0_s=d.t0_s, bw_bytes_per_s=d.bw_bytes_per_s, phi_flops_per_s=d.phi_flops_per_s,
                             smooth_p=d.smooth_p)

    # ---- generation
    @property
    def eager_host_s(self) -> float:
        """The host's launch time of one eager step (rf.eager_host_s); 0 with CUDA graphs and for a fitted
        engine, whose measured steps hold however its launches showed."""
        if self.source == "fit" or self.engine is None:
            return 0.0
        return rf.eager_host_s(self.costs.num_layers, self.engine.name, self.engine.enforce_eager) * self.engine.host_factor

    def _host_s(self, seqs=0.0):
        """An eager step's host time with its scheduling (rf.eager_host_step_s: V0's and sync scheduling's host
        work, which the step's t0 and t_seq hold, before the launches); 0 with CUDA graphs."""
        e, d = self.engine, self.decode
        v0 = rf.engine_version_step_s(e.name, e.version, e.scheduler_steps) * e.host_factor if e is not None else 0.0
        return rf.eager_host_step_s(self.eager_host_s, v0, d.t_seq_s if d is not None else 0.0, seqs)

    def decode_step_s(self, c, s):
        d = self.require("decode")
        return rf.eager_step_s(rf.decode_step_s(c, s, self.device_costs, d.t0_s, d.bw_bytes_per_s, d.phi_flops_per_s,
                                                d.smooth_p, d.t_seq_s, d.bw_attn_bytes_per_s, d.bw_mem_bytes_per_s)
                               + self._tp_comm(c) + self._elementwise(c), self._host_s(c))

    def attention_share(self, c, s):
        """The attention's share of the decode step: its own kernel's time (per-kernel form), or in
        today's form the time its KV reads (or FLOPs) take at the step's rates."""
        d = self.require("decode")
        bw = rf.kv_read_rate(d.bw_bytes_per_s, d.bw_attn_bytes_per_s, d.bw_mem_bytes_per_s)
        return rf.attention_s(self.device_costs, c * s, bw, d.phi_flops_per_s) / self.decode_step_s(c, s)

    def decode_tokens_per_s(self, c, s):
        return c / self.decode_step_s(c, s)

    def decode_terms_s(self, c, s) -> tuple:
        """The memory and compute times of a decode step, before they are combined."""
        d = self.require("decode")
        k = self.device_costs
        return (rf.decode_mem_s(k, c, s, d.bw_bytes_per_s, d.bw_mem_bytes_per_s),
                rf.decode_flops(k, c, s) / d.phi_flops_per_s)

    def decode_ceiling_tokens_per_s(self, s):
        d = self.require("decode")
        return rf.decode_ceiling_tokens_per_s(self.device_costs, s, d.phi_flops_per_s, d.t_seq_s)

    def prefill_s(self, c, prompt_len):
        """Prefill of c prompts; with an engine's chunked-prefill budget, in rf.prefill_chunks steps."""
        pp = self.prefill_rates()
        n = rf.prefill_chunks(c * prompt_len, self.engine.max_num_batched_tokens if self.engine else None)
        q1 = c * prompt_len / n
        return n * rf.eager_step_s(rf.prefill_tokens_s(q1, q1 * prompt_len, self.device_costs, pp.t0_s,
                                                       pp.bw_bytes_per_s, pp.phi_flops_per_s, pp.smooth_p)
                                   + self._tp_comm(q1), self._host_s())

    def prefill_tokens_s(self, q1, q2):
        pp = self.prefill_rates()
        return rf.eager_step_s(rf.prefill_tokens_s(q1, q2, self.device_costs, pp.t0_s, pp.bw_bytes_per_s,
                                                   pp.phi_flops_per_s, pp.smooth_p) + self._tp_comm(q1),
                               self._host_s())

    def mixed_step_s(self, dec, ctx, q1, q2):
        """A continuous-batching step with decodes and prefill tokens (see roofline.mixed_step_s)."""
        d = self.require("decode")
        step = rf.mixed_step_s(self.device_costs, dec, ctx, q1, q2, d.t0_s, d.bw_bytes_per_s, d.phi_flops_per_s,
                               self.prefill_rates().phi_flops_per_s, d.smooth_p, d.t_seq_s,
                               d.bw_attn_bytes_per_s, d.bw_mem_bytes_per_s) + self._tp_comm(dec + q1) \
            + self._elementwise(dec)
        return rf.eager_step_s(step, self._host_s(dec))

    def generation_tokens_per_s(self, c, prompt_len, output_len):
        """Static batch: prefill, then output_len - 1 decode steps at mean context (as the hf backend measures)."""
        total = rf.static_batch_s(self.prefill_s(c, prompt_len),
                                  self.decode_step_s(c, rf.mean_context(prompt_len, output_len)), output_len,
                                  self.gen_overhead_s)
        return c * output_len / total

    # ---- admission (an engine runs at most min(concurrency, KV-cache sequences, max_num_seqs))
    def kv_sequences(self, prompt_len: int, output_len: int) -> Optional[int]:
        """Requests of prompt + output tokens the engine runs at once from its KV cache, by its admission rule
        (rf.kv_sequences: optimistic for vLLM and SGLang); None: capacity unknown."""
        block = self.engine.block_tokens if self.engine else rf.BLOCK_TOKENS["vllm"]
        name = self.engine.name if self.engine else "vllm"
        return rf.kv_sequences(self.kv_cache_tokens, prompt_len, output_len, block,
                               optimistic=name in rf.OPTIMISTIC_ADMISSION_ENGINES)

    def admitted(self, c: int, prompt_len: int, output_len: int) -> int:
        return rf.admitted(c, self.kv_sequences(prompt_len, output_len), self.max_num_seqs)

    def admission_bound(self, c: int, prompt_len: int, output_len: int) -> Optional[str]:
        return rf.admission_bound(c, self.kv_sequences(prompt_len, output_len), self.max_num_seqs)

    def served_tokens_per_s(self, c: int, prompt_len: int, output_len: int) -> float:
        """Output tokens/s of c requests on the engine: the admitted ones run as a static batch, the rest
        queue, so past the admitted concurrency tokens/s stays flat."""
        a = self.admitted(c, prompt_len, output_len)
        return self.generation_tokens_per_s(a, prompt_len, output_len) if a > 0 else 0.0

    @property
    def separate_prefill(self) -> bool:
        """Whether the engine runs prefill as steps of their own while the decodes wait (SGLang's default:
        rf.SEPARATE_PREFILL_ENGINES) instead of mixing it into decode steps; a fitted engine mixes."""
        e = self.engine
        return e is not None and self.source != "fit" and e.name in rf.SEPARATE_PREFILL_ENGINES

    def served_tpot_s(self, c: int, prompt_len: int, output_len: int) -> float:
        """Mean time between a request's tokens with c requests served at once (rf.served_tpot_s): the admitted
        requests' decode step, plus the other running slots' next prompts, each in its chunks of the engine's
        token budget, as steps of their own where the engine keeps prefill apart (``separate_prefill``), else as
        what they add to the decode steps they ride in; infinite where the engine admits no request."""
        a = self.admitted(c, prompt_len, output_len)
        if a < 1:
            return math.inf
        s = float(rf.mean_context(prompt_len, output_len))
        dec = self.decode_step_s(a, s)
        e = self.engine
        n = float(rf.prefill_chunks(prompt_len, e.max_num_batched_tokens if e else None))
        q1 = prompt_len / n
        if self.separate_prefill:
            per_prompt = n * self.prefill_tokens_s(q1, q1 * prompt_len)
        else:
            per_prompt = n * max(self.mixed_step_s(a, a * s, q1, q1 * prompt_len) - dec, 0.0)
        return rf.served_tpot_s(dec, per_prompt, a, output_len)

    # ---- intervals (throughputlab.spread): (lo, hi) at ``level``, None where the model has no spread
    def _interval(self, spread: Optional[Spread], value: float, level: float, time: bool = False):
        if spread is None:
            return None
        return spread.time(value, level) if time else spread.rate(value, level)

    def served_tokens_per_s_interval(self, c, prompt_len, output_len, level=LEVEL):
        return self._interval(self.gen_spread, self.served_tokens_per_s(c, prompt_len, output_len), level)

    def generation_tokens_per_s_interval(self, c, prompt_len, output_len, level=LEVEL):
        return self._interval(self.gen_spread, self.generation_tokens_per_s(c, prompt_len, output_len), level)

    def decode_step_s_interval(self, c, s, level=LEVEL):
        return self._interval(self.gen_spread, self.decode_step_s(c, s), level, time=True)

    def served_tpot_s_interval(self, c, prompt_len, output_len, level=LEVEL):
        return self._interval(self.gen_spread, self.served_tpot_s(c, prompt_len, output_len), level, time=True)

    def train_tokens_per_s_interval(self, b, seq_len, level=LEVEL):
        return self._interval(self.train_spread, self.train_tokens_per_s(b, seq_len), level)

    def knee(self, s: float) -> Optional[float]:
        d = self.require("decode")
        return rf.knee(self.device_costs, s, d.bw_bytes_per_s, d.phi_flops_per_s, d.bw_mem_bytes_per_s)

    def short_context_knee(self) -> Optional[float]:
        d = self.require("decode")
        return rf.short_context_knee(self.device_costs, d.bw_bytes_per_s, d.phi_flops_per_s)

    def generation_knee(self, prompt_len: float, output_len: int) -> Optional[float]:
        d = self.require("decode")
        return rf.generation_knee(self.device_costs, prompt_len, output_len, d.bw_bytes_per_s, d.phi_flops_per_s,
                                  self.prefill_rates().phi_flops_per_s, d.bw_mem_bytes_per_s)

    # ---- training
    def train_step_s(self, b, seq_len):
        """One micro-step of b sequences on each training device (FSDP: plus the collectives not
        hidden under compute; checkpointing: the forward again)."""
        t = self.require("train")
        compute = rf.train_step_s(b, seq_len, self.costs, t.t0_s, t.phi_flops_per_s, self.activation_checkpointing,
                                  t.phi_attn_flops_per_s)
        compute = self._train_tp(compute, b * seq_len, backward=True)
        if self.train_devices <= 1 or self.comm is None:
            return compute
        return rf.exposed_s(compute, self._fsdp_comm(), self.comm.fsdp_hidden_share)

    def forward_s(self, b, seq_len):
        t = self.require("train")
        compute = rf.forward_pass_s(b, seq_len, self.costs, t.t0_s, t.phi_flops_per_s, t.phi_attn_flops_per_s)
        compute = self._train_tp(compute, b * seq_len, backward=False)
        if self.train_devices <= 1 or self.comm is None:
            return compute
        return rf.exposed_s(compute, self._fsdp_comm(backward=False), self.comm.fsdp_hidden_share)

    def train_tokens_per_s(self, b, seq_len):
        """Tokens/s per device of one micro-step followed by its optimizer step (what a training point
        measures); under FSDP x TP the micro-batch is the TP group's, shared by its train_tp devices."""
        t = self.require("train")
        return b * seq_len / (self.train_step_s(b, seq_len) + t.optimizer_step_s) / max(self.train_tp, 1)

    def activation_bytes(self, seq_len=None) -> Optional[float]:
        """The memory line's per-sequence slope m at ``seq_len`` (default: where it was measured)."""
        t = self.train
        if t is None or not t.mem_per_sample_bytes or seq_len is None or not t.seq_len or seq_len == t.seq_len:
            return None if t is None else t.mem_per_sample_bytes
        return rf.activations_at(t.mem_per_sample_bytes, seq_len, t.seq_len, t.mem_sq_share)

    def memory_bytes(self, b, seq_len=None) -> Optional[float]:
        """Peak training memory at micro-batch b (of ``seq_len`` tokens) from the memory line; None without one."""
        t = self.train
        if t is None or t.mem0_bytes is None or not t.mem_per_sample_bytes:
            return None
        return rf.memory_line(b, t.mem0_bytes, self.activation_bytes(seq_len))

    def max_micro_batch(self, seq_len=None) -> Optional[int]:
        """Largest micro-batch (of ``seq_len`` tokens) whose memory line fits the device, capped below
        an OOM measured at that length or a shorter one."""
        t = self.train
        if t is None:
            return None
        oom = t.smallest_oom_micro_batch if seq_len is None or not t.seq_len or seq_len >= t.seq_len else None
        if seq_len is not None and t.smallest_oom_by_seq_len:  # an OOM holds at longer lengths too
            oom = min((v for s, v in t.smallest_oom_by_seq_len.items() if s <= seq_len), default=None)
        return rf.max_micro_batch(t.mem0_bytes, self.activation_bytes(seq_len), t.device_memory_bytes, oom)
