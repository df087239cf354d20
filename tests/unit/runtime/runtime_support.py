"""Helpers shared by the runtime tests."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
Runner = Callable[..., subprocess.CompletedProcess[str]]
