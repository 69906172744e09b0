"""The engine of an analytic prediction: `predict`'s engine flags checked at the boundary, each
engine's defaults with their sources, the layout limits of a part, and the lines that say what the
engine's KV rule gave. The physics (KV rules, admission, fixed costs) is in roofline.engine."""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict

from throughputlab import roofline as rf
from throughputlab.errors import UserError
from throughputlab.models.spec import ModelSpec, parse_rope_scaling
from throughputlab.records.machine import DatasheetPeak

ENGINES = ("vllm", "sglang", "trtllm")
# Requests an engine runs at once when not told (0: SGLang sizes it from its KV pool, size_kv); vLLM's depends on the
# device and version (resolve).
DEFAULT_MAX_NUM_SEQS = {"sglang": 0, "trtllm": 2048}
KV_DTYPES = ("auto", "fp8")
GIB = rf.GIB

# Devices per node: SXM and OAM parts sit 8 to a baseboard (HGX/DGX A100, H100, H200, B200; AMD's
# MI300X/MI325X platforms), DGX-2 held 16 V100s, a GB200 NVL72 compute tray 4 GPUs; PCIe cards go up to
# 10 in the largest common chassis.
MAX_GPUS_PER_NODE = {"GB200": 4, "V100": 16, "H100 PCIe": 10, "H100 NVL": 10, "H800 PCIe": 10, "A100 80GB PCIe": 10,
                     "A800 80GB PCIe": 10, "L40S": 10, "L4": 10, "A10": 10, "RTX 4090": 10, "RTX 3090": 10}
SXM_GPUS_PER_NODE = 8

# Defaults and their sources, per engine.
DEFAULT_SOURCES = {
    "vllm": "vLLM defaults: gpu_memory_utilization 0.9 (vllm/config/cache.py); max_num_seqs and "
            "max_num_batched_tokens from EngineArgs.get_batch_defaults (vllm/engine/arg_utils.py), OpenAI server: "
            "1024 and 8192 on GPUs of 70 GiB or more that are not A100s, else 256 and 2048",
    "sglang": "SGLang defaults (sglang/srt/server_args.py): mem_fraction_static 0.88/0.87/0.85/0.81/0.79 at TP "
              "1/2/4/8/16, chunked_prefill_size 8192 (2048 under 25 GB); max_running_requests from the KV pool "
              "(model_runner.init_memory_pool)",
    "trtllm": "TensorRT-LLM defaults (tensorrt_llm/llmapi/llm_args.py): kv_cache_free_gpu_memory_fraction 0.9, "
              "max_batch_size 2048, max_num_tokens 8192",
}
KV_RULES = {
    "vllm": "vLLM: gpu_memory_utilization x memory - weights - profile-run activations at max_num_batched_tokens - "
            "non-torch memory - CUDA graphs (vllm/v1/worker/gpu_worker.py determine_available_memory)",
    "sglang": "SGLang: mem_fraction_static x memory - weights (sglang/srt/model_executor/model_runner.py "
              "profile_max_num_token)",
    "trtllm": "TensorRT-LLM: kv_cache_free_gpu_memory_fraction x (memory - weights - activations at max_num_tokens) "
              "(KvCacheConfig.free_gpu_memory_fraction)",
}


