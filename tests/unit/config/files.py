"""Cluster files for the config tests: seed texts to edit, where a snippet stands, and loading as mlenv does."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlenv.config import Cluster
from mlenv.core.clusters import load_cluster
from mlenv.errors import ConfigError

ROOT = Path(__file__).resolve().parents[3]
BARCELONA = (ROOT / "tests/fixtures/clusters/original-barcelona.yaml").read_text()
"""An openshift cluster file written as the original toolkit wrote them."""
LOCAL = (ROOT / "clusters/local.yaml").read_text()
"""The local backend's cluster file."""


def position(text: str, snippet: str) -> str:
    """'line:col' where ``snippet`` starts in ``text``."""
    offset = text.index(snippet)
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"{line}:{col}"


def edited(base: str, *replacements: tuple[str, str]) -> str:
    """``base`` with each (old, new) replaced once; every ``old`` must be there."""
    for old, new in replacements:
        assert old in base, old
        base = base.replace(old, new, 1)
    return base


def loaded(path: Path, text: str) -> Cluster:
    """Write ``text`` to ``path`` and load it as every mlenv command does."""
    path.write_text(text)
    return load_cluster(str(path))


def problems(path: Path, text: str | bytes) -> list[str]:
    """The lines mlenv prints (after ``error: ``) for the bad file ``text``, checking it is bad input (exit 2)."""
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as caught:
        load_cluster(str(path))
    assert caught.value.exit_code == 2
    return str(caught.value).splitlines()
