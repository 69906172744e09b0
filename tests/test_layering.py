"""The layering, read from the source with ``ast``: no import circle; the library never imports the
command modules; fit/, report/, decide/, roofline/ and records/ import no torch or vllm; records/
imports nothing of throughputlab but leaf modules. Every import counts: at module level, inside
functions and under ``if TYPE_CHECKING``."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "throughputlab"

# Modules that import nothing of throughputlab but one another: what records/ may import
# (records.base, the records' base class, is one: ModelSpec, a stored record too, stands on it).
LEAVES = {"throughputlab", "throughputlab.errors", "throughputlab.files", "throughputlab.models",
          "throughputlab.models.spec", "throughputlab.models.quant", "throughputlab.records", "throughputlab.records.base"}
COMMAND_ENTRY = {"throughputlab.cli", "throughputlab.__main__"}
NO_ENGINES = ("fit", "report", "decide", "roofline", "records")
ENGINES = {"torch", "vllm"}
# (module, engine) -> why it cannot do without; empty: none needs one today
ENGINE_ALLOWED: dict[tuple[str, str], str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str):
    """The throughputlab module a dotted name lands in (``pkg.mod.Class`` -> ``pkg.mod``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> tuple[set[str], set[str]]:
    """(throughputlab modules, other top-level packages) that ``module`` imports anywhere."""
    ours, others = set(), set()
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = ".".join(base[:len(base) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                else node.module
            names = [f"{mod}.{a.name}" for a in node.names]  # a submodule, else a name of mod
        else:
            continue
        for name in names:
            if name.split(".")[0] == "throughputlab":
                target = _resolve(name)
                if target and target != module:
                    ours.add(target)
            else:
                others.add(name.split(".")[0])
    return ours, others


GRAPH, EXTERNAL = {}, {}
for _m, _p in MODULES.items():
    GRAPH[_m], EXTERNAL[_m] = _imports(_m, _p)


def _circles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each as one circle through it."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(_cycle_in(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def _cycle_in(comp: set[str]) -> list[str]:
    start = min(comp)
    path, seen = [start], {start}
    while True:  # every module of a component reaches the start again within it
        step = next((w for w in sorted(GRAPH[path[-1]]) if w in comp and w not in seen), None)
        if step is None or start in GRAPH[path[-1]]:
            return path + [start]
        path.append(step)
        seen.add(step)


def test_no_import_circle():
    circles = _circles()
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_library_never_imports_the_commands():
    bad = [f"{m} imports {t}" for m in sorted(GRAPH) if not m.startswith("throughputlab.commands")
           and m not in COMMAND_ENTRY for t in sorted(GRAPH[m]) if t.startswith("throughputlab.commands")]
    assert not bad, bad


def test_analysis_layers_import_no_engine():
    bad = [f"{m} imports {e}" for m in sorted(GRAPH) if m.split(".")[1:2] and m.split(".")[1] in NO_ENGINES
           for e in sorted(EXTERNAL[m] & ENGINES) if (m, e) not in ENGINE_ALLOWED]
    assert not bad, bad


def test_records_import_only_leaves():
    def with_parents(name):  # importing a.b.c runs a/__init__ and a/b/__init__ too
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}

    bad = [f"{m} imports {t}" for m in sorted(GRAPH) if m.startswith("throughputlab.records")
           for t in sorted(GRAPH[m]) if not t.startswith("throughputlab.records")
           and not with_parents(t) <= LEAVES]
    bad += [f"leaf {m} imports {t}" for m in sorted(LEAVES) for t in sorted(GRAPH[m]) if t not in LEAVES]
    assert not bad, bad
