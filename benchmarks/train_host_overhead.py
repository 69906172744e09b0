"""Host time per transformer layer of a training pass, measured where the device work is nil.

A Qwen2-architecture model (Hugging Face's modeling code) with tiny widths (hidden 64, 4 x 16 tokens) and real
layer counts runs each pass on the CPU: its kernels take about a microsecond, so what is timed is the Python,
module, autograd and FSDP hook work a pass does per layer, the part that does not shrink with the model. Each
figure is the slope of a pass's median time over two layer counts (the fixed part of a pass cancels), the median
over rounds that interleave every kind, for:

- a forward under no_grad, plain (the eager forward the roofline's per-layer launch cost was measured on);
- the same forward under FSDP2 (``fully_shard`` per layer, one gloo rank: its hooks run, no bytes move);
- a training micro-step under FSDP2 (forward, a log-softmax loss, backward), without and with full activation
  checkpointing (``torch.utils.checkpoint``, non-reentrant, as veRL and TRL run it).

It prints each per layer and as a multiple of the plain forward: the multiples are what
``roofline.training.pass_launch_s`` takes (docs/model.md, "Training as frameworks batch it"); a GPU host adds
its kernel launches to every figure alike. Run it alone: two processes on two cores slow each other.

    python benchmarks/train_host_overhead.py [--rounds 5] [--repeats 9] [--layers 12,24]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds over every kind and layer count (median taken)")
    ap.add_argument("--repeats", type=int, default=9, help="timed passes of each kind a round (median taken)")
    ap.add_argument("--layers", default="12,24", help="two layer counts, comma-separated (the slope is per layer)")
    a = ap.parse_args(argv)
    try:
        lo, hi = (int(x) for x in a.layers.split(","))
    except ValueError:
        print(f"error: --layers {a.layers!r}: give two layer counts, e.g. 12,24", file=sys.stderr)
        return 2
    if not 0 < lo < hi or a.repeats < 3 or a.rounds < 1:
        print("error: --layers needs two increasing positive counts, --repeats at least 3, --rounds at least 1",
              file=sys.stderr)
        return 2

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    ids = torch.randint(0, 512, (4, 16))

    def build(layers: int, fsdp: bool, checkpointing: bool):
        cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=2,
                          num_key_value_heads=1, vocab_size=512, max_position_embeddings=256,
                          tie_word_embeddings=True, use_cache=False)
        cfg._attn_implementation = "sdpa"
        m = Qwen2ForCausalLM(cfg)
        m.train()
        if checkpointing:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if fsdp:
            for layer in m.model.layers:
                fully_shard(layer)
            fully_shard(m)
        return m

    def forward(m):
        with torch.no_grad():
            m(input_ids=ids)

    def train(m):
        logits = m(input_ids=ids).logits
        torch.log_softmax(logits.float(), -1).gather(-1, ids.unsqueeze(-1)).mean().backward()

    kinds = {"forward, plain": (False, False, forward), "forward, FSDP2": (True, False, forward),
             "train step, FSDP2": (True, False, train), "train step, FSDP2 + checkpointing": (True, True, train)}
    slopes: dict[str, list[float]] = {name: [] for name in kinds}
    try:
        models = {(name, n): build(n, fsdp, ckpt) for name, (fsdp, ckpt, _) in kinds.items() for n in (lo, hi)}
        for (name, _n), m in models.items():
            for _ in range(3):
                kinds[name][2](m)
        for _ in range(a.rounds):
            for name, (_, _, fn) in kinds.items():
                med = {}
                for n in (lo, hi):
                    ts = []
                    for _ in range(a.repeats):
                        t = time.perf_counter()
                        fn(models[name, n])
                        ts.append(time.perf_counter() - t)
                    med[n] = statistics.median(ts)
                slopes[name].append((med[hi] - med[lo]) / (hi - lo))
    finally:
        dist.destroy_process_group()
    per_layer = {name: statistics.median(v) for name, v in slopes.items()}
    base = per_layer["forward, plain"]
    print(f"host time per layer (slope over {lo} and {hi} layers, median of {a.rounds} rounds of {a.repeats} passes; "
          f"torch {torch.__version__}, {os.cpu_count()} CPU(s))")
    for name, v in per_layer.items():
        lo_r, hi_r = min(slopes[name]) / base, max(slopes[name]) / base
        print(f"  {name:<36} {v * 1e3:7.3f} ms   {v / base:5.2f} x the plain forward (rounds {lo_r:.2f}-{hi_r:.2f})")
    fwd = per_layer["forward, FSDP2"]
    print(f"backward, FSDP2 (train step less its forward): {(per_layer['train step, FSDP2'] - fwd) / base:.2f} x; "
          f"recompute (checkpointing less none): {(per_layer['train step, FSDP2 + checkpointing'] - per_layer['train step, FSDP2']) / base:.2f} x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
