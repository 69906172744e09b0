"""Generation backend `openai`: any OpenAI-compatible completions endpoint (vllm serve, SGLang, TGI).

Concurrency ``c`` is ``c`` streaming ``/completions`` requests sent together (an asyncio
semaphore caps the requests in flight at ``c``). Each request records its time to first
token and the gaps between streamed tokens; a sample's ``total_s`` is the wall time of the
whole batch, so tokens/s is comparable with the offline backends.

Prompts are random token-id lists (exact prompt length; vLLM and SGLang accept them); a
server that rejects token ids gets a text prompt of ``prompt_len`` repeated words instead.
Only the given URL is contacted. For a server on this machine (loopback), its processes are
found by port so that telemetry and py-spy follow them too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from typing import Any, Optional
from urllib.parse import urlsplit

from throughputlab.errors import EngineMissing, UserError
from throughputlab.records.profile import EngineInfo, GenSample

log = logging.getLogger(__name__)

_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def normalise_url(url: str) -> str:
    """``http://host:port`` or ``.../v1`` -> the API base ending in ``/v1`` (other paths kept as given)."""
    if not url or not url.strip():
        raise UserError("--url is empty: give the server's base URL, e.g. http://127.0.0.1:8000/v1")
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"--url {url}: expected http://HOST:PORT/v1 (an http or https URL)")
    try:
        _ = parts.port  # a port that is not a number raises here
    except ValueError:
        raise UserError(f"--url {url}: the port is not a number") from None
    base = url.rstrip("/")
    if parts.path in ("", "/"):
        base += "/v1"
    return base


