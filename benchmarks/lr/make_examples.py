"""Write the example sweeps in this folder (known law: log lr* = -2 - 0.3 log N - 0.1 log D).

example_sweep_curved.csv: lr* curved upward (0.04 per (log N)^2 and (log D)^2), with weight and
update norms in which the effective lr follows the plain power law; `lr fit` should flag the
curvature in lr and not in the effective lr. example_sweep_powerlaw.csv: no curvature, no norms.

    python benchmarks/lr/make_examples.py && throughputlab lr fit benchmarks/lr/example_sweep_curved.csv
"""

from pathlib import Path

from throughputlab.lr.law import synthetic_sweep

HERE = Path(__file__).parent
NS = [1e7, 3e7, 1e8, 3e8, 1e9]
DS = [1e9, 3e9, 1e10, 3e10]

if __name__ == "__main__":
    law = dict(c0=-2.0, alpha=-0.3, beta=-0.1, noise=0.002, seed=0)
    synthetic_sweep(NS, DS, gamma_n=0.04, gamma_d=0.04, **law).to_csv(HERE / "example_sweep_curved.csv", index=False)
    synthetic_sweep(NS, DS, norms=False, **law).to_csv(HERE / "example_sweep_powerlaw.csv", index=False)