class EngineOptions(BaseModel):
    """The engine flags as the user gave them (None: the engine's default)."""

    model_config = ConfigDict(extra="forbid")
    engine: str = "vllm"
    gpu_memory_utilization: Optional[float] = None
    max_num_seqs: Optional[int] = None
    max_model_len: Optional[int] = None
    kv_cache_gib: Optional[float] = None
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    engine_version: Optional[str] = None  # vLLM before 0.8 runs its V0 engine: more host time a decode step
    async_scheduling: Optional[bool] = None  # vLLM: None = the version's default (off before 0.14)
    num_scheduler_steps: Optional[int] = None  # vLLM 0.6-0.7 (V0) multi-step scheduling: decode steps per host round
    max_num_batched_tokens: Optional[int] = None
    rope_scaling: Optional[str] = None  # TYPE:FACTOR, as vLLM's --hf-overrides '{"rope_scaling": ...}' sets it
    in_process_logprobs: str = "off"  # off, ids, text: per-token log-probs an in-process engine returns (RL rollouts)
    distributed_executor_backend: Optional[str] = None  # vLLM's executor: "ray" defers async scheduling to 0.21

    def check(self) -> "EngineOptions":
        if self.engine not in ENGINES:
            raise UserError(f"--engine {self.engine}: use one of {', '.join(ENGINES)}")
        if self.kv_cache_dtype not in KV_DTYPES:
            raise UserError(f"--kv-cache-dtype {self.kv_cache_dtype}: use auto (the activations' 16 bits) or fp8")
        if self.engine_version is not None:
            try:
                if len(rf.version_tuple(self.engine_version)) < 2:
                    raise ValueError(self.engine_version)
            except ValueError:
                raise UserError(f"--engine-version {self.engine_version}: give it as MAJOR.MINOR[.PATCH], e.g. "
                                "0.6.3 (a 0.8-0.10 vLLM that ran its V0 engine: 0.8.4+v0)") from None
            if rf.is_v0(self.engine, self.engine_version) and rf.version_tuple(self.engine_version)[:2] >= (0, 11):
                raise UserError(f"--engine-version {self.engine_version}: vLLM has no V0 engine from 0.11 on; drop "
                                "the +v0 or give the version that ran it")
        u = self.gpu_memory_utilization
        if u is not None and not 0 < u <= 1:
            raise UserError(f"--gpu-memory-utilization must be a fraction in (0, 1], got {u} (vLLM's default is 0.9)")
        for flag, v in (("--max-num-seqs", self.max_num_seqs), ("--max-model-len", self.max_model_len),
                        ("--max-num-batched-tokens", self.max_num_batched_tokens)):
            if v is not None and v < 1:
                raise UserError(f"{flag} must be a positive integer, got {v}")
        if self.kv_cache_gib is not None and not self.kv_cache_gib > 0:
            raise UserError(f"--kv-cache-gib must be a positive size in GiB (the KV cache memory per GPU the engine "
                            f"logs), got {self.kv_cache_gib}")
        if self.rope_scaling is not None:
            try:
                parse_rope_scaling(self.rope_scaling)
            except ValueError as e:
                raise UserError(str(e)) from None
        if self.in_process_logprobs not in rf.LOGPROBS_HOST_RATIO:
            raise UserError(f"--in-process-logprobs {self.in_process_logprobs}: use off, ids (each sampled token's "
                            "log-prob, no text: veRL) or text (with the text: NeMo-RL)")
        ex = self.distributed_executor_backend
        if ex is not None and (ex not in rf.EXECUTORS or self.engine != "vllm"):
            raise UserError(f"--distributed-executor-backend {ex}: " + (
                f"use one of {', '.join(rf.EXECUTORS)} (vLLM's own names)" if ex not in rf.EXECUTORS else
                f"it is vLLM's setting; drop it for --engine {self.engine}"))
        n = self.num_scheduler_steps
        if n is not None:
            if n < 1:
                raise UserError(f"--num-scheduler-steps must be a positive integer, got {n}")
            if n > 1 and not rf.is_v0(self.engine, self.engine_version):
                raise UserError(f"--num-scheduler-steps {n}: multi-step scheduling is vLLM's V0 engine's (0.6 to 0.7); "
                                "give it with --engine vllm --engine-version 0.6.x, or drop it")
        seqs, tokens = self.max_num_seqs, self.max_num_batched_tokens
        if self.engine == "vllm" and seqs is not None and tokens is not None and tokens < seqs:
            raise UserError(f"--max-num-batched-tokens {tokens} is below --max-num-seqs {seqs}: vLLM needs a token "
                            "per running sequence each step; raise it or lower --max-num-seqs")
        return self

    @property
    def given(self) -> bool:
        return self != EngineOptions()


