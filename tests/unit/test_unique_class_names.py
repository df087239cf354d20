"""Every class in tools/mlenv has a name of its own: a name says one thing (issue 40)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import mlenv

PACKAGE = Path(mlenv.__file__).parent


def test_no_two_classes_share_a_name() -> None:
    where: defaultdict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert {name: places for name, places in where.items() if len(places) > 1} == {}
