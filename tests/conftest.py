"""Shared fixtures: the project root and a runner for the real `mlenv` command."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MLENV = Path(sys.executable).parent / "mlenv"


@pytest.fixture
def project_root() -> Path:
    """The checkout under test."""
    return ROOT


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An MLENV_HOME of the test's own (the real manifests, an empty clusters/), so state.json lands there."""
    home = tmp_path / "home"
    (home / "clusters").mkdir(parents=True)
    (home / "manifests").symlink_to(ROOT / "manifests")
    monkeypatch.setenv("MLENV_HOME", str(home))
    return home


@pytest.fixture
def run_mlenv(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the installed `mlenv` console script as a user would, from the project root."""

    def run(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(MLENV), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})}, check=False)

    return run
