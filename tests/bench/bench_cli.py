"""Cold `mlenv render` of a cluster file whose content changes every run against a bare `python -c pass`, and
`mlenv --help` against `python -c "import click"`, the floor of any click CLI (medians of 15, runs taken in turns
so that a busy machine slows all of them alike). Nothing is replayed: every render loads, validates, plans, renders
and checks the objects again; only compiled validators and templates are kept on disk, as Python keeps .pyc
files."""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tests.bench.timing import ROOT, command, row, wall_time
from tests.helpers import MLENV

REPEAT = 15


def _changing_render(directory: Path, mlenv: str) -> Callable[[], object]:
    """Render barcelona (rdma) from a copy whose description changes before each run: a cold render of changed
    input, as users pay it after every edit."""
    source = (ROOT / "clusters" / "barcelona.yaml").read_text()
    path = directory / "barcelona-edited.yaml"
    runs = iter(range(1_000_000))

    def run() -> object:
        path.write_text(source.replace('description: "', f'description: "edit {next(runs)}: '))
        return command([mlenv, "render", str(path), "--mode", "rdma"])()

    return run


def run() -> list[dict[str, object]]:
    """Aim: render <= 10x a bare interpreter start; help <= 1.15x importing click."""
    mlenv = str(MLENV)
    with tempfile.TemporaryDirectory(prefix="mlenv-bench-") as directory:
        actions = [command([sys.executable, "-c", "pass"]), _changing_render(Path(directory), mlenv),
                   command([sys.executable, "-c", "import click"]), command([mlenv, "--help"])]
        for action in actions:  # warm-up: bytecode, compiled validators and templates on disk
            action()
        times: list[list[float]] = [[] for _ in actions]
        for _ in range(REPEAT):
            for measured, action in zip(times, actions, strict=True):
                measured.append(wall_time(action))
    bare, render, click, help_ = (statistics.median(measured) for measured in times)
    return [
        row("python -c pass", bare, bare, "python -c pass"),
        row("mlenv render barcelona --mode rdma (changed file)", render, bare, "python -c pass"),
        row('python -c "import click"', click, click, 'python -c "import click"'),
        row("mlenv --help", help_, click, 'python -c "import click"'),
    ]
