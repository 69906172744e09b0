"""pandas views of a profile: one row per point or per raw sample, derived columns computed once."""

from __future__ import annotations

from typing import Optional


def generation_df(profile):
    import pandas as pd

    rows = [{
        "backend": p.backend, "concurrency": p.concurrency, "prompt_len": p.prompt_len,
        "output_len": p.output_len, "status": p.status, "tokens_per_s": p.tokens_per_s,
        "decode_tokens_per_s": p.decode_tokens_per_s, "decode_step_ms": _ms(p.decode_step_s),
        "prefill_ms": _ms(p.prefill_s), "cv": p.cv, "n_samples": len(p.samples),
        "peak_mem_gib": _gib(p.peak_mem_bytes), "error": p.error,
    } for p in profile.generation]
    return pd.DataFrame(rows, columns=_GEN_COLUMNS)


def training_df(profile):
    import pandas as pd

    rows = [{
        "backend": p.backend, "micro_batch": p.micro_batch, "seq_len": p.seq_len, "status": p.status,
        "tokens_per_s": p.tokens_per_s, "step_ms": _ms(p.step_s), "cv": p.cv, "n_samples": len(p.samples),
        "peak_mem_gib": _gib(p.peak_mem_bytes), "error": p.error,
    } for p in profile.training]
    return pd.DataFrame(rows, columns=_TRAIN_COLUMNS)


def samples_df(profile):
    """One row per raw sample (generation and training), for your own statistics."""
    import pandas as pd

    rows = []
    for p in profile.generation:
        for i, s in enumerate(p.samples):
            rows.append({"kind": "generation", "x": p.concurrency, "repeat": i, "time_s": s.total_s,
                         "tokens": s.output_tokens, "prefill_s": s.prefill_s, "decode_s": s.decode_s})
    for p in profile.training:
        for i, s in enumerate(p.samples):
            rows.append({"kind": "training", "x": p.micro_batch, "repeat": i, "time_s": s.step_s,
                         "tokens": p.micro_batch * p.seq_len, "prefill_s": None, "decode_s": None})
    return pd.DataFrame(rows, columns=["kind", "x", "repeat", "time_s", "tokens", "prefill_s", "decode_s"])


_GEN_COLUMNS = ["backend", "concurrency", "prompt_len", "output_len", "status", "tokens_per_s",
                "decode_tokens_per_s", "decode_step_ms", "prefill_ms", "cv", "n_samples", "peak_mem_gib", "error"]
_TRAIN_COLUMNS = ["backend", "micro_batch", "seq_len", "status", "tokens_per_s", "step_ms", "cv", "n_samples",
                  "peak_mem_gib", "error"]


def _ms(s: Optional[float]) -> Optional[float]:
    return None if s is None else s * 1e3


def _gib(b: Optional[int]) -> Optional[float]:
    return None if b is None else b / 2**30
