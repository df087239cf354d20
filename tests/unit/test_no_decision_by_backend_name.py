"""Outside backends/, no code decides by a backend's name: it asks the registry what the backend declares."""

from __future__ import annotations

import ast
from pathlib import Path

from mlenv.core.registry import BACKENDS

PACKAGE = Path(__file__).resolve().parents[2] / "tools" / "mlenv"


def _comparisons_with_a_backend_name(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            constants = [c.value for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)]
            found += [f"{path.relative_to(PACKAGE)}:{node.lineno}: {value!r}" for value in constants
                      if value in BACKENDS]
    return found


def test_no_comparison_with_a_backend_name_outside_backends() -> None:
    modules = [path for path in PACKAGE.rglob("*.py") if PACKAGE / "backends" not in path.parents]
    assert len(modules) > 40
    assert [hit for path in modules for hit in _comparisons_with_a_backend_name(path)] == []
