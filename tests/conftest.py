"""Shared fixtures (the project root, a project home, a runner for the real `mlenv` command) and the test tiers:
each test is marked by what it needs (tests/tiers.py)."""

from __future__ import annotations

import os
import subprocess
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import tiers
from tests.helpers import ROOT
from tests.helpers import run_mlenv as run


def pytest_configure(config: pytest.Config) -> None:
    """On an xdist worker, forget the 80x24 terminal that execnet gives it ($COLUMNS, $LINES): a table that the
    `mlenv` command prints to a pipe is then as wide as in a serial run, not cut to 80 columns."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)


def pytest_itemcollected(item: pytest.Item) -> None:
    """Each test in its module's xdist group (:func:`tiers.group`)."""
    tiers.group(item)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by what it and its fixtures need (tests/tiers.py), so that ``-m`` picks a tier; keep the
    tests of this run's phase (:func:`tiers.in_phase`); then order them for xdist's workers
    (:func:`tiers.schedule`)."""
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
    phase = os.environ.get("TEST_PHASE", "")
    left = [item for item in items if not tiers.in_phase(item, phase)]
    if left:
        config.hook.pytest_deselected(items=left)
    items[:] = tiers.schedule([item for item in items if tiers.in_phase(item, phase)])


class TierTimes:
    """Seconds spent per tier (setup, call and teardown of every test), for the summary ``make test`` ends with.
    Fed by every report, those of xdist's workers included; a test of several tiers counts in each."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.tests: defaultdict[str, set[str]] = defaultdict(set)

    def add(self, report: pytest.TestReport) -> None:
        for tier in sorted(tiers.TIERS & set(report.keywords)) or [tiers.FAST]:
            self.seconds[tier] += report.duration
            self.tests[tier].add(report.nodeid)

    def lines(self) -> list[str]:
        rows = sorted(self.seconds.items(), key=lambda row: -row[1])
        return [f"{tier:<10} {len(self.tests[tier]):>6} {seconds:>10.1f}" for tier, seconds in rows]


TIER_TIMES = TierTimes()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    TIER_TIMES.add(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The time per tier (``--durations`` lists the slowest tests)."""
    if TIER_TIMES.seconds:
        terminalreporter.section("seconds per tier (a test in several tiers counts in each)")
        terminalreporter.write_line(f"{'tier':<10} {'tests':>6} {'seconds':>10}")
        for line in TIER_TIMES.lines():
            terminalreporter.write_line(line)


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
