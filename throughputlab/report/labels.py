"""What the report calls a profile and its contexts, and the colours it draws them in: the helpers
the figures, the tables and the attention section share. A leaf: it imports nothing from report/,
so the flow only goes down into it. Plain text; the figures (plotting.py) and the page (page.py)
escape it. No torch.
"""

from __future__ import annotations

from typing import Optional

from throughputlab.records.profile import Profile

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
GiB = 2**30


def profile_label(p: Profile) -> str:
    if p.kind in ("predicted", "imported"):
        return f"{p.model.name} on {p.hardware.device_name} ({p.kind})"
    backend = p.settings.gen_backend or p.settings.train_backend or ""
    return f"{p.model.name} on {p.hardware.device_name}" + (f", {backend}" if backend else "")


def contexts_of(points) -> list[tuple[int, int, list]]:
    """The contexts a profile measured: (prompt_len, output_len, its points by concurrency), shortest first."""
    groups: dict[tuple[int, int], list] = {}
    for g in points:
        groups.setdefault((g.prompt_len, g.output_len), []).append(g)
    return [(pl, ol, sorted(pts, key=lambda g: g.concurrency)) for (pl, ol), pts in sorted(groups.items())]


def context_names(groups) -> list[str]:
    """'prompt N' per context (with the output length only where it differs between contexts)."""
    outputs = {ol for _, ol, _ in groups}
    return [f"prompt {pl}" + (f", output {ol}" if len(outputs) > 1 else "") for pl, ol, _ in groups]


def shade(color: str, i: int, n: int) -> str:
    """The i-th of n shades of a profile's color, darker to lighter: the contexts of one profile keep its hue."""
    if n <= 1:
        return color
    t = -0.35 + 0.8 * i / (n - 1)  # below 0: toward black, above: toward white
    rgb = [int(color[j:j + 2], 16) for j in (1, 3, 5)]
    rgb = [round(v * (1 + t)) if t < 0 else round(v + (255 - v) * t) for v in rgb]
    return "#" + "".join(f"{v:02x}" for v in rgb)


def kv_concurrency(p: Profile, m, seq_tokens: int) -> Optional[float]:
    """The sequences of ``seq_tokens`` the KV cache holds: the engine's own figure, else its cache
    tokens or the model's (``m``) over the sequence length; None where neither is known."""
    e = p.engine
    if e is not None and e.max_concurrency:
        return float(e.max_concurrency)
    tokens = (e.kv_cache_tokens if e is not None else None) or (m.kv_cache_tokens if m is not None else None)
    return tokens / seq_tokens if tokens else None
