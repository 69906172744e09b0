"""The roofline's MoE layer against published timings of the fused MoE kernel alone.

    python benchmarks/moe_kernels.py [--data benchmarks/data/moe_kernels.yaml] [--series SUBSTRING]

An MoE layer in a decode step costs the fused path's floor (two expert GEMMs' GEMM_FLOOR_S, the family's, plus
MOE_LAYER_FLOOR_S) and the step roofline over the experts its tokens touch (roofline.weight_bytes: E(1 - (1 - k/E)^c)
of them under uniform routing, each read once; their FLOPs at the decode share of the peak), at the device family's
decode bandwidth. Each published row is one kernel call at one token count (benchmark_moe.py draws the router logits,
so the router GEMM is outside it, as it is outside MOE_LAYER_FLOOR_S). This prints predicted/published per row and per
series, so where the term holds and where the whole-model TP 8 MoE cases of benchmarks/published.py part from it can
be told apart from the rest of the step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from throughputlab import roofline as rf  # noqa: E402
from throughputlab.calibration import efficiencies_for  # noqa: E402
from throughputlab.errors import UserError  # noqa: E402
from throughputlab.records.peaks import lookup  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "moe_kernels.yaml"
REQUIRED = ("id", "engine", "device", "dtype", "tp", "hidden", "expert_intermediate", "experts", "top_k", "source",
            "where", "tokens_us")
BYTES = {"fp8": 1, "bfloat16": 2, "float16": 2}


def load(path: Path) -> list[dict]:
    """The series of ``path``; a series without its source, its shape or its timings is refused."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path}: not readable as YAML ({first}); give the data file benchmarks/data/moe_kernels.yaml") \
            from None
    series = (doc or {}).get("series")
    if not isinstance(series, list) or not series:
        raise UserError(f"{path}: no 'series' list; each series needs {', '.join(REQUIRED)}")
    for s in series:
        missing = [k for k in REQUIRED if not s.get(k)]
        if missing:
            raise UserError(f"{path}: series {s.get('id', '?')!r} lacks {', '.join(missing)}; every number needs "
                            "its source and the kernel's shape")
        if s["dtype"] not in BYTES:
            raise UserError(f"{path}: series {s['id']!r}: dtype {s['dtype']!r}; use one of {', '.join(BYTES)}")
        if lookup(s["device"]) is None:
            raise UserError(f"{path}: series {s['id']!r}: no datasheet row for the device {s['device']!r}")
    return series


def layer_costs(s: dict) -> rf.Costs:
    """One MoE layer of the series' shape as the roofline's constants: the top-k experts' shards read at one token
    (weight_bytes), every expert shard the same size, 2 FLOPs per weight per token."""
    params = 3 * s["hidden"] * s["expert_intermediate"] / s["tp"]  # gate, up and down projections, TP-sharded
    b = BYTES[s["dtype"]]
    k = s["top_k"]
    return rf.Costs(bytes_per_param=b, weight_bytes=k * params * b, kv_bytes_per_token=0.0,
                    flops_per_token=2.0 * k * params, attn_flops_per_ctx_token=0.0, moe_num_experts=s["experts"],
                    moe_top_k=k, moe_layers=1, moe_expert_bytes=params * b)


def predict_us(s: dict, tokens: int) -> float:
    """The roofline's time for one fused MoE call at ``tokens`` tokens, microseconds."""
    ds = lookup(s["device"])
    eff = efficiencies_for(ds.device, s["engine"])
    phi = eff.decode_phi * (eff.fp8_gemm_share if s["dtype"] == "fp8" else 1.0)
    floor = 2 * eff.gemm_floor_s + rf.MOE_LAYER_FLOOR_S
    step = rf.decode_step_s(tokens, 0.0, layer_costs(s), floor, eff.decode_bw * ds.memory_bandwidth_bytes_per_s,
                            phi * ds.flops_per_s[s["dtype"]])
    return 1e6 * float(step)


def rows(series: list[dict]) -> list[dict]:
    out = []
    for s in series:
        for tokens, us in sorted(s["tokens_us"].items()):
            pred = predict_us(s, int(tokens))
            out.append({"series": s["id"], "tokens": int(tokens), "published_us": float(us), "predicted_us": pred,
                        "ratio": pred / float(us)})
    return out


def render(series: list[dict], table: list[dict]) -> str:
    lines = ["The roofline's MoE layer (floor + touched experts at the family's decode bandwidth) against published "
             "fused-MoE kernel timings", "",
             f"{'series':<40} {'tokens':>6} {'published us':>13} {'predicted us':>13} {'pred/pub':>9}"]
    for r in table:
        lines.append(f"{r['series']:<40} {r['tokens']:>6} {r['published_us']:>13.2f} {r['predicted_us']:>13.2f} "
                     f"{r['ratio']:>9.2f}")
    lines += ["", f"{'series':<40} {'rows':>5} {'median':>7} {'min':>6} {'max':>6}  source"]
    for s in series:
        rs = [r["ratio"] for r in table if r["series"] == s["id"]]
        lines.append(f"{s['id']:<40} {len(rs):>5} {statistics.median(rs):>7.2f} {min(rs):>6.2f} {max(rs):>6.2f}  "
                     f"{s['source'].split(' ')[0]}")
    allr = [r["ratio"] for r in table]
    within = sum(abs(x - 1) <= 0.15 for x in allr)
    lines.append(f"\nall rows: {len(allr)}, median {statistics.median(allr):.2f}, within 15%: {within}/{len(allr)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="the series file (default: %(default)s)")
    ap.add_argument("--series", default="", help="only the series whose id contains this")
    args = ap.parse_args(argv)
    try:
        series = [s for s in load(args.data) if args.series in s["id"]]
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not series:
        print(f"error: no series id contains {args.series!r}; run without --series to see them all", file=sys.stderr)
        return 2
    print(render(series, rows(series)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
