"""Shared fixtures (the project root, a project home, a runner for the real `mlenv` command) and the test tiers:
each test is marked by what it needs (tests/tiers.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import tiers
from tests.helpers import ROOT
from tests.helpers import run_mlenv as run


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by what it and its fixtures need (tests/tiers.py), so that ``-m`` picks a tier."""
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        definitions = item._fixtureinfo.name2fixturedefs
        fixtures = [definition.func for name in item.fixturenames for definition in definitions.get(name, ())]

        def fixture(name: str, item: pytest.Function = item) -> list[Callable[..., object]]:
            return [definition.func for definition in item.session._fixturemanager.getfixturedefs(name, item) or ()]

        params = item.callspec.params.values() if hasattr(item, "callspec") else ()
        for name in sorted(tiers.markers(item.function, fixtures, fixture, params)):
            item.add_marker(name)


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
    return run
