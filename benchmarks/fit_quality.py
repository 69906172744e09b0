"""How well the fitted model explains a measured profile: held-out errors and physical sanity.

    python benchmarks/fit_quality.py reports/cpu-demo.json

Prints the leave-one-out error of generation tokens/s at every concurrency and of training
tokens/s at every micro-batch (target: at most 5%), and the fitted bandwidth and FLOP/s
against the probe's micro-benchmarks (target: within a factor of 2) and the datasheet
(never above it). The decode bandwidth is judged against the matrix-vector benchmark (the
decode's own access pattern) when the profile has it, with the copy ratio printed beside it;
older profiles are judged against the copy. Exit code 1 when a target is missed.
"""

from __future__ import annotations

import sys

from throughputlab.fit import fit_profile, summary_lines
from throughputlab.records.profile import Profile

LOO_TARGET = 0.05
FACTOR = 2.0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    prof = Profile.load(argv[1])
    fit = fit_profile(prof, bootstrap=100)
    print(f"{prof.model.name} on {prof.hardware.device_name} ({prof.settings.dtype}), "
          f"{len(prof.generation)} generation and {len(prof.training)} training points")
    for line in summary_lines(fit):
        print(line)
    ok = True
    print("\ncheck 1: leave-one-out error of tokens/s")
    for name, part in (("generation", fit.generation), ("training", fit.training)):
        if part is None:
            continue
        for p in part.points:
            e = p.loo_rel_error
            flag = "ok" if e is not None and abs(e) <= LOO_TARGET else "MISS"
            ok &= flag == "ok"
            print(f"  {name:<10} x={p.x:<4} measured {p.measured_tokens_per_s:10.1f} held-out "
                  f"{p.loo_tokens_per_s or float('nan'):10.1f} error {100 * (e or float('nan')):+6.2f}%  {flag}")
    print("\ncheck 2: fitted rates against the micro-benchmarks and the datasheet")
    pk = fit.peaks
    rates = []
    if fit.generation:
        g = {e.name: e for e in fit.generation.params}
        # decode streams weights through matrix-vector products: that benchmark is the reference when the
        # profile has it; the copy ratio is printed beside it (informational when both exist)
        if pk.microbench_gemv_bytes_per_s:
            rates.append(("decode BW", g["bw_bytes_per_s"], "mat-vec", pk.microbench_gemv_bytes_per_s,
                          pk.datasheet_bytes_per_s, True))
        rates.append(("decode BW", g["bw_bytes_per_s"], "copy", pk.microbench_bytes_per_s, pk.datasheet_bytes_per_s,
                      not pk.microbench_gemv_bytes_per_s))
        rates.append(("decode PHI", g["phi_flops_per_s"], "matmul", pk.microbench_flops_per_s,
                      pk.datasheet_flops_per_s, True))
    if fit.prefill:
        g = {e.name: e for e in fit.prefill.params}
        rates.append(("prefill PHI", g["phi_flops_per_s"], "matmul", pk.microbench_flops_per_s,
                      pk.datasheet_flops_per_s, True))
    if fit.training:
        g = {e.name: e for e in fit.training.params}
        rates.append(("train PHI", g["phi_train_flops_per_s"], "matmul", pk.microbench_flops_per_s,
                      pk.datasheet_flops_per_s, True))
    for name, est, bench, micro, sheet, counts in rates:
        r = est.value / micro if micro else None
        within = r is not None and 1 / FACTOR <= r <= FACTOR
        below = sheet is None or est.value <= sheet
        if counts:
            ok &= within and below
        ci = f"[{est.lo:.3g}, {est.hi:.3g}]" if est.lo is not None else "[not bounded]"
        verdict = ("ok" if within and below else "MISS") + ("" if counts else " (informational)")
        print(f"  {name:<11} {est.value:.3g} {ci}  / {bench} {micro or float('nan'):.3g} = "
              f"{r if r is not None else float('nan'):.2f}x  datasheet {sheet if sheet else 'none'}  {verdict}")
    print("\nall targets met" if ok else "\nsome targets missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
