"""Prerequisites of tests: tools (skip locally when missing, fail under CI=true) and a clean environment."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Mapping

import pytest

# Variables that describe a distributed-training world or steer NCCL/Gloo.
WORLD_PREFIXES = ("MLENV_", "SLURM_", "PET_", "NCCL_", "GLOO_", "PCIDEVICE_", "RUNAI_", "TORCHELASTIC_")
WORLD_NAMES = {"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK", "GROUP_WORLD_SIZE",
               "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "PYTHONUNBUFFERED"}


def require(*names: str) -> None:
    """Make sure each Python module or executable in ``names`` is available.

    Missing ones skip the test on a workstation but fail it when ``CI=true``, so CI never
    passes by skipping what it was meant to run.
    """
    missing = [name for name in names if not _importable(name) and shutil.which(name) is None]
    if not missing:
        return
    message = f"missing prerequisite(s): {', '.join(missing)}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a dotted name whose parent is missing, or not a module name
        return False


def clean_environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any training world inherited from the shell, plus ``extra``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(WORLD_PREFIXES) and k not in WORLD_NAMES}
    return {**base, **(extra or {})}