class OpenAIGenerationBackend:
    name = "openai"

    def __init__(self, url: str, *, model: Optional[str] = None, vocab_size: Optional[int] = None,
                 timeout_s: float = 600.0, api_key: Optional[str] = None, seed: int = 0, **_ignored: Any):
        self.base = normalise_url(url)
        self.url = url
        self.model = model
        self.vocab_size = vocab_size or 1000
        self.timeout_s = timeout_s
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.prompt_format = "token_ids"
        self._info: Optional[EngineInfo] = None
        self._server_procs: list = []
        import numpy as np

        self._rng = np.random.default_rng(seed)

    # ---------------------------------------------------------------- setup

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def start(self) -> None:
        httpx = _import_httpx()
        try:
            r = httpx.get(f"{self.base}/models", headers=self._headers(), timeout=10.0)
        except httpx.HTTPError as e:
            raise UserError(f"--url {self.url}: cannot reach the server ({_reason(e)}); is it running?") from None
        if r.status_code in (401, 403):
            raise UserError(f"--url {self.url}: the server refused the request (HTTP {r.status_code}); "
                            "set OPENAI_API_KEY to its API key")
        if r.status_code != 200:
            raise UserError(f"--url {self.url}: GET /models answered HTTP {r.status_code}; "
                            "is this an OpenAI-compatible server (base URL ending in /v1)?")
        try:
            served = [m["id"] for m in r.json().get("data", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            served = []
        if self.model is None:
            if not served:
                raise UserError(f"--url {self.url}: the server lists no models; pass --served-model NAME")
            self.model = served[0]
        elif served and self.model not in served:
            raise UserError(f"--served-model {self.model}: the server serves {', '.join(served)}")
        self._server_procs = _local_server_processes(self.base)
        self._info = self._read_engine_info(httpx, served)

    def _read_engine_info(self, httpx, served: list[str]) -> EngineInfo:
        root = self.base[: -len("/v1")] if self.base.endswith("/v1") else self.base
        version = name = None
        try:
            r = httpx.get(f"{root}/version", headers=self._headers(), timeout=5.0)
            if r.status_code == 200:
                version = str(r.json().get("version")) or None
                name = "vllm"
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
        kv_tokens = None
        try:
            r = httpx.get(f"{root}/metrics", headers=self._headers(), timeout=5.0)
            if r.status_code == 200:
                kv_tokens = kv_tokens_from_metrics(r.text)
        except httpx.HTTPError:
            pass
        return EngineInfo(name=f"openai ({name})" if name else "openai", version=version, kv_cache_tokens=kv_tokens,
                          engine_args={"url": self.base, "model": self.model, "served_models": ", ".join(served),
                                       "prompt_format": self.prompt_format,
                                       "server_pids": ", ".join(str(p.pid) for p in self._server_procs)})

    def engine_info(self) -> Optional[EngineInfo]:
        if self._info is not None:
            self._info.engine_args["prompt_format"] = self.prompt_format
        return self._info

    # ---------------------------------------------------------------- measurement

    def _prompts(self, concurrency: int, prompt_len: int) -> list:
        if self.prompt_format == "text":
            return [" ".join(["hello"] * prompt_len)] * concurrency
        low = 10 if self.vocab_size > 20 else 0
        return self._rng.integers(low, self.vocab_size, size=(concurrency, prompt_len)).tolist()

    def run(self, concurrency: int, prompt_len: int, output_len: int) -> GenSample:
        if self.model is None:
            raise RuntimeError("OpenAIGenerationBackend.run() before start()")
        try:
            return asyncio.run(self._batch(concurrency, prompt_len, output_len))
        except _PromptRejected as e:
            if self.prompt_format != "token_ids":
                raise RuntimeError(str(e)) from None
            log.warning("the server rejects token-id prompts (%s); sending text prompts of %d words", e, prompt_len)
            self.prompt_format = "text"
            return asyncio.run(self._batch(concurrency, prompt_len, output_len))

    async def _batch(self, concurrency: int, prompt_len: int, output_len: int) -> GenSample:
        httpx = _import_httpx()
        prompts = self._prompts(concurrency, prompt_len)
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        sem = asyncio.Semaphore(concurrency)
        timeout = httpx.Timeout(self.timeout_s, connect=10.0)
        async with httpx.AsyncClient(limits=limits, timeout=timeout, headers=self._headers()) as client:
            t0 = time.perf_counter()
            results = await asyncio.gather(*(self._request(client, sem, p, output_len) for p in prompts))
            total = time.perf_counter() - t0
        firsts = [r[0][0] for r in results if r[0]]
        lasts = [r[0][-1] for r in results if r[0]]
        ttft = [t - t0 for t in firsts]
        # gaps between streamed chunks, as vLLM's serving benchmark counts them: a server that puts
        # several tokens in one chunk yields fewer, longer gaps
        itl = [b - a for times, _ in results for a, b in zip(times, times[1:])]
        tokens = sum(n for _, n in results)
        prefill = decode = None
        if len(firsts) == len(results) and firsts:
            prefill = max(firsts) - t0
            decode = max(lasts) - max(firsts)
        return GenSample(total_s=total, output_tokens=tokens, prefill_s=prefill, decode_s=decode, ttft_s=ttft,
                         itl_s=itl)

    async def _request(self, client, sem: asyncio.Semaphore, prompt, output_len: int) -> tuple[list[float], int]:
        """Stream one completion; return the arrival time of each streamed token and the token count."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": output_len, "temperature": 1.0,
                "stream": True, "stream_options": {"include_usage": True},
                # vLLM / SGLang extensions: exactly output_len tokens
                "min_tokens": output_len, "ignore_eos": True}
        times: list[float] = []
        usage_tokens = None
        async with sem:
            async with client.stream("POST", f"{self.base}/completions", json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    msg = _error_message(text) or f"HTTP {resp.status_code}"
                    if resp.status_code in (400, 422) and self.prompt_format == "token_ids":
                        raise _PromptRejected(msg)
                    raise RuntimeError(f"the server answered HTTP {resp.status_code}: {msg}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    now = time.perf_counter()
                    try:
                        chunk = json.loads(payload)
                    except ValueError:
                        continue
                    if chunk.get("error"):
                        raise RuntimeError(f"the server reported: {_error_message(payload)}")
                    usage = chunk.get("usage")
                    if usage and usage.get("completion_tokens") is not None:
                        usage_tokens = int(usage["completion_tokens"])
                    if chunk.get("choices"):
                        times.append(now)
        return times, usage_tokens if usage_tokens is not None else len(times)

    def reset_peak_memory(self) -> None:
        pass

    def peak_memory_bytes(self) -> Optional[int]:
        return None

    def is_oom(self, exc: BaseException) -> bool:
        return "out of memory" in str(exc).lower()

    def pids(self) -> list[int]:
        return [os.getpid(), *(p.pid for p in self._server_procs if _running(p))]

    def close(self) -> None:
        self._server_procs = []


class _PromptRejected(Exception):
    pass


def kv_tokens_from_metrics(text: str) -> Optional[int]:
    """vLLM's Prometheus gauge ``vllm:cache_config_info{block_size="..",num_gpu_blocks="..",...}``."""
    for line in text.splitlines():
        if line.startswith("vllm:cache_config_info{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            try:
                if labels.get("kv_cache_size_tokens", "None") != "None":
                    return int(float(labels["kv_cache_size_tokens"]))
                return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
            except (KeyError, ValueError):
                return None
    return None


def _local_server_processes(base: str) -> list:
    """The processes listening on a loopback URL's port, with their children (best effort)."""
    parts = urlsplit(base)
    if parts.hostname not in _LOOPBACK:
        return []
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        import psutil

        pids = {c.pid for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
        return [psutil.Process(pid) for pid in pids if pid != os.getpid()]
    except Exception as e:  # other users' processes, or no permission: telemetry covers this process only
        log.debug("cannot find the server process on port %s: %s", port, e)
        return []


def _running(p) -> bool:
    try:
        return p.is_running()
    except Exception:
        return False


def _error_message(text: str) -> str:
    try:
        data = json.loads(text)
    except ValueError:
        return text.strip().splitlines()[0][:300] if text.strip() else ""
    err = data.get("error", data) if isinstance(data, dict) else data
    msg = err.get("message", err) if isinstance(err, dict) else err
    return str(msg).strip().splitlines()[0][:300] if str(msg).strip() else ""


def _reason(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def _import_httpx():
    try:
        import httpx
    except ImportError:
        raise EngineMissing("--backend openai needs httpx: pip install httpx") from None
    return httpx
