"""A benchmark script under benchmarks/ loaded as a module, for the harness tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str):
    """benchmarks/<name>.py as the module ``<name>_harness``, registered in sys.modules (dataclasses look their
    module up)."""
    spec = importlib.util.spec_from_file_location(f"{name}_harness", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
