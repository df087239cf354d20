"""NCCL's own forensics, wired up for every rank: PyTorch's NCCL flight recorder (a ring of the last collectives,
dumped per rank when a collective times out) written into the run directory, and the answer of NCCL's RAS
client ``ncclras`` (NCCL >= 2.24) kept with a capture."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

TRACE_BUFFER_SIZE = "2000"
"""Collectives each rank keeps in its flight recorder (PyTorch's default, 0, turns it off)."""
DUMP_PREFIX = "nccl_trace_rank_"
"""PyTorch appends the global rank: ``<run dir>/nccl_trace_rank_<N>``."""
RAS_TIMEOUT = 15.0


def flight_recorder_env(environ: Mapping[str, str], run_dir: Path | None) -> dict[str, str]:
    """The variables that turn the flight recorder on and dump it into ``run_dir`` on a timeout; a variable the
    user set is left as it is (and nothing is added to it)."""
    wanted = {"TORCH_NCCL_TRACE_BUFFER_SIZE": TRACE_BUFFER_SIZE, "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    if run_dir is not None:
        wanted["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = str(run_dir.absolute() / DUMP_PREFIX)
    return {name: value for name, value in wanted.items() if name not in environ}


def flight_dumps(run_dir: Path, environ: Mapping[str, str] | None = None) -> list[Path]:
    """The flight recorder dumps the ranks wrote: under ``run_dir``, or where the user's
    ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` pointed them."""
    prefix = Path((environ or {}).get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or run_dir / DUMP_PREFIX)
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
