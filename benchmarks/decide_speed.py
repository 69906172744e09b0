"""How long `throughputlab decide` takes over 200 batch sizes, for a predicted H200 profile of Qwen2.5-7B.

    python benchmarks/decide_speed.py                 # the three cases below, median of 3 each
    python benchmarks/decide_speed.py --repeats 5 --no-search

The RL shape is a typical GRPO one: prompts of 1,024 tokens, 8 responses per prompt, response
lengths lognormal with mean 2,000 tokens cut at 8,192, and 200 batch sizes spaced evenly in
log from 64 to 4,096 prompts, with activation checkpointing (otherwise one 9k-token sequence
does not fit for training). Cases:

- ``no KV pressure``: vLLM's 0.9 of device memory and ``max_num_seqs`` 256, so the sequence cap,
  not the KV cache, limits admission (the slot schedule);
- ``KV-limited``: colocated at ``gpu_memory_utilization`` 0.5 with ``max_num_seqs`` 1,024, so the
  cache limits admission and preempts (the event loop);
- ``placement search``: the 8-GPU profile, every placement and engine size (run once: it is
  many decisions).

Each figure is the library call (`decide_from_spec`: load and fit the profile, simulate, rank)
timed in one process, median of ``--repeats``; the import of the package (about 0.6 s on this
machine, paid once per command) is printed on its own, with the command line's wall time.
Target: under 2 s for each 200-size case.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 2.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sizes", type=int, default=200, help="batch sizes, log-spaced from 64 to 4096 prompts")
    ap.add_argument("--no-search", action="store_true", help="skip the placement search")
    args = ap.parse_args()

    t0 = time.perf_counter()
    import numpy as np

    from throughputlab.decide.calculator import decide_from_spec
    from throughputlab.decide.cli import build_spec
    import_s = time.perf_counter() - t0

    tmp = Path(tempfile.mkdtemp(prefix="decide_speed_"))
    exe = [sys.executable, "-m", "throughputlab"]
    for name, gpus in (("p1.json", 1), ("p8.json", 8)):
        subprocess.run(exe + ["predict", "--model", "qwen2.5-7b", "--gpu", "h200", "--gpus", str(gpus),
                              "-o", str(tmp / name)], check=True, capture_output=True)
    prompts = np.unique(np.geomspace(64, 4096, args.sizes).round().astype(int))
    prompts_arg = ",".join(str(int(p)) for p in prompts)
    shape = dict(prompts=prompts_arg, group=8, prompt_len=1024,
                 response_dist="lognormal:mean=2000,sigma=0.8,max=8192", activation_checkpointing=True)
    roomy = tmp / "roomy.json"
    roomy.write_text(json.dumps({"shape": {"engine": {"max_num_seqs": 256}}}))
    cases = [("no KV pressure", roomy, dict(profile=str(tmp / "p1.json"), gpu_memory_utilization=0.9), args.repeats),
             ("KV-limited", None, dict(profile=str(tmp / "p1.json"), gpu_memory_utilization=0.5), args.repeats)]
    if not args.no_search:
        cases.append(("placement search", None, dict(profile=str(tmp / "p8.json"), placement="search"), 1))

    print(f"decide over {len(prompts)} batch sizes ({prompts[0]} to {prompts[-1]} prompts of 8), prompt 1024, "
          "responses lognormal mean 2000 cut at 8192, Qwen2.5-7B predicted on H200")
    print(f"package import: {import_s:.2f} s (once per command)")
    worst = 0.0
    for name, spec_file, flags, repeats in cases:
        spec = build_spec(spec_file, **shape, **flags)
        times, decisions = [], None
        for _ in range(repeats):
            t = time.perf_counter()
            decisions = decide_from_spec(spec)
            times.append(time.perf_counter() - t)
        rows = decisions[0].rows
        kv = sum(r.step.rollout.kv_limited for r in rows)
        pre = sum(r.step.rollout.preemptions for r in rows)
        med = statistics.median(times)
        if name != "placement search":
            worst = max(worst, med)
        argv = ["decide", *(["--spec", str(spec_file)] if spec_file else []), "--prompts", prompts_arg,
                *sum(([f"--{k.replace('_', '-')}", str(v)] for k, v in {**shape, **flags}.items()
                      if k != "prompts" and v is not True), []),
                *[f"--{k.replace('_', '-')}" for k, v in {**shape, **flags}.items() if v is True]]
        t = time.perf_counter()
        subprocess.run(exe + argv, check=True, capture_output=True)
        cli_s = time.perf_counter() - t
        print(f"{name:>17}: {med:6.2f} s median of {repeats} ({', '.join(f'{x:.2f}' for x in times)}); "
              f"command line {cli_s:.2f} s; {len(decisions)} placement(s), best: {decisions[0].placement}; "
              f"{kv}/{len(rows)} KV-limited rollouts, {pre} preemptions")
    print(f"target: under {TARGET_S:g} s per 200-size decision: {'met' if worst < TARGET_S else 'NOT met'} "
          f"(slowest {worst:.2f} s)")
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