def check_parts(spec: ModelSpec, ds: DatasheetPeak, gpus: int, nodes: int, tp: int, train_tp: int = 1) -> None:
    """TP sizes (the engines' and training's) the attention heads allow, and no more devices per node than the
    part has."""
    most = MAX_GPUS_PER_NODE.get(ds.device, SXM_GPUS_PER_NODE)
    if gpus // nodes > most:
        need = -(-gpus // most)
        raise UserError(f"--gpus {gpus} on {nodes} node(s): a {ds.device} node holds at most {most} GPUs; "
                        f"give --nodes {need} or more")
    for flag, size in (("--tp", tp), ("--train-tp", train_tp)):
        if spec.num_heads % size:
            ok = [t for t in (1, 2, 4, 8, 16) if spec.num_heads % t == 0]
            raise UserError(f"{flag} {size} does not divide {spec.name}'s {spec.num_heads} attention heads: use a TP "
                            f"size that does ({', '.join(map(str, ok))})")
        kv = spec.num_kv_heads
        if kv % size and size % kv:
            raise UserError(f"{flag} {size} neither divides nor is a multiple of {spec.name}'s {kv} KV heads: use a "
                            "TP size that is")


def resolve(opts: EngineOptions, spec: ModelSpec, ds: DatasheetPeak, tp: int, prompt_len: int,
            output_len: int) -> rf.EngineSettings:
    """The engine settings of a prediction: the flags given, each engine's defaults for the rest."""
    opts = opts.check()
    limit = spec.context_limit
    if opts.max_model_len is not None and limit and opts.max_model_len > limit:
        raise UserError(f"--max-model-len {opts.max_model_len} is above {spec.name}'s {spec.context_limit_name} "
                        f"({limit}): use at most {limit}, or give the engine's --rope-scaling (e.g. yarn:4)")
    max_len = opts.max_model_len or limit
    if opts.max_model_len is not None and prompt_len + output_len > opts.max_model_len:
        raise UserError(f"--prompt-len + --output-len ({prompt_len + output_len}) exceed --max-model-len "
                        f"{opts.max_model_len}: raise --max-model-len or shorten the request")
    if opts.max_model_len is None and limit and prompt_len + output_len > limit:
        raise UserError(f"--prompt-len + --output-len ({prompt_len + output_len}) exceed {spec.name}'s "
                        f"{spec.context_limit_name} ({limit}): shorten the request, or give the engine's --rope-scaling "
                        "(e.g. yarn:4)")
    mem = ds.memory_bytes or 0
    name = opts.engine
    if rf.is_v0(name, opts.engine_version):  # V0 (0.5-0.7): 256 sequences; chunked prefill, at 512 tokens, only past 32K of context (EngineArgs:
        # "Chunked prefill is enabled by default for models with max_model_len > 32K"); else a whole prompt a step,
        # SchedulerConfig's max(max_model_len, 2048), which its profiling run then holds in activations
        frac, seqs = 0.9, 256
        tokens = opts.max_num_batched_tokens or (512 if (max_len or 0) > 32768 else max(max_len or 2048, 2048))
        seqs = opts.max_num_seqs or min(seqs, tokens)
    elif name == "vllm":
        big = mem >= 70 * GIB and "A100" not in ds.device
        frac, seqs, tokens = 0.9, 1024 if big else 256, 8192 if big else 2048
        tokens = opts.max_num_batched_tokens or tokens
        seqs = opts.max_num_seqs or min(seqs, tokens)
    elif name == "sglang":
        frac = 0.88 if tp < 2 else 0.87 if tp < 4 else 0.85 if tp < 8 else 0.81 if tp < 16 else 0.79
        seqs = opts.max_num_seqs or DEFAULT_MAX_NUM_SEQS[name]
        tokens = opts.max_num_batched_tokens or (2048 if mem < 25e9 else 8192)
    else:
        frac, seqs, tokens = 0.9, opts.max_num_seqs or DEFAULT_MAX_NUM_SEQS[name], opts.max_num_batched_tokens or 8192
    if opts.gpu_memory_utilization is not None:
        frac = opts.gpu_memory_utilization
    return rf.EngineSettings(name=name, memory_fraction=frac, max_num_seqs=seqs, max_num_batched_tokens=tokens,
                             max_model_len=max_len, kv_cache_dtype=opts.kv_cache_dtype, kv_cache_gib=opts.kv_cache_gib,
                             enforce_eager=opts.enforce_eager, block_tokens=rf.BLOCK_TOKENS[name],
                             version=opts.engine_version, async_scheduling=opts.async_scheduling,
                             scheduler_steps=opts.num_scheduler_steps or 1, logprobs=opts.in_process_logprobs,
                             executor=opts.distributed_executor_backend)


def size_kv(settings: rf.EngineSettings, costs: rf.Costs, tp: int, device_bytes: Optional[float]) -> tuple[
        rf.EngineSettings, Optional[int]]:
    """The engine's KV cache in tokens by its rule (or the measured --kv-cache-gib), and the settings
    completed with it (SGLang's request cap follows the pool)."""
    shard = rf.tp_shard(costs, tp)
    if settings.kv_cache_gib is not None:
        kv_bytes, rule = settings.kv_cache_gib * GIB, f"measured, {settings.kv_cache_gib:g} GiB per GPU (--kv-cache-gib)"
        room = device_bytes - rf.all_weight_bytes(shard) if device_bytes else None
        if room is not None and kv_bytes > room:
            raise UserError(f"--kv-cache-gib {settings.kv_cache_gib:g}: more than a device holds besides its weights "
                            f"({device_bytes / GIB:.1f} GiB less {rf.all_weight_bytes(shard) / GIB:.1f} GiB = "
                            f"{max(room, 0) / GIB:.1f} GiB); give the KV cache size the engine's log reports")
    elif device_bytes:
        kv_bytes = rf.engine_kv_bytes(settings.name, costs, shard, tp, device_bytes, settings.memory_fraction,
                                      settings.max_num_batched_tokens, settings.max_num_seqs or 1024,
                                      settings.enforce_eager)
        rule = KV_RULES[settings.name]
    else:
        return settings.model_copy(update={"max_num_seqs": settings.max_num_seqs or 2048}), None
    tokens = rf.kv_cache_tokens_of(kv_bytes, shard, settings.block_tokens)
    update = {"kv_rule": rule, "kv_cache_bytes_per_gpu": max(kv_bytes, 0.0)}
    if not settings.max_num_seqs:  # SGLang: from the pool it allocated
        update["max_num_seqs"] = rf.sglang_max_running_requests(tokens, settings.max_model_len or 4096)
    return settings.model_copy(update=update), tokens


def as_engine(settings: rf.EngineSettings, name: Optional[str]) -> rf.EngineSettings:
    """``settings`` as engine ``name`` would run them (an RL run's rollout engine over a predicted profile's): its
    KV blocks, its KV rule and prefill scheduling (which follow the name), the other engine's version, scheduler
    and executor dropped; the same settings where ``name`` is None or the engine's own."""
    if name is None or name == settings.name:
        return settings
    if name not in ENGINES:
        raise UserError(f"engine {name!r} is not one predict knows: use one of {', '.join(ENGINES)}")
    seqs = DEFAULT_MAX_NUM_SEQS.get(name, settings.max_num_seqs or 1024)
    return settings.model_copy(update={"name": name, "block_tokens": rf.BLOCK_TOKENS[name], "max_num_seqs": seqs,
                                       "version": None, "async_scheduling": None, "executor": None,
                                       "scheduler_steps": 1})


def t_seq_s(s: rf.EngineSettings, tp: int = 1) -> float:
    """The host time per running sequence of the engine's decode step (rf.sync_host_per_seq_s)."""
    return rf.sync_host_per_seq_s(s.name, s.version, s.async_scheduling, s.scheduler_steps, tp, s.logprobs, s.executor)


def engine_lines(settings: rf.EngineSettings, kv_tokens: Optional[int], kv_seqs: Optional[int], prompt_len: int,
                 output_len: int, tp: int = 1) -> list[str]:
    """What the prediction's engine is and what its KV rule gave, for the header and the assumptions."""
    s = settings
    mode = "eager (no CUDA graphs)" if s.enforce_eager else "CUDA graphs"
    v0 = rf.engine_version_step_s(s.name, s.version, s.scheduler_steps)
    if s.version:
        mode += (f"; version {s.version}" + (f", its V0 engine: +{v0 * 1e3:.2g} ms of host time a decode step "
                                              "(roofline.engine.V0_STEP_HOST_S" + (
                                                  f", once per {s.scheduler_steps} steps: multi-step scheduling"
                                                  if s.scheduler_steps > 1 else "") + ")" if v0 else ""))
    if s.executor:
        mode += f"; executor {s.executor}"
    sync = t_seq_s(s, tp)
    if sync:
        which = "V0_TP_HOST_PER_SEQ_S: V0 over several GPUs" if tp > 1 and rf.is_v0(s.name, s.version) \
            else "SYNC_HOST_PER_SEQ_S: no async scheduling" + (
                " (vLLM's ray executor before 0.21: RAY_ASYNC_SCHEDULING_VERSION)"
                if s.async_scheduling is None and rf.async_scheduling_default(s.version)
                and not rf.async_scheduling_default(s.version, s.executor) else "")
        if s.logprobs != "off":
            which += (f"; plus {rf.LOGPROBS_HOST_RATIO[s.logprobs] - 1:g}x SYNC_HOST_PER_SEQ_S for per-token "
                      f"log-probs{' with their text' if s.logprobs == 'text' else ''} in the caller's process, "
                      "LOGPROBS_HOST_RATIO")
        mode += f"; +{sync * 1e6:.3g} us of host time per running sequence a decode step (roofline.engine.{which})"
    elif s.name == "vllm":
        mode += "; async scheduling"
    frac = {"vllm": "gpu_memory_utilization", "sglang": "mem_fraction_static",
            "trtllm": "kv_cache_free_gpu_memory_fraction"}[s.name]
    lines = [f"engine: {s.name} ({frac} {s.memory_fraction:g}, max_num_seqs {s.max_num_seqs}, max_num_batched_tokens "
             f"{s.max_num_batched_tokens}, max_model_len {s.max_model_len}, KV cache dtype {s.kv_cache_dtype}, {mode}; "
             f"blocks of {s.block_tokens} tokens); {DEFAULT_SOURCES[s.name]}"]
    if kv_tokens is None:
        return lines + ["KV cache: unknown (the datasheet row has no memory size)"]
    gib = (s.kv_cache_bytes_per_gpu or 0.0) / GIB
    if kv_tokens == 0:
        return lines + [f"KV cache: none: the weights and the engine's reserve fill its share of device memory (raise "
                        f"--gpu-memory-utilization, lower --max-num-seqs or --max-num-batched-tokens, which size the "
                        f"profile run's activations, or use more devices per engine, --tp, or a smaller dtype); "
                        f"rule: {s.kv_rule}"]
    if s.name in rf.OPTIMISTIC_ADMISSION_ENGINES:
        how = (f"floor of tokens over prompt + {rf.OPTIMISTIC_OUTPUT_SHARE:g} x output, "
               f"{prompt_len + rf.optimistic_output_tokens(output_len)}, rounded up to whole blocks: {s.name} admits a "
               f"request when its prompt fits and makes room later, so its cache holds requests at every stage of "
               f"their lives, the older ones more often (roofline.memory.OPTIMISTIC_OUTPUT_SHARE)")
    else:
        how = (f"floor of tokens over prompt + output, {prompt_len + output_len}, rounded up to whole blocks: "
               f"admitted only with room for the whole request")
    lines.append(f"KV cache: {kv_tokens:,} tokens, {gib:.2f} GiB per GPU, {kv_seqs:,} sequences of prompt {prompt_len} + "
                 f"output {output_len} ({how}); rule: {s.kv_rule}")
    if s.name == "vllm" and s.max_model_len and kv_tokens < s.max_model_len:
        lines.append(f"caution: vLLM refuses to start when one max_model_len sequence ({s.max_model_len:,} tokens) does "
                     f"not fit its KV cache ({kv_tokens:,} tokens): run it with --max-model-len {kv_tokens} or less")
    return lines


def decode_layer_counts(spec: ModelSpec) -> dict[str, int]:
    """``decode_fixed_s``'s counts for a model: its MoE layers, the weight GEMMs beyond four a layer (latent
    attention's, shared experts', routers': roofline.extra_decode_gemms) and the small kernels beyond five a layer
    (query/key norms, latent attention's norms: roofline.extra_decode_kernels)."""
    moe = spec.moe.moe_layers if spec.moe else 0
    shared = moe if spec.moe and spec.moe.shared_expert_params else 0
    mla = bool(spec.kv_values_per_layer)
    return {"moe_layers": moe, "extra_gemms": rf.extra_decode_gemms(spec.num_layers, mla, shared, moe),
            "extra_kernels": rf.extra_decode_kernels(spec.num_layers, mla, spec.model_type in rf.QK_NORM_MODEL_TYPES)}
