"""Fixtures of the runtime tests: the fixture trees and a runner for ``python -m mlenv.runtime``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
from runtime_support import FIXTURES, Runner

from tests._prereq import clean_environ


@pytest.fixture
def fixtures() -> Path:
    """tests/fixtures: sysfs/, proc/ and nccl_logs/ trees."""
    return FIXTURES


@pytest.fixture
def run_runtime() -> Runner:
    """Run ``python -m mlenv.runtime ARGS`` in a clean world; ``env`` adds variables."""

    def run(*args: str, env: Mapping[str, str] | None = None, stdin: str | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mlenv.runtime", *args], env=clean_environ(env),
                              input=stdin, capture_output=True, text=True, timeout=timeout, check=False)

    return run
