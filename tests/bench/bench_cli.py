"""`mlenv render barcelona --mode rdma` and `mlenv --help` against bare `python -c pass` (median of 15)."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.bench.timing import command, median_time, row

REPEAT = 15


def run() -> list[dict[str, object]]:
    """Aim: render <= 2.0x, help <= 1.3x of a bare interpreter start."""
    mlenv = str(Path(sys.executable).parent / "mlenv")
    bare = median_time(command([sys.executable, "-c", "pass"]), REPEAT)
    render = median_time(command([mlenv, "render", "barcelona", "--mode", "rdma"]), REPEAT)
    help_ = median_time(command([mlenv, "--help"]), REPEAT)
    return [
        row("python -c pass", bare, bare, "python -c pass"),
        row("mlenv render barcelona --mode rdma", render, bare, "python -c pass"),
        row("mlenv --help", help_, bare, "python -c pass"),
    ]
