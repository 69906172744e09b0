"""A real admission plateau: vLLM's CPU engine with a KV cache of 1 GiB (VLLM_CPU_KVCACHE_SPACE=1) and
a model whose KV cache takes 256 KiB per token holds 16 requests at once; past that the bench's
tokens/s stays flat, and the fit names the KV cache as the ceiling, at the engine's recorded size.
One engine start (about 30 s on two cores) and a short sweep."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

# 4 layers x 2 x 32 KV heads x 256 dims x 4 bytes (float32) = 256 KiB of KV cache per token, with small
# matrices (hidden 256): 1 GiB holds 4,096 tokens less the engine's reserve, in blocks of 128 (one request).
BIG_KV = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 256,
    "vocab_size": 4096, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
}


def test_a_small_kv_cache_flattens_the_sweep_and_the_fit_says_so(tmp_path):
    import subprocess

    from throughputlab.fit.run import fit_profile
    from throughputlab.records.profile import Profile

    model = tmp_path / "big-kv"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(BIG_KV))
    out = tmp_path / "p.json"
    tmpdir = tempfile.mkdtemp(prefix="tl-", dir="/tmp")  # vLLM's sockets: short paths
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TMPDIR": tmpdir}
    cmd = [sys.executable, "-m", "throughputlab", "bench", "--backend", "vllm", "--model", str(model), "--only", "gen",
           "-c", "1,4,16,32,64,128", "--prompt-len", "16", "--output-len", "48", "--repeats", "3", "--rounds", "1",
           "--random-weights", "--no-telemetry", "--engine-arg", "enforce_eager=true", "-o", str(out)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    prof = Profile.load(out)
    e = prof.engine
    block = int(e.engine_args.get("block_size") or 16)
    assert e.kv_cache_tokens is not None, e
    limit = e.kv_cache_tokens // (block * -(-64 // block))  # requests of 16 + 48 tokens, whole blocks each
    assert 4 <= limit <= 64, (e.kv_cache_tokens, block)
    ok = {p.concurrency: p for p in prof.generation if p.status == "ok"}
    assert set(ok) == {1, 4, 16, 32, 64, 128}  # past the cache the engine queues: measured, not skipped
    g = fit_profile(prof).generation
    assert g.ceiling == "admission: KV cache" and g.admission_limit == limit, (g.ceiling, g.admission_limit)
    at = max(ok[c].tokens_per_s for c in ok if c <= limit)
    past = [ok[c].tokens_per_s for c in ok if c >= 4 * limit]
    assert past and at > 2 * ok[1].tokens_per_s  # below the limit the batch widens
    # past it the queued requests wait: c requests run as c/limit waves of the limit, and the last wave's drain
    # weighs 1/waves of the run, so tokens/s nears the plateau from below (2 waves read 210-299 tokens/s across
    # runs, 4 and 8 waves 251-305). Judged at 4x and 8x the limit: doubling the requests there gained 0.92x to
    # 1.15x in four runs (the drain's share halving gives about 1.1x), where an engine admitting them all would
    # double its batch; and not much higher than the widest admitted batch allows (238 to 332 tokens/s at the limit
    # across runs on a 2-core AMD EPYC, up to 1.28x of it past the limit; 766 and 1,038 tokens/s, 1.36x, in one run on
    # a 2-core Intel Xeon, where the fixed cost of a generate call weighs more against its faster steps: a 50% bound).
    # Medians of three repeats.
    assert max(past) < 1.25 * min(past), past
    assert max(past) < 1.5 * at, (at, past)
    held = [p for p in g.points if p.x > limit]
    # the fit predicts a queued point as waves of the limit at the admitted curve's rate; it does not model the
    # last wave's drain shrinking with the waves, nor the queued requests' prefills riding in the running ones'
    # decode steps, so it reads low: -10%, -20%, -22% at 2, 4, 8 waves in one EPYC run, within 5% in another;
    # -14% and -29% at 2 and 4 waves in one run on a 2-core Intel Xeon; but +11%, +11%, +17% at 32, 64, 128 requests
    # in one CI run, where the queued points read 0.85-0.9x of the widest admitted one (a 35% bound below, 25% above;
    # a fit without the limit extrapolates the admitted curve, which was still rising there)
    assert held and all(-0.35 < p.loo_rel_error < 0.25 for p in held), [(p.x, p.loo_rel_error) for p in held]
