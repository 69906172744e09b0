"""The demo model's decode step in plain torch at batch 1 to 16, outside throughputlab's sweep.

Tells a machine effect from a measurement one: if the step is not monotonic in the batch here
(torch's CPU GEMM switching kernels between batch 1, 2-4 and 8), no roofline fits the default run's
small concurrencies on that machine, whatever the sweep does.

    python benchmarks/decode_kernels.py [--model demo] [--steps 24]

Run it alone (two CPU-bound processes on two cores slow each other several times over).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo", help="a preset (random weights)")
    ap.add_argument("--steps", type=int, default=24, help="decode steps per batch size (the first 4 are warm-up)")
    ap.add_argument("--prompt-len", type=int, default=16)
    args = ap.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from throughputlab.models import resolve_model

    cfg = {k: v for k, v in resolve_model(args.model).config.items() if not k.startswith("_")}
    conf = AutoConfig.for_model(**cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(conf).eval()
    n = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"{args.model}: {n:.1f} M parameters, float32, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print("batch  decode step ms (median)  per sequence ms")
    for c in (1, 2, 3, 4, 6, 8, 16):
        ids = torch.randint(0, conf.vocab_size, (c, args.prompt_len))
        times = []
        with torch.inference_mode():
            out = model(ids, use_cache=True)
            past, nxt = out.past_key_values, ids[:, -1:]
            for _ in range(args.steps):
                t = time.perf_counter()
                out = model(nxt, past_key_values=past, use_cache=True)
                times.append(time.perf_counter() - t)
                past = out.past_key_values
        step = statistics.median(times[4:])
        print(f"{c:>5}  {1e3 * step:>23.1f}  {1e3 * step / c:>15.1f}")


if __name__ == "__main__":
    main()
