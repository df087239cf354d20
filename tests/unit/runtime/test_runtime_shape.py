"""The runtime stays easy to see: no file over the line cap, sub-packages that hold only their one-line docstring,
and every one of them shipped to the nodes."""

from __future__ import annotations

import ast
from pathlib import Path

import mlenv.runtime
from mlenv.core.remote import runtime_files

PACKAGE = Path(mlenv.runtime.__file__).parent
MAX_LINES = 450


def test_no_runtime_file_is_over_the_cap() -> None:
    lengths = {path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines())
               for path in PACKAGE.rglob("*.py")}
    assert len(lengths) > 30
    assert {name: lines for name, lines in lengths.items() if lines > MAX_LINES} == {}


def test_each_sub_package_holds_a_one_line_docstring_and_nothing_else() -> None:
    packages = sorted(path for path in PACKAGE.glob("*/__init__.py"))
    assert len(packages) >= 6
    for path in packages:
        module = ast.parse(path.read_text())
        docstring = ast.get_docstring(module)
        assert len(module.body) == 1 and docstring is not None and "\n" not in docstring, path


def test_shipping_carries_every_runtime_file() -> None:
    shipped = {name for _, name in runtime_files()}
    here = {f"mlenv/runtime/{path.relative_to(PACKAGE).as_posix()}" for path in PACKAGE.rglob("*.py")
            if "__pycache__" not in path.parts}
    assert here <= shipped and "mlenv/runtime/site/sitecustomize.py" in shipped and "mlenv/__init__.py" in shipped
