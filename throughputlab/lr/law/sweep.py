"""Sweep input for `lr fit`: the canonical columns, reading and validating a CSV, synthetic sweeps.

One row per training run (N, D, lr, final loss, optionally the norms); every problem with the
file is a UserError naming the column or row. `synthetic_sweep` builds runs from a known law
for the tests and the examples.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from throughputlab.errors import UserError

# canonical name -> meaning; the CSV's own names map onto these (`--columns`)
COLUMNS = {
    "params": "model parameters N",
    "tokens": "training tokens D",
    "lr": "learning rate",
    "loss": "final loss (NaN or inf: the run diverged)",
    "weight_norm": "optional: weight norm ||W||",
    "update_norm": "optional: per-step update norm ||dW||",
    "effective_lr": "optional: ||dW|| / ||W|| directly (instead of the two norms)",
}
REQUIRED = ("params", "tokens", "lr", "loss")


def parse_column_map(spec: Optional[str]) -> dict[str, str]:
    """'params=N,tokens=D' -> {'params': 'N', 'tokens': 'D'} (canonical=csv name)."""
    out: dict[str, str] = {}
    if not spec:
        return out
    for part in spec.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise UserError(f"--columns entries must be canonical=csv_name, got {part.strip()!r}")
        k, v = (s.strip() for s in part.split("=", 1))
        if k not in COLUMNS:
            raise UserError(f"--columns: unknown name {k!r}; use one of {', '.join(COLUMNS)}")
        out[k] = v
    return out


def load_sweep(path: str, column_map: Optional[dict[str, str]] = None):
    """Read a sweep CSV into a frame with canonical column names; UserError on anything unusable."""
    from throughputlab.files import read_csv

    df = read_csv(path, "a sweep CSV, one row per run (params, tokens, lr, loss)", f"sweep {path}")
    return prepare_sweep(df, column_map, source=path)


def prepare_sweep(df, column_map: Optional[dict[str, str]] = None, source: str = "sweep"):
    import pandas as pd

    column_map = dict(column_map or {})
    names = {k: column_map.get(k, k) for k in COLUMNS}
    missing = [f"{k}" + (f" (as {names[k]!r})" if names[k] != k else "") for k in REQUIRED
               if names[k] not in df.columns]
    if missing:
        raise UserError(
            f"{source}: missing column(s) {', '.join(missing)}; found {', '.join(map(str, df.columns)) or 'none'}; "
            "rename them or map them with --columns params=N,tokens=D,lr=...,loss=..."
        )
    out = pd.DataFrame({k: df[names[k]] for k in COLUMNS if names[k] in df.columns})
    for k in out.columns:
        out[k] = pd.to_numeric(out[k], errors="coerce")
    for k in ("params", "tokens", "lr"):
        bad = ~(out[k] > 0) | ~np.isfinite(out[k])
        if bad.any():
            row = int(np.nonzero(bad.to_numpy())[0][0])
            raise UserError(f"{source}: column {names[k]!r} must be positive numbers; row {row + 2} has "
                            f"{df[names[k]].iloc[row]!r}")
    if len(out) == 0:
        raise UserError(f"{source}: no rows")
    if "weight_norm" in out and "update_norm" in out and "effective_lr" not in out:
        out["effective_lr"] = out["update_norm"] / out["weight_norm"]
    elif ("weight_norm" in out) != ("update_norm" in out) and "effective_lr" not in out:
        have = "weight_norm" if "weight_norm" in out else "update_norm"
        raise UserError(f"{source}: column {have!r} needs its partner "
                        f"({'update_norm' if have == 'weight_norm' else 'weight_norm'}) for the effective lr")
    out.attrs["columns"] = {k: names[k] for k in out.columns if k in names and names[k] in df.columns}
    return out


def synthetic_sweep(params: Sequence[float], tokens: Sequence[float], c0: float = -2.0, alpha: float = -0.3,
                    beta: float = -0.1, gamma_n: float = 0.0, gamma_d: float = 0.0, lr_points: int = 9,
                    lr_span_decades: float = 2.0, sharpness: float = 0.05, noise: float = 0.0005,
                    seed: int = 0, norms: bool = True):
    """Runs from a known law, loss = E(N, D) + sharpness * (log lr - log lr*)^2 + noise.

    log lr* = c0 + alpha log N + beta log D + gamma_n (log N - mean)^2 + gamma_d (log D - mean)^2.
    With `norms`, the curvature is put in the norms: the effective lr ||dW||/||W|| is lr times
    exp(-curvature terms), so the effective optimum follows the plain power law exactly.
    The lr grid is centred on each group's optimum with a random offset.
    """
    import pandas as pd

    rng = np.random.default_rng(seed)
    logn_c = float(np.mean(np.log(params)))
    logd_c = float(np.mean(np.log(tokens)))
    rows = []
    for n in params:
        for d in tokens:
            ln, ld = math.log(n), math.log(d)
            curv = gamma_n * (ln - logn_c) ** 2 + gamma_d * (ld - logd_c) ** 2
            log_opt = c0 + alpha * ln + beta * ld + curv
            centre = log_opt + rng.uniform(-0.3, 0.3)
            half = lr_span_decades * math.log(10) / 2
            base_loss = 2.0 + 400 * n**-0.34 + 400 * d**-0.28
            wnorm = math.sqrt(n) * 0.02
            for x in np.linspace(centre - half, centre + half, lr_points):
                loss = base_loss + sharpness * (x - log_opt) ** 2 + rng.normal(0, noise)
                row = dict(params=n, tokens=d, lr=math.exp(x), loss=loss)
                if norms:
                    eff = math.exp(x - curv)
                    row.update(weight_norm=wnorm, update_norm=eff * wnorm)
                rows.append(row)
    return pd.DataFrame(rows)
