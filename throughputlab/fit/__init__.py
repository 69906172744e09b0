"""Fitting the throughput model to a measured profile (docs/model.md).

- :mod:`~throughputlab.fit.schema`: what a fit stores (``FitResult``, its parts in
  :mod:`throughputlab.records.fit`) and reading it back, no scipy;
- :mod:`~throughputlab.fit.solver`: least squares in log space, intervals, leave-one-out, bootstrap;
- :mod:`~throughputlab.fit.generation`, :mod:`~throughputlab.fit.training`: the fits of each part;
- :mod:`~throughputlab.fit.knees`, :mod:`~throughputlab.fit.mbu` (utilisation), :mod:`~throughputlab.fit.summary`;
- :mod:`~throughputlab.fit.run`: ``fit_profile``; :mod:`~throughputlab.fit.load`: ``load_or_fit``, the
  stored fit or one made now, for every command that reads a profile's model.

Names are imported lazily, so ``from throughputlab.fit import load_fit`` does not import scipy.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "FitResult": "schema", "load_fit": "schema", "load_model": "load", "load_or_fit": "load", "costs_of": "schema",
    "peaks_of": "schema", "micro_batch_statement": "schema", "DEFAULT_BOOTSTRAP": "schema",
    "knee_statement": "knees", "generation_knee_statement": "knees",
    "utilisation": "mbu", "summary_lines": "summary", "fit_profile": "run",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f"throughputlab.fit.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'throughputlab.fit' has no attribute {name!r}")
