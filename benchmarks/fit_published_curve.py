"""Fit a published concurrency -> output tokens/s curve with the same code as `throughputlab fit`.

The curve is a CSV under benchmarks/data/ whose '#' header lines give the source, the model,
the GPU and the request lengths. The points become a Profile with one sample each (no step
timings, so the fit targets end-to-end tokens/s), built as `throughputlab import` builds one
(throughputlab.imports.common), and go through throughputlab.fit.fit_profile.
Prints the per-point in-sample and leave-one-out errors, the fitted parameters against the
datasheet and the knee.

    python benchmarks/fit_published_curve.py [benchmarks/data/vllm_mistral7b_rtx4090.csv]
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

from throughputlab.fit import fit_profile, summary_lines
from throughputlab.imports.common import Target, imported_profile, resolve_gpu
from throughputlab.models.spec import spec_from_config
from throughputlab.records.profile import GenPoint, GenSample, Profile

# mistralai/Mistral-7B-Instruct-v0.3 config.json (Hugging Face), the fields the cost model reads
MISTRAL_7B_V03 = {
    "model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336, "vocab_size": 32768,
    "tie_word_embeddings": False, "hidden_act": "silu", "max_position_embeddings": 32768,
}
MODELS = {"mistralai/Mistral-7B-Instruct-v0.3": MISTRAL_7B_V03}


def read_curve(path: Path) -> tuple[dict[str, str], list[tuple[int, float]]]:
    meta, rows = {}, []
    lines = path.read_text().splitlines()
    for line in lines:
        if line.startswith("#") and ":" in line:
            k, v = line[1:].split(":", 1)
            meta[k.strip()] = v.strip()
    body = [ln for ln in lines if ln.strip() and not ln.startswith("#")]
    for r in csv.DictReader(body):
        rows.append((int(r["concurrency"]), float(r["output_tokens_per_s"])))
    return meta, rows


def curve_profile(meta: dict[str, str], rows: list[tuple[int, float]]) -> Profile:
    """One point per row; its one sample is the c*o tokens of a batch at the published rate
    (the curve gives a rate, not a run's totals)."""
    model_id = meta["model"].split()[0]
    target = Target(spec=spec_from_config(MODELS[model_id], model_id, "hub"), datasheet=resolve_gpu(meta["gpu"]))
    p_len, o_len = int(meta["prompt_len"]), int(meta["output_len"])
    points = [GenPoint(backend="vllm", concurrency=c, prompt_len=p_len, output_len=o_len, status="ok",
                       samples=[GenSample(total_s=c * o_len / tps, output_tokens=c * o_len)]) for c, tps in rows]
    return imported_profile(target, points, backend="vllm", source="published",
                            notes=[f"published curve: {meta.get('source', '')}"])


def main(argv: list[str]) -> int:
    path = Path(argv[1]) if len(argv) > 1 else Path(__file__).parent / "data" / "vllm_mistral7b_rtx4090.csv"
    meta, rows = read_curve(path)
    prof = curve_profile(meta, rows)
    fit = fit_profile(prof)
    print(f"{path.name}: {meta['model']} on {meta['gpu']}, prompt {meta['prompt_len']}, output {meta['output_len']}")
    print(f"source: {meta['source']}")
    print(f"{'concurrency':>11} {'measured':>10} {'fitted':>10} {'err':>7} {'held-out':>10} {'err':>7}")
    for p in fit.generation.points:
        print(f"{p.x:>11} {p.measured_tokens_per_s:>10.1f} {p.fitted_tokens_per_s:>10.1f} "
              f"{100 * (p.fitted_tokens_per_s / p.measured_tokens_per_s - 1):>+6.1f}% "
              f"{p.loo_tokens_per_s or float('nan'):>10.1f} {100 * (p.loo_rel_error or float('nan')):>+6.1f}%")
    worst_fit = max(abs(p.fitted_tokens_per_s / p.measured_tokens_per_s - 1) for p in fit.generation.points)
    print(f"largest in-sample error {100 * worst_fit:.1f}%, largest held-out error "
          f"{100 * (fit.generation.loo_max_abs_error or float('nan')):.1f}%")
    # Where the measured curve bends: the local slope d log(tokens/s) / d log(c) between neighbours
    # falls from 1 (linear) to 0 (flat); for c / (a + b*c) it is 1/2 exactly where a = b*c, the knee.
    slopes = [(math.sqrt(c1 * c2), math.log(t2 / t1) / math.log(c2 / c1)) for (c1, t1), (c2, t2) in zip(rows, rows[1:])]
    for (c1, _), (c2, _), (_, sl) in zip(rows, rows[1:], slopes):
        print(f"  measured log-log slope {c1:>3} -> {c2:<3} {sl:.2f}")
    bend = _crossing(slopes, 0.5)
    m = fit.model
    p_len, o_len = int(meta["prompt_len"]), int(meta["output_len"])
    grid = [2 ** (i / 8) for i in range(0, 8 * 12)]
    fitted_slopes = [(math.sqrt(a * b), math.log(m.generation_tokens_per_s(b, p_len, o_len) /
                                                 m.generation_tokens_per_s(a, p_len, o_len)) / math.log(b / a))
                     for a, b in zip(grid, grid[1:])]
    print(f"measured curve: slope 1/2 at concurrency {_fmt(bend)}; fitted curve: slope 1/2 at "
          f"{_fmt(_crossing(fitted_slopes, 0.5))}")
    g = fit.generation
    print(f"fitted end-to-end knee {_fmt(g.generation_knee_concurrency)}; decode-step knee {_fmt(g.knee_concurrency)}")
    for line in summary_lines(fit):
        print(line)
    return 0


def _crossing(slopes: list[tuple[float, float]], level: float):
    """First concurrency where the slope falls through ``level``, interpolated in log c."""
    for (c1, s1), (c2, s2) in zip(slopes, slopes[1:]):
        if s1 >= level > s2:
            f = (s1 - level) / (s1 - s2)
            return math.exp(math.log(c1) + f * (math.log(c2) - math.log(c1)))
    return None


def _fmt(x) -> str:
    return "n/a (not within the range)" if x is None else f"{x:.3g}"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
