"""Timing helpers shared by the benchmarks: medians of repeated wall-clock runs of real commands."""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def wall_time(action: Callable[[], object]) -> float:
    """Seconds one call of ``action`` takes."""
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def median_time(action: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    """Median wall time of ``repeat`` calls after ``warmup`` unmeasured ones."""
    for _ in range(warmup):
        action()
    return statistics.median(wall_time(action) for _ in range(repeat))


def command(argv: Sequence[str], env: dict[str, str] | None = None) -> Callable[[], object]:
    """An action that runs ``argv`` from the project root and checks it succeeded."""

    def run() -> object:
        return subprocess.run(list(argv), cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})

    return run


def row(name: str, value: float, reference: float, reference_name: str) -> dict[str, object]:
    """One result row: the measured value and its ratio to the reference run."""
    return {"name": name, "value": round(value * 1000, 1), "unit": "ms", "ratio": round(value / reference, 2),
            "reference": reference_name}
