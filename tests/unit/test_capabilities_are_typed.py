"""ops/ and the CLI ask a backend only through its typed capabilities (``mlenv.core.capabilities``): never by
probing an attribute (hasattr, getattr) or a class (isinstance of a backend or capability class)."""

from __future__ import annotations

import ast
from pathlib import Path

from mlenv.core import capabilities

PACKAGE = Path(__file__).resolve().parents[2] / "tools" / "mlenv"
CLASSES = {"FanoutJobs", "FanoutHooks", *(capability.protocol.__name__ for capability in capabilities.CAPABILITIES)}


def _probes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        named = [n.id if isinstance(n, ast.Name) else getattr(n, "attr", None) for n in ast.walk(node.args[-1])] \
            if node.func.id == "isinstance" and node.args else []
        if node.func.id in ("hasattr", "getattr") or CLASSES & set(named):
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_ops_and_the_cli_probe_no_backend_attribute_or_class() -> None:
    modules = [*(PACKAGE / "ops").rglob("*.py"), *(PACKAGE / "cli").glob("*.py")]
    assert len(modules) > 10
    assert [hit for path in modules for hit in _probes(path)] == []
