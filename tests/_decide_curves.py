"""Synthetic learning curves for the decide tests."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

LN = math.log(1 / 0.3)  # metric 1 - exp(-s/tau) crosses 0.7 at s = tau * LN


def write_curves(path, configs, seeds=3, noise=0.0, points=400, columns=None, step_only=False, until=None):
    """configs: (batch, lr, N*) -> runs whose metric crosses 0.7 at N* samples."""
    rows = []
    for batch, lr, nstar in configs:
        tau = nstar / LN
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            jitter = 1 + 0.03 * (seed - (seeds - 1) / 2)
            for k in range(1, points + 1):
                s = k * (until or 4 * nstar) / points
                m = 1 - math.exp(-s / (tau * jitter)) + noise * rng.standard_normal()
                row = {"run": f"b{batch}-lr{lr}-s{seed}", "batch_size": batch, "lr": lr, "samples": s, "metric": m}
                if step_only:
                    row["step"] = s / batch
                    del row["samples"]
                rows.append(row)
    df = pd.DataFrame(rows)
    if columns:
        df = df.rename(columns=columns)
    df.to_csv(path, index=False)
    return path
