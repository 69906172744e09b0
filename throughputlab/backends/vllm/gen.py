"""Generation backend `vllm`: vLLM's offline engine (``vllm.LLM``), one engine per sweep.

Concurrency ``c`` is ``c`` requests submitted in one ``generate`` call, with the engine's
sequence cap (``max_num_seqs``) at least the sweep's largest ``c``. Prompts are fresh random
token ids each run (so prefix caching never shortens a prefill), outputs are exactly
``output_len`` tokens with EOS ignored, and presets or ``--random-weights`` load
``load_format="dummy"`` from the config alone, so nothing is downloaded.

Prefill and decode are split with vLLM's per-request timestamps (engine-core monotonic
clock: scheduled, first token, last token) when the engine reports them; otherwise by the
difference between a run of ``output_len`` tokens and a one-token run.

On CPU the backend sets a few environment variables for the engine (no core reserved for
the engine core, a short libgomp spin): ``throughputlab.backends.vllm.env`` says why. The
engine's reported capacity is read by ``throughputlab.backends.vllm.info``; its processes are
tracked by ``throughputlab.backends.vllm.procs``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import gc
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Any, Optional

from throughputlab.backends import INSTALL_HINTS
from throughputlab.backends.vllm.env import (
    EnvOverride,
    engine_environment,
    is_env_name,
    prepare_environment,
    recorded_cpu_environment,
    unset_cpu_defaults,
)
from throughputlab.backends.vllm.info import read_engine_info
from throughputlab.backends.vllm.procs import is_alive, new_children, start_guard, stop_all, stop_guard
from throughputlab.errors import EngineMissing, UserError
from throughputlab.models import ResolvedModel
from throughputlab.records.profile import EngineInfo, GenSample

log = logging.getLogger(__name__)

__all__ = ["VLLMGenerationBackend", "engine_environment", "import_vllm", "prepare_environment", "sampling_params",
           "split_from_metrics", "synthetic_prompts"]


def import_vllm():
    try:
        import vllm
    except ImportError as e:
        raise EngineMissing(f"--backend vllm needs vLLM ({e.name or 'vllm'} is missing): "
                            f"{INSTALL_HINTS['vllm']}") from None
    return vllm


def synthetic_prompts(rng, concurrency: int, prompt_len: int, vocab_size: int) -> list[dict]:
    """``concurrency`` prompts of random token ids (ids below 10 are often special tokens)."""
    low = 10 if vocab_size > 20 else 0
    ids = rng.integers(low, vocab_size, size=(concurrency, prompt_len))
    return [{"prompt_token_ids": row.tolist()} for row in ids]


def sampling_params(output_len: int):
    """Exactly ``output_len`` tokens (EOS ignored), sampled at temperature 1 as RL rollouts are."""
    from vllm import SamplingParams

    return SamplingParams(n=1, temperature=1.0, top_p=1.0, max_tokens=output_len, min_tokens=output_len,
                          ignore_eos=True, detokenize=False)


def split_from_metrics(outputs, t_submit_mono: float) -> Optional[tuple[float, float, list[float]]]:
    """(prefill_s, decode_s, ttft per request) from vLLM's per-request stats, or None if absent.

    Prefill: from submission until every request has its first token. Decode: from then until
    the last token of the batch. Timestamps are the engine core's monotonic clock, which is
    the same clock as this process's ``time.monotonic`` on Linux.
    """
    stats = [getattr(o, "metrics", None) for o in outputs]
    if not stats or any(s is None or not getattr(s, "first_token_ts", 0) or not getattr(s, "last_token_ts", 0)
                        for s in stats):
        return None
    first = max(s.first_token_ts for s in stats)
    last = max(s.last_token_ts for s in stats)
    prefill = first - t_submit_mono
    decode = last - first
    if prefill <= 0 or decode < 0:
        return None  # clocks not comparable (another OS): use the two-length difference
    ttft = [float(s.first_token_latency) for s in stats if getattr(s, "first_token_latency", 0) > 0]
    return prefill, decode, ttft


def _engine_arg_names() -> set[str]:
    from vllm import EngineArgs

    return {f.name for f in dataclasses.fields(EngineArgs)}


class VLLMGenerationBackend:
    name = "vllm"

    def __init__(self, resolved: ResolvedModel, *, dtype: str, device: str, seed: int = 0,
                 max_concurrency: int = 1, max_len: int = 0, engine_args: Optional[dict] = None):
        if max_concurrency < 1:
            raise UserError(f"--concurrency values must be positive integers, got {max_concurrency}")
        self.resolved = resolved
        self.dtype = dtype
        self.device = device
        self.seed = seed
        self.max_concurrency = max_concurrency
        self.max_len = max_len
        args = dict(engine_args or {})
        self.user_env = {k: v for k, v in args.items() if is_env_name(k)}  # for the engine's processes
        self.user_engine_args = {k: v for k, v in args.items() if k not in self.user_env}
        self._engine_env: dict[str, str] = {}
        self._env_defaults: list[str] = []
        self._cpu_env_defaults: Optional[set[str]] = None
        self.llm = None
        self.timing = "engine"  # "engine" (per-request stats) or "difference" (two output lengths)
        self._engine_kwargs: dict[str, Any] = {}
        self._engine_procs: list = []  # psutil.Process of the engine's processes, for telemetry and cleanup
        self._guard = None  # kills the engine's processes should this process die first (vllm.procs)
        self._tmpdir: Optional[str] = None
        self._extra_dirs: list[str] = []
        self._info: Optional[EngineInfo] = None
        import numpy as np

        self._rng = np.random.default_rng(seed)
        self._check_engine_args()

    # ---------------------------------------------------------------- setup

    def _check_engine_args(self) -> None:
        args = self.user_engine_args
        if "model" in args:
            raise UserError("--engine-arg model=... is not allowed: choose the model with --model")
        if "dtype" in args and str(args["dtype"]) not in ("auto", self.dtype):
            raise UserError(f"--engine-arg dtype={args['dtype']} conflicts with --dtype {self.dtype}: "
                            "set the dtype with --dtype (the profile records it)")
        seqs = args.get("max_num_seqs")
        if seqs is not None and (not isinstance(seqs, int) or seqs < self.max_concurrency):
            raise UserError(f"--engine-arg max_num_seqs={seqs} is below the largest --concurrency "
                            f"{self.max_concurrency}: the engine would queue requests instead of running them together")
        mml = args.get("max_model_len")
        if mml is not None and self.max_len and (not isinstance(mml, int) or mml < self.max_len):
            raise UserError(f"--engine-arg max_model_len={mml} is shorter than --prompt-len + --output-len "
                            f"= {self.max_len}")

    def _model_source(self) -> dict[str, Any]:
        r = self.resolved
        if r.source == "preset":
            folder = os.path.join(self._workdir(), "model")
            os.makedirs(folder, exist_ok=True)
            cfg = {k: v for k, v in r.config.items() if not k.startswith("_")}
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(cfg, f, indent=1)
            return {"model": folder, "load_format": "dummy"}
        out: dict[str, Any] = {"model": r.path, "trust_remote_code": r.trust_remote_code}
        if r.random_weights:
            out["load_format"] = "dummy"
        return out

    def _workdir(self) -> str:
        """A private temp folder for this engine: the preset's config and vLLM's IPC sockets."""
        if self._tmpdir is None:
            self._tmpdir = tempfile.mkdtemp(prefix="throughputlab-vllm-")
        return self._tmpdir

    def _rpc_dir(self) -> str:
        path = os.path.join(self._workdir(), "rpc")
        # A unix socket path holds at most 107 bytes; vLLM appends "/" + a 36-character uuid.
        if len(path.encode()) + 37 > 100:
            path = tempfile.mkdtemp(prefix="throughputlab-vllm-rpc-", dir="/tmp" if os.path.isdir("/tmp") else None)
            self._extra_dirs.append(path)
        return path

    def engine_kwargs(self) -> dict[str, Any]:
        """What goes to ``vllm.LLM``: our defaults, then the user's --engine-arg values."""
        kw: dict[str, Any] = {
            **self._model_source(),
            "dtype": self.dtype,
            "seed": self.seed,
            "skip_tokenizer_init": True,  # prompts are token ids; random-weight models have no tokenizer
            "max_num_seqs": max(self.max_concurrency, 1),
            "disable_log_stats": False,  # per-request timestamps (RequestOutput.metrics) need the stats
        }
        if self.max_len:
            kw["max_model_len"] = self.max_len
        kw.update(self.user_engine_args)
        return kw

    def start(self) -> None:
        if self._cpu_env_defaults is None:  # first start: which CPU variables the user had not set
            self._cpu_env_defaults = unset_cpu_defaults(self.user_env)
        prepare_environment(self.device, quiet=not log.isEnabledFor(logging.INFO))
        tp = int(self.user_engine_args.get("tensor_parallel_size", 1) or 1)
        self._engine_env, self._env_defaults = engine_environment(self.device, self.user_env, tp)
        if self.device == "cpu":
            self._env_defaults = sorted(self._cpu_env_defaults | set(self._env_defaults))
        vllm = import_vllm()
        import psutil

        known = set(_engine_arg_names())
        for k in self.user_engine_args:
            if k not in known:
                close = difflib.get_close_matches(k, sorted(known), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise UserError(f"--engine-arg {k}: not a vLLM engine argument{hint}")
        me = psutil.Process()
        before = {p.pid for p in me.children(recursive=True)}
        self._engine_kwargs = self.engine_kwargs()
        log.info("starting vLLM %s with %s", vllm.__version__, self._engine_kwargs)
        t0 = time.perf_counter()
        # vLLM puts its ZMQ sockets in VLLM_RPC_BASE_PATH (default /tmp) and leaves them there
        # after shutdown; a private folder, removed by close(), leaves nothing behind.
        rpc_env = EnvOverride("VLLM_RPC_BASE_PATH", self._rpc_dir())
        # The engine's own variables (GOMP_SPINCOUNT, --engine-arg NAME=VALUE) hold while its
        # processes start, which copy them; this process's threads and later sweeps keep theirs.
        engine_env = [EnvOverride(k, v, force=True) for k, v in self._engine_env.items()]
        try:
            with rpc_env, contextlib.ExitStack() as stack:
                for override in engine_env:
                    stack.enter_context(override)
                self.llm = vllm.LLM(**self._engine_kwargs)
        except (TypeError, ValueError) as e:  # engine-argument validation: a user mistake
            self._track_engine_procs(me, before)
            self.close()
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            raise UserError(f"vLLM rejected the engine settings: {first}") from None
        except BaseException:
            self._track_engine_procs(me, before)
            self.close()
            raise
        self._track_engine_procs(me, before)
        self._guard = start_guard(self._engine_procs, [d for d in [self._tmpdir, *self._extra_dirs] if d])
        log.info("vLLM engine started in %.1f s (%d engine processes)", time.perf_counter() - t0,
                 len(self._engine_procs))
        self._info = read_engine_info(self.llm, vllm.__version__, self._engine_kwargs, max_len=self.max_len,
                                      hide_model=self.resolved.source == "preset",
                                      environment={**recorded_cpu_environment(self.device), **self._engine_env},
                                      env_defaults=self._env_defaults)
        cap = self._info.max_concurrency
        if cap is not None and cap < self.max_concurrency:
            log.warning("the KV cache holds %.1f requests of %d tokens: concurrencies above that queue or "
                        "preempt in the engine (raise gpu_memory_utilization, or VLLM_CPU_KVCACHE_SPACE on CPU)",
                        cap, self.max_len)

    def _track_engine_procs(self, me, before: set[int]) -> None:
        self._engine_procs += new_children(me, before, self._engine_procs)

    def engine_info(self) -> Optional[EngineInfo]:
        return self._info

    # ---------------------------------------------------------------- measurement

    def _generate(self, concurrency: int, prompt_len: int, output_len: int):
        if self.llm is None:
            raise RuntimeError("the vLLM engine is not running (start() not called, or closed)")
        vocab = self.resolved.spec.vocab_size
        prompts = synthetic_prompts(self._rng, concurrency, prompt_len, vocab)
        params = sampling_params(output_len)
        t_mono = time.monotonic()
        t0 = time.perf_counter()
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        total = time.perf_counter() - t0
        n = [len(o.outputs[0].token_ids) for o in outputs]
        if len(outputs) != concurrency or any(k != output_len for k in n):
            raise RuntimeError(f"vLLM returned {len(outputs)} requests with {sorted(set(n))} tokens; "
                               f"expected {concurrency} x {output_len}")
        return outputs, total, t_mono

    def run(self, concurrency: int, prompt_len: int, output_len: int) -> GenSample:
        outputs, total, t_mono = self._generate(concurrency, prompt_len, output_len)
        tokens = concurrency * output_len
        split = split_from_metrics(outputs, t_mono) if self.timing == "engine" else None
        if split is not None:
            prefill, decode, ttft = split
            return GenSample(total_s=total, output_tokens=tokens, prefill_s=prefill, decode_s=decode, ttft_s=ttft)
        # No per-request timing: a one-token run costs the prefill (plus one sampling step);
        # the difference to the full run is the decode of output_len - 1 tokens.
        _, t_one, _ = self._generate(concurrency, prompt_len, 1)
        return GenSample(total_s=total, output_tokens=tokens, prefill_s=t_one, decode_s=max(total - t_one, 0.0))

    def reset_peak_memory(self) -> None:
        pass

    def peak_memory_bytes(self) -> Optional[int]:
        # vLLM preallocates its KV cache; the engine's memory is in its worker processes, which
        # the telemetry sampler follows (GPU memory used, or resident memory of the process tree).
        return None

    def is_oom(self, exc: BaseException) -> bool:
        seen = set()
        e: Optional[BaseException] = exc
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            if type(e).__name__ in ("OutOfMemoryError", "MemoryError"):
                return True
            if "out of memory" in str(e).lower():
                return True
            e = e.__cause__ or e.__context__
        return False

    def release(self) -> None:
        """After a failed point: restart the engine if it died, so the sweep can go on."""
        if self.llm is None:
            return
        core = getattr(self.llm.llm_engine, "engine_core", None)
        resources = getattr(core, "resources", None)
        if getattr(resources, "engine_dead", False):
            log.warning("the vLLM engine died; restarting it")
            self.close()
            self.start()

    def pids(self) -> list[int]:
        return [os.getpid(), *(p.pid for p in self._engine_procs if is_alive(p))]

    # ---------------------------------------------------------------- shutdown

    def close(self, timeout_s: float = 20.0) -> None:
        """Shut the engine down and make sure none of its processes outlives the sweep."""
        llm, self.llm = self.llm, None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception as e:  # already dead, or half started: the process check below still runs
                log.debug("vLLM shutdown: %s", e)
            del llm
            gc.collect()
        if self._engine_procs:
            stop_all(self._engine_procs, timeout_s)
            self._engine_procs = []
        stop_guard(self._guard)
        self._guard = None
        for d in [self._tmpdir, *self._extra_dirs]:
            if d:
                shutil.rmtree(d, ignore_errors=True)
        self._tmpdir, self._extra_dirs = None, []

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()
