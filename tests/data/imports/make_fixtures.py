"""Write the import fixtures in this folder, and with --examples the examples in benchmarks/data/.

Every file is synthetic, written from the fields the importers read (no downloaded data):
tokens/s follow a roofline curve with known parameters (the end-to-end form `throughputlab fit`
uses without step timings: static batches, prefill and decode sharing t0, BW, PHI), times 1 +/- 2%
noise from a fixed seed; latencies are the curve's prefill and decode-step times. Run logs hold
phase times chosen so their medians and percentiles are easy to compute by hand (the tests do).

    python tests/data/imports/make_fixtures.py [--examples]
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from throughputlab.models import resolve_model
from throughputlab.roofline import Costs, decode_step_s, mean_context, prefill_s
from throughputlab.throughput import DecodeParams, ThroughputModel

HERE = Path(__file__).parent
EXAMPLES = HERE.parents[2] / "benchmarks" / "data"

# Plausible vLLM figures for a 7-8B bf16 model on one datacenter GPU: a 1.5 ms step overhead,
# 78% of the datasheet bandwidth, 45% of the dense bf16 FLOP/s.
TRUE = dict(t0=1.5e-3, bw=2.6e12, phi=4.5e14)
MODEL_IDS = {"qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct", "llama3.1-8b": "meta-llama/Llama-3.1-8B-Instruct"}
CONCURRENCIES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PROMPT, OUTPUT = 512, 256


class Curve:
    def __init__(self, model: str, true: dict, seed: int):
        spec = resolve_model(model).spec
        self.model_id = MODEL_IDS[model]
        self.costs = Costs.from_spec(spec, 2)
        self.true = true
        self.tm = ThroughputModel(source="analytic", costs=self.costs,
                                  decode=DecodeParams(t0_s=true["t0"], bw_bytes_per_s=true["bw"],
                                                      phi_flops_per_s=true["phi"]))
        self.rng = np.random.default_rng(seed)

    def noisy(self, x: float, sd: float = 0.02) -> float:
        return float(x * (1 + sd * self.rng.standard_normal()))

    def tokens_per_s(self, c: int, p: int = PROMPT, o: int = OUTPUT) -> float:
        return self.noisy(float(self.tm.generation_tokens_per_s(c, p, o)))

    def step_s(self, c: int, p: int = PROMPT, o: int = OUTPUT) -> float:
        t = self.true
        return float(decode_step_s(c, mean_context(p, o), self.costs, t["t0"], t["bw"], t["phi"]))

    def prefill_s(self, c: int, p: int = PROMPT) -> float:
        t = self.true
        return float(prefill_s(c, p, self.costs, t["t0"], t["bw"], t["phi"]))


def _r(x: float) -> float:
    return float(f"{x:.6g}")


def serve_result(curve: Curve, c: int, *, num_prompts: int, detailed: bool = False, date: str = "20260105-101500",
                 failed: int = 0) -> dict:
    """A `vllm bench serve --save-result` JSON (its keys as vllm writes them)."""
    tps = curve.tokens_per_s(c)
    completed = num_prompts - failed
    total_out, total_in = completed * OUTPUT, completed * PROMPT
    duration = total_out / tps
    ttft_ms, tpot_ms = 1e3 * curve.prefill_s(c), 1e3 * curve.step_s(c)
    d = {
        "date": date, "endpoint_type": "vllm", "backend": "vllm", "label": None, "model_id": curve.model_id,
        "tokenizer_id": curve.model_id, "num_prompts": num_prompts, "request_rate": "inf", "burstiness": 1.0,
        "max_concurrency": c, "duration": _r(duration), "completed": completed, "failed": failed,
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": _r(completed / duration), "request_goodput": None, "output_throughput": _r(tps),
        "total_token_throughput": _r((total_in + total_out) / duration),
        "max_output_tokens_per_s": _r(tps * 1.1), "max_concurrent_requests": c,
    }
    e2el_ms = ttft_ms + tpot_ms * (OUTPUT - 1)
    for key, mean in (("ttft", ttft_ms), ("tpot", tpot_ms), ("itl", tpot_ms), ("e2el", e2el_ms)):
        d.update({f"mean_{key}_ms": _r(mean), f"median_{key}_ms": _r(mean * 0.98), f"std_{key}_ms": _r(mean * 0.05),
                  f"p99_{key}_ms": _r(mean * 1.3)})
    if detailed:
        n = num_prompts
        d["input_lens"] = [PROMPT] * n
        d["output_lens"] = [OUTPUT] * completed + [0] * failed
        d["ttfts"] = [_r(curve.noisy(ttft_ms / 1e3, 0.05)) for _ in range(completed)] + [0.0] * failed
        d["itls"] = [[_r(curve.noisy(tpot_ms / 1e3, 0.05)) for _ in range(OUTPUT - 1)] for _ in range(completed)] \
            + [[] for _ in range(failed)]
        d["generated_texts"] = ["" for _ in range(n)]
        d["errors"] = [""] * completed + ["Internal Server Error"] * failed
    return d


def write_sweep(curve: Curve, folder: Path, repeats: dict[int, int]) -> list[dict]:
    """A `vllm bench sweep serve` experiment folder: SERVE-...-BENCH-.../run=N.json and summary.csv."""
    if folder.exists():
        shutil.rmtree(folder)
    rows = []
    for c in CONCURRENCIES:
        comb = folder / f"SERVE--max_num_seqs=256-BENCH--max_concurrency={c}"
        comb.mkdir(parents=True)
        comb_rows = []
        for run in range(repeats.get(c, 1)):
            d = serve_result(curve, c, num_prompts=max(8 * c, 64))
            d.update({"run_number": run, "max_num_seqs": 256, "max_concurrency": c})
            (comb / f"run={run}.json").write_text(json.dumps(d, indent=4))
            comb_rows.append(d)
        (comb / "summary.json").write_text(json.dumps(comb_rows, indent=4))
        rows.extend(comb_rows)
    keys = list(rows[0])
    with open(folder / "summary.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["", *keys])
        for i, r in enumerate(rows):
            w.writerow([i, *["" if r.get(k) is None else r.get(k) for k in keys]])
    return rows


def guidellm_report(curve: Curve, model_id: str) -> dict:
    """A GuideLLM benchmarks.json (the fields the importer reads, in GuideLLM's nesting)."""
    strategies = [({"type_": "synchronous"}, 1)] + [({"type_": "concurrent", "streams": s}, s) for s in (2, 8, 32, 128)]
    strategies += [({"type_": "throughput", "max_concurrency": 512}, 236.4),
                   ({"type_": "constant", "rate": 12.0}, 47.3), ({"type_": "poisson", "rate": 6.0}, 22.6)]

    def dist(mean: float, total: float | None = None, n: int = 0) -> dict:
        pct = {k: _r(mean * f) for k, f in (("p001", 0.5), ("p01", 0.6), ("p05", 0.7), ("p10", 0.8), ("p25", 0.9),
                                            ("p50", 1.0), ("p75", 1.1), ("p90", 1.2), ("p95", 1.3), ("p99", 1.5),
                                            ("p999", 1.8))}
        d = {"mean": _r(mean), "median": _r(mean), "mode": _r(mean), "variance": _r((0.1 * mean) ** 2),
             "std_dev": _r(0.1 * mean), "min": _r(0.5 * mean), "max": _r(1.8 * mean), "count": n,
             "total_sum": _r(total if total is not None else mean * n), "percentiles": pct}
        return {"successful": d, "incomplete": None, "errored": None, "total": None}

    benches = []
    start = 1767607200.0
    for i, (strategy, conc) in enumerate(strategies):
        c = max(round(conc), 1)
        tps = curve.tokens_per_s(c)
        n = max(4 * c, 32)
        out_total = n * OUTPUT
        duration = out_total / tps
        ttft_ms, itl_ms = 1e3 * curve.prefill_s(c), 1e3 * curve.step_s(c)
        requests = [{"request_id": f"r{j}", "prompt_tokens": PROMPT, "output_tokens": OUTPUT,
                     "time_to_first_token_ms": _r(curve.noisy(ttft_ms, 0.05)), "inter_token_latency_ms": _r(itl_ms)}
                    for j in range(min(n, 4))]
        benches.append({
            "type_": "generative_benchmark",
            "config": {"run_id": "fixture", "run_index": i, "strategy": strategy, "constraints": {},
                       "profile": {"type_": "sweep"}, "requests": {}, "backend": {"model": model_id},
                       "environment": {}},
            "start_time": start, "end_time": start + duration, "duration": _r(duration),
            "metrics": {
                "request_totals": {"successful": n, "incomplete": 0, "errored": 0, "total": n},
                "requests_per_second": dist(n / duration, n=n),
                "request_concurrency": dist(conc, n=n),
                "prompt_token_count": dist(PROMPT, n * PROMPT, n),
                "output_token_count": dist(OUTPUT, out_total, n),
                "time_to_first_token_ms": dist(ttft_ms, n=n),
                "inter_token_latency_ms": dist(itl_ms, n=n),
                "time_per_output_token_ms": dist(itl_ms, n=n),
                "output_tokens_per_second": dist(tps, n=n),
                "tokens_per_second": dist(tps * (PROMPT + OUTPUT) / OUTPUT, n=n),
            },
            "requests": {"successful": requests, "incomplete": [], "errored": [], "total": None},
        })
        start += duration + 5
    return {"args": {"model": model_id, "profile": "sweep", "data": [f"prompt_tokens={PROMPT},output_tokens={OUTPUT}"]},
            "benchmarks": benches}


# Run logs: step i (1-based) of 20 takes gen 50+i-1 s, logprob 10+0.5(i-1), ref 8, values 6,
# update_critic 12, update_actor 20+(i-1)/2, update_weights 3 (step 7: 9), step = their sum + 1.
RL_STEPS = 20


def rl_phases(i: int) -> dict[str, float]:
    k = i - 1
    ph = {"gen": 50.0 + k, "logprob": 10.0 + 0.5 * k, "ref": 8.0, "values": 6.0, "update_critic": 12.0,
          "update_actor": 20.0 + 0.5 * k, "sync": 9.0 if i == 7 else 3.0}
    ph["step"] = sum(ph.values()) + 1.0
    return ph


VERL = {"gen": "timing_s/gen", "logprob": "timing_s/old_log_prob", "ref": "timing_s/ref", "values": "timing_s/values",
        "update_critic": "timing_s/update_critic", "update_actor": "timing_s/update_actor",
        "sync": "timing_s/update_weights", "step": "timing_s/step"}


def write_verl(path: Path, steps: int = RL_STEPS, scale: float = 1.0) -> None:
    lines = [{"step": 0, "data": {"val-core/openai/gsm8k/reward/mean@1": 0.31}}]  # validation only: no timings
    for i in range(1, steps + 1):
        ph = rl_phases(i)
        data = {VERL[k]: round(v * scale, 4) for k, v in ph.items()}
        data.update({"response_length/mean": 300.0 + 10 * (i - 1), "response_length/max": 1024.0,
                     "response_length/min": 40.0 + i, "response_length/clip_ratio": 0.01 * (i % 4),
                     "perf/total_num_tokens": 1_000_000 + 1000 * i, "perf/throughput": 1800.0 + i,
                     "perf/max_memory_allocated_gb": 61.5, "actor/pg_loss": -0.01 * i,
                     "critic/score/mean": 0.3 + 0.01 * i,
                     "timing_per_token_ms/gen": 0.05})
        lines.append({"step": i, "data": data})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def write_trl(path: Path) -> None:
    hist, tokens = [], 0
    for i in range(1, RL_STEPS + 1):
        tokens += 4096 * 8 + 64 * i
        hist.append({"epoch": i / RL_STEPS, "step": i, "loss": 0.01, "learning_rate": 1e-6, "num_tokens": tokens,
                     "completions/mean_length": 300.0 + 10 * (i - 1), "completions/max_length": 1024.0,
                     "completions/min_length": 40.0 + i, "completions/clipped_ratio": 0.01 * (i % 4),
                     "reward": 0.3 + 0.01 * i, "step_time": rl_phases(i)["step"]})
    hist.append({"epoch": 1.0, "step": RL_STEPS, "train_runtime": 3000.0, "train_samples_per_second": 0.5,
                 "train_steps_per_second": 0.007, "total_flos": 0.0, "train_loss": 0.01})
    path.write_text(json.dumps({"best_metric": None, "epoch": 1.0, "global_step": RL_STEPS, "log_history": hist,
                                "logging_steps": 1, "max_steps": RL_STEPS}, indent=2))


def write_csv(path: Path, gen_column: str = "gen") -> None:
    cols = ["step", gen_column, "logprob", "ref", "update_actor", "sync", "step_time", "response_length"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for i in range(1, RL_STEPS + 1):
            ph = rl_phases(i)
            w.writerow([i, ph["gen"], ph["logprob"], ph["ref"], ph["update_actor"], ph["sync"], ph["step"],
                        300 + 10 * (i - 1)])


def fixtures() -> None:
    curve = Curve("qwen2.5-7b", TRUE, seed=1)
    write_sweep(curve, HERE / "vllm_sweep", repeats={4: 2, 64: 2})
    only_csv = HERE / "vllm_sweep_summary_only"
    only_csv.mkdir(exist_ok=True)
    shutil.copy(HERE / "vllm_sweep" / "summary.csv", only_csv / "summary.csv")
    (HERE / "vllm_serve_c4_detailed.json").write_text(json.dumps(
        serve_result(curve, 4, num_prompts=8, detailed=True, failed=1)))
    for c in (8, 32):
        (HERE / f"vllm_serve_c{c}.json").write_text(json.dumps(serve_result(curve, c, num_prompts=256), indent=4))
    n, tps = 1024, curve.tokens_per_s(256)
    (HERE / "vllm_throughput.json").write_text(json.dumps({
        "elapsed_time": _r(n * OUTPUT / tps), "num_requests": n, "total_num_tokens": n * (PROMPT + OUTPUT),
        "requests_per_second": _r(tps / OUTPUT), "tokens_per_second": _r(tps * (PROMPT + OUTPUT) / OUTPUT)}, indent=4))
    (HERE / "guidellm_benchmarks.json").write_text(json.dumps(guidellm_report(curve, curve.model_id), indent=1))
    write_verl(HERE / "verl_metrics.jsonl")
    write_trl(HERE / "trl_trainer_state.json")
    write_csv(HERE / "runlog.csv")
    write_csv(HERE / "runlog_renamed.csv", gen_column="rollout_seconds")


def examples() -> None:
    """One example per format for docs/import.md: Llama-3.1-8B on an A100 80GB SXM (synthetic)."""
    curve = Curve("llama3.1-8b", dict(t0=2.0e-3, bw=1.6e12, phi=1.5e14), seed=7)
    write_sweep(curve, EXAMPLES / "vllm_sweep_llama8b_a100", repeats={})
    (EXAMPLES / "guidellm_llama8b_a100.json").write_text(json.dumps(guidellm_report(curve, curve.model_id), indent=1))
    write_verl(EXAMPLES / "verl_metrics_example.jsonl", steps=30, scale=0.4)


if __name__ == "__main__":
    fixtures()
    if "--examples" in sys.argv[1:]:
        examples()
