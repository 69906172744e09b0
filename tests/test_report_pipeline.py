"""The report is a one-way pipeline, read from the source with ``ast``: profile_report.py (the
entry point) hands the profiles down to the section modules (figures, attention, tables), and
what those modules import from report/ are leaves (modules that import nothing from report/:
labels.py, plotting.py, page.py). So no section calls into another, and the flow never goes back
into a module it has left."""

from __future__ import annotations

import ast
from pathlib import Path

REPORT = Path(__file__).resolve().parent.parent / "throughputlab" / "report"
ENTRY = "profile_report"


def _report_imports(path: Path) -> set[str]:
    """The report/ modules ``path`` imports, anywhere in it."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["throughputlab", "report"] and len(parts) > 2 and (REPORT / f"{parts[2]}.py").exists():
                out.add(parts[2])
    out.discard(path.stem)
    return out


IMPORTS = {p.stem: _report_imports(p) for p in REPORT.glob("*.py") if p.stem != "__init__"}
LEAVES = {m for m, deps in IMPORTS.items() if not deps}


def test_sections_import_only_leaves():
    """A section module importing another section (or the entry) would send the flow back up."""
    back = {m: sorted(deps - LEAVES) for m, deps in IMPORTS.items() if m != ENTRY and deps - LEAVES}
    assert back == {}, f"report modules importing a non-leaf of report/: {back}"


def test_nothing_imports_the_entry():
    assert sorted(m for m, deps in IMPORTS.items() if ENTRY in deps) == []


def test_shared_helpers_are_leaves():
    assert {"labels", "plotting", "page"} <= LEAVES
