"""mlenv.runtime runs in any image: standard library only, no other mlenv module."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import mlenv.runtime
from mlenv.core.remote import runtime_files

PACKAGE = Path(mlenv.runtime.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Absolute module names a file imports (relative imports stay inside the package)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_imports_are_standard_library_or_the_runtime_itself() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 5
    foreign = {
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in files
        for name in imported_modules(path)
        if name.split(".")[0] not in sys.stdlib_module_names and not name.startswith("mlenv.runtime")
    }
    assert foreign == set()


def test_runs_as_shipped_to_pods_without_site_packages(tmp_path: Path) -> None:
    """Only the runtime's files, copied as shipping does (``runtime_files``), and no site-packages (python -S)."""
    for source, shipped in runtime_files():
        (tmp_path / shipped).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, tmp_path / shipped)
    env = {"PYTHONPATH": str(tmp_path), "MLENV_NODE_RANK": "0", "MLENV_NUM_NODES": "1"}
    for args in (["topology", "--json"], ["nccl-env", "--json"], ["launch", "--dry-run", "--", __file__]):
        result = subprocess.run([sys.executable, "-S", "-m", "mlenv.runtime", *args], env=env, cwd=tmp_path,
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
    code = "import sys, mlenv.runtime.cli; print(*{name.split('.')[0] for name in sys.modules})"
    loaded = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, check=True)
    assert set(loaded.stdout.split()) - set(sys.stdlib_module_names) == {"__main__", "mlenv"}
