"""NCCL's own forensics, wired up for every rank: PyTorch's NCCL flight recorder (a ring of the last collectives,
dumped per rank when a collective times out) written into the run directory, and the answer of NCCL's RAS
client ``ncclras`` (NCCL >= 2.24) kept with a capture."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

TRACE_BUFFER_SIZE = "2000"
"""Collectives each rank keeps in its flight recorder (PyTorch's default, 0, turns it off)."""
DUMP_PREFIX = "nccl_trace_rank_"
"""PyTorch appends the global rank: ``<run dir>/nccl_trace_rank_<N>``."""
RAS_TIMEOUT = 15.0
RENAMED_IN = (2, 10)
"""PyTorch versions from this one read TORCH_FR_BUFFER_SIZE / TORCH_FR_DUMP_TEMP_FILE and warn, on every rank,
about the TORCH_NCCL_ names they replace (older ones read only those)."""
NAMES = {"buffer": ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"),
         "file": ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")}


def torch_version(search: list[str] | None = None) -> tuple[int, int] | None:
    """The installed PyTorch's (major, minor), read from ``torch/version.py`` without importing torch."""
    try:
        spec = importlib.util.find_spec("torch") if search is None else \
            importlib.machinery.PathFinder.find_spec("torch", search)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        try:
            text = (Path(location) / "version.py").read_text()
        except OSError:
            continue
        if found := re.search(r"__version__\s*=\s*['\"](\d+)\.(\d+)", text):
            return int(found[1]), int(found[2])
    return None


def flight_recorder_env(environ: Mapping[str, str], run_dir: Path | None,
                        torch: tuple[int, int] | None = None) -> dict[str, str]:
    """The variables that turn the flight recorder on and dump it into ``run_dir`` on a timeout, under the names
    the ``torch`` version reads; nothing is added to what the user set under either name."""
    new = torch is not None and torch >= RENAMED_IN
    names = {what: pair[1] if new else pair[0] for what, pair in NAMES.items()}
    wanted = {names["buffer"]: TRACE_BUFFER_SIZE, "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    if run_dir is not None:
        wanted[names["file"]] = str(run_dir.absolute() / DUMP_PREFIX)
    taken = {name for pair in NAMES.values() if any(n in environ for n in pair) for name in pair}
    return {name: value for name, value in wanted.items() if name not in environ and name not in taken}


def flight_dumps(run_dir: Path, environ: Mapping[str, str] | None = None) -> list[Path]:
    """The flight recorder dumps the ranks wrote: under ``run_dir``, or where the user's
    ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` (``TORCH_FR_DUMP_TEMP_FILE``) pointed them."""
    given = [(environ or {}).get(name) for name in NAMES["file"]]
    prefix = Path(next((value for value in given if value), None) or run_dir / DUMP_PREFIX)
    if not prefix.parent.is_dir():
        return []
    found = [path for path in prefix.parent.glob(f"{prefix.name}*") if path.name[len(prefix.name):].isdigit()]
    return sorted(found, key=lambda path: int(path.name[len(prefix.name):]))


def keep_ras_answer(destination: Path, ncclras: str = "ncclras") -> Path | None:
    """Run ``ncclras`` (where NCCL >= 2.24 installed it) and keep its answer, stderr included, in
    ``destination``/ncclras.txt; None where it does not exist."""
    program = shutil.which(ncclras)
    if program is None:
        return None
    try:
        done = subprocess.run([program], capture_output=True, text=True, timeout=RAS_TIMEOUT, check=False)
        text = done.stdout + done.stderr + (f"\n(ncclras exit status {done.returncode})\n" if done.returncode else "")
    except subprocess.TimeoutExpired:
        text = f"ncclras gave no answer within {RAS_TIMEOUT:g}s\n"
    destination.mkdir(parents=True, exist_ok=True)
    kept = destination / "ncclras.txt"
    kept.write_text(text)
    return kept
