"""Refits and decisions of stored profiles, dumped to JSON and compared between two versions.

A change to the throughput model's code that should not change its numbers is checked by
dumping with the code before and after, then comparing:

    python benchmarks/physics_regression.py dump before.json      # with the old code checked out
    python benchmarks/physics_regression.py dump after.json
    python benchmarks/physics_regression.py compare before.json after.json --tol 0.001

``dump`` refits the demo profiles under reports/ with ``--bootstrap 0`` (parameters, knees,
held-out errors, largest micro-batch) and runs ``decide`` over 20 batch sizes on a measured
and on a predicted profile (step time and its parts, samples/s, time-to-target). ``compare``
prints every number that moved by more than ``--tol`` (relative).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROFILES = [
    "reports/cpu-amd-epyc-2026-11-29/demo-profile.json",
    "reports/cpu-amd-epyc-2026-11-30/demo-profile.json",
    "reports/cpu-amd-epyc-2026-11-30/tcmalloc-run2-profile.json",
    "reports/cpu-amd-epyc-2026-11-30/rollout_fidelity-profile.json",
]
PROMPTS = "4,8,12,16,24,32,48,64,96,128,160,192,256,320,384,512,640,768,896,1024"


def _refit(path: str) -> dict:
    from throughputlab.fit import fit_profile
    from throughputlab.records.profile import Profile

    prof = Profile.load(ROOT / path)
    prof.fit = None
    r = fit_profile(prof, bootstrap=0)
    out: dict = {}
    for part in ("generation", "prefill", "training"):
        f = getattr(r, part)
        if f is None:
            continue
        out.update({f"{part}.{e.name}": e.value for e in f.params})
        out.update({f"{part}.loo@{p.x}": p.loo_rel_error for p in f.points if p.loo_rel_error is not None})
    g = r.generation
    if g is not None:
        out["generation.knee"] = g.knee_concurrency
        out["generation.e2e_knee"] = g.generation_knee_concurrency
        out["generation.form"] = g.form
    if r.training is not None and r.training.memory is not None:
        out["training.max_micro_batch"] = r.training.memory.max_micro_batch
    out.update({f"util.{u.phase}@{u.x}.mbu": u.mbu_microbench for u in r.utilisation if u.mbu_microbench})
    return out


def _decide(profile: str, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "d.json"
        cmd = [sys.executable, "-m", "throughputlab", "decide", "--profile", profile, "--prompts", PROMPTS,
               "--group", "8", "--json", str(out), *extra]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if r.returncode != 0:
            return {"error": r.stderr.strip()[-300:]}
        rows = json.loads(out.read_text())["rows"]
    res = {}
    for row in rows:
        st = row.get("step") or {}
        for k in ("gen_s", "logprob_s", "train_s", "sync_s", "step_s"):
            if k in st:
                res[f"{row['prompts']}.{k}"] = st[k]
        res[f"{row['prompts']}.samples_per_s"] = row["samples_per_s"]
        res[f"{row['prompts']}.time_ratio"] = row.get("time_ratio")
    return res


def dump(path: Path) -> None:
    data = {p: _refit(p) for p in PROFILES}
    with tempfile.TemporaryDirectory() as tmp:
        pred = Path(tmp) / "pred.json"
        subprocess.run([sys.executable, "-m", "throughputlab", "predict", "--model", "qwen2.5-7b", "--gpu", "h200",
                        "-o", str(pred)], check=True, capture_output=True, cwd=ROOT)
        data["decide:qwen2.5-7b-h200"] = _decide(str(pred), ["--prompt-len", "512",
                                                             "--response-dist", "lognormal:mean=512,sigma=0.6,max=2048"])
        data["decide:demo-cpu"] = _decide(str(ROOT / PROFILES[2]), ["--prompt-len", "64",
                                                                    "--response-dist", "lognormal:mean=32,sigma=0.5,max=96"])
    path.write_text(json.dumps(data, indent=1, sort_keys=True))
    print(f"wrote {path}: {sum(len(v) for v in data.values())} numbers from {len(data)} cases")


def compare(a: Path, b: Path, tol: float) -> int:
    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    moved = total = 0
    for case in sorted(set(x) | set(y)):
        u, v = x.get(case, {}), y.get(case, {})
        for k in sorted(set(u) | set(v)):
            p, q = u.get(k), v.get(k)
            total += 1
            if isinstance(p, (int, float)) and isinstance(q, (int, float)) and not isinstance(p, bool):
                rel = abs(q - p) / max(abs(p), 1e-300) if p != q else 0.0
                if rel > tol and not (math.isclose(p, q, abs_tol=1e-12)):
                    moved += 1
                    print(f"{case}: {k}: {p:.6g} -> {q:.6g} ({100 * (q / p - 1) if p else math.inf:+.3f}%)")
            elif p != q:
                moved += 1
                print(f"{case}: {k}: {p!r} -> {q!r}")
    print(f"{moved} of {total} numbers moved by more than {100 * tol:g}%")
    return 1 if moved else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--tol", type=float, default=1e-3)
    args = ap.parse_args()
    if args.cmd == "dump":
        dump(args.out)
        return 0
    return compare(args.before, args.after, args.tol)


if __name__ == "__main__":
    sys.exit(main())
