"""Response lengths for the rollout simulation: observed values (a file) or a parametric form
(lognormal, uniform, fixed), cut at ``max_tokens``, drawn deterministically for a seed."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal, Optional

import numpy as np

from throughputlab.errors import UserError
from throughputlab.records.base import Record


class LengthDist(Record):
    """Response lengths in tokens: observed values (resampled) or a parametric form, cut at ``max_tokens``."""

    kind: Literal["observed", "lognormal", "uniform", "fixed"]
    mean: Optional[float] = None  # lognormal: mean length in tokens (before the cut)
    sigma: Optional[float] = None  # lognormal: standard deviation of log(length)
    low: Optional[int] = None  # uniform
    high: Optional[int] = None  # uniform, inclusive; fixed uses it as the length
    max_tokens: Optional[int] = None  # the generation cut; responses longer than it stop there
    values: list[int] = []  # observed
    source: Optional[str] = None  # where the observed values came from

    def sample(self, n: int, seed: int = 0) -> np.ndarray:
        """``n`` lengths, deterministic for a seed; always in [1, max_tokens]."""
        rng = np.random.default_rng(seed)
        if self.kind == "observed":
            x = rng.choice(np.asarray(self.values, dtype=np.int64), size=n, replace=True)
        elif self.kind == "lognormal":
            mu = math.log(self.mean) - self.sigma ** 2 / 2  # so that E[length] = mean
            x = np.rint(rng.lognormal(mu, self.sigma, size=n))
        elif self.kind == "uniform":
            x = rng.integers(self.low, self.high + 1, size=n)
        else:
            x = np.full(n, self.high)
        x = np.maximum(np.asarray(x, dtype=np.int64), 1)
        if self.max_tokens is not None:
            x = np.minimum(x, self.max_tokens)
        return x

    def longest(self) -> int:
        """The longest response the form allows (observed: the longest seen; lognormal without a
        cut: its 99.9th percentile), what training memory must hold."""
        if self.max_tokens is not None:
            return int(self.max_tokens)
        if self.kind == "observed":
            return int(max(self.values))
        if self.kind == "lognormal":
            mu = math.log(self.mean) - self.sigma ** 2 / 2
            return int(math.ceil(math.exp(mu + 3.09 * self.sigma)))
        return int(self.high)

    def describe(self) -> str:
        cut = f", cut at {self.max_tokens}" if self.max_tokens else ""
        if self.kind == "observed":
            return f"{len(self.values)} observed lengths from {self.source or 'a list'} (resampled){cut}"
        if self.kind == "lognormal":
            return f"lognormal, mean {self.mean:g} tokens, sigma {self.sigma:g}{cut}"
        if self.kind == "uniform":
            return f"uniform {self.low}..{self.high} tokens{cut}"
        return f"fixed {self.high} tokens{cut}"


_DIST_KEYS = {"lognormal": {"mean", "sigma", "max"}, "uniform": {"min", "max"}, "fixed": {"len"}}


def parse_length_dist(text: str, option: str = "--response-dist") -> LengthDist:
    """``lognormal:mean=300,sigma=0.6,max=1024`` | ``uniform:min=16,max=512`` | ``fixed:len=256``."""
    kind, _, rest = str(text).strip().partition(":")
    kind = kind.strip().lower()
    if kind not in _DIST_KEYS:
        raise UserError(f"{option} {text!r}: unknown form {kind!r}; use lognormal:mean=..,sigma=..,max=.. "
                        "or uniform:min=..,max=.. or fixed:len=..")
    kv = parse_kv(rest, option, text)
    unknown = set(kv) - _DIST_KEYS[kind]
    missing = {"mean", "sigma"} - set(kv) if kind == "lognormal" else _DIST_KEYS[kind] - set(kv)
    if unknown or missing:
        what = f"unknown key(s) {', '.join(sorted(unknown))}" if unknown else f"missing {', '.join(sorted(missing))}"
        raise UserError(f"{option} {text!r}: {what}; {kind} takes {', '.join(sorted(_DIST_KEYS[kind]))}")
    try:
        if kind == "lognormal":
            mean, sigma = float(kv["mean"]), float(kv["sigma"])
            cut = _pos_int(kv["max"], option, "max") if "max" in kv else None
            if not (mean > 0 and sigma >= 0 and math.isfinite(mean) and math.isfinite(sigma)):
                raise ValueError
            return LengthDist(kind="lognormal", mean=mean, sigma=sigma, max_tokens=cut)
        if kind == "uniform":
            lo, hi = _pos_int(kv["min"], option, "min"), _pos_int(kv["max"], option, "max")
            if hi < lo:
                raise UserError(f"{option} {text!r}: max must be at least min")
            return LengthDist(kind="uniform", low=lo, high=hi, max_tokens=hi)
        n = _pos_int(kv["len"], option, "len")
        return LengthDist(kind="fixed", high=n, max_tokens=n)
    except ValueError:
        raise UserError(f"{option} {text!r}: mean must be positive and sigma non-negative numbers") from None


def parse_kv(rest: str, option: str, text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise UserError(f"{option} {text!r}: expected key=value pairs separated by commas, got {part!r}")
        out[key.strip()] = value.strip()
    return out


def _pos_int(v: str, option: str, key: str) -> int:
    try:
        f = float(v)
    except ValueError:
        f = -1.0
    if not (f >= 1 and f == int(f)):
        raise UserError(f"{option}: {key} must be a positive integer, got {v!r}")
    return int(f)


def read_lengths_file(path: str | Path, max_tokens: Optional[int] = None,
                      option: str = "--response-lengths") -> LengthDist:
    """Observed response lengths: numbers separated by whitespace or commas, a JSON list, or a
    CSV whose single column (or column named response_len, length or tokens) holds them."""
    from throughputlab.files import read_text

    p = Path(path)
    text = read_text(p, "response lengths (tokens): numbers one per line, a JSON list or a CSV column",
                     f"{option} {path}")
    values: list[float]
    stripped = text.strip()
    if stripped.startswith("["):
        import json

        try:
            values = [float(x) for x in json.loads(stripped)]
        except (ValueError, TypeError):
            raise UserError(f"{option} {path}: expected a JSON list of numbers") from None
    else:
        tokens = [t for t in re.split(r"[\s,;]+", stripped) if t]
        try:
            values = [float(t) for t in tokens]
        except ValueError:
            values = _lengths_from_csv(p, option)
    if not values:
        raise UserError(f"{option} {path}: holds no lengths; write one response length (tokens) per line")
    arr = np.asarray(values, dtype=float)
    if not np.all(np.isfinite(arr)) or np.any(arr < 1) or np.any(arr != np.round(arr)):
        raise UserError(f"{option} {path}: lengths must be positive whole token counts")
    return LengthDist(kind="observed", values=[int(v) for v in arr], max_tokens=max_tokens, source=str(path))


def _lengths_from_csv(p: Path, option: str) -> list[float]:
    import pandas as pd

    from throughputlab.files import read_csv

    df = read_csv(p, "a list of numbers or a CSV with a response_len column", f"{option} {p}")
    for name in ("response_len", "response_length", "length", "tokens", "num_tokens"):
        if name in df.columns:
            col = df[name]
            break
    else:
        if len(df.columns) != 1:
            raise UserError(f"{option} {p}: CSV has columns {', '.join(map(str, df.columns))}; "
                            "name the length column response_len")
        col = df.iloc[:, 0]
    col = pd.to_numeric(col, errors="coerce")
    if col.isna().any():
        raise UserError(f"{option} {p}: the length column holds non-numbers")
    return col.astype(float).tolist()
