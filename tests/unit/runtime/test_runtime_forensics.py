"""NCCL's forensics wired up by the runtime: the flight recorder's variables reach every rank of a real launch
(unless the user set them), its dumps are found in the run directory, and ``ncclras``'s answer is kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlenv.runtime.forensics.flightrecorder import (
    DUMP_PREFIX,
    flight_dumps,
    flight_recorder_env,
    keep_ras_answer,
    torch_version,
)
from runtime_support import Runner

from tests._prereq import require

NODE0 = {"MLENV_NODE_RANK": "0", "MLENV_NUM_NODES": "1", "MLENV_PROCS_PER_NODE": "2", "MASTER_ADDR": "127.0.0.1",
         "OMP_NUM_THREADS": "1"}
SHOW = """\
import os
print("rank", os.environ["RANK"], *(f"{name}={os.environ.get(name)}" for name in
      ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE")), flush=True)
"""


def test_the_names_the_torch_version_reads_and_the_user_keeps_what_they_set(tmp_path: Path) -> None:
    assert flight_recorder_env({}, tmp_path, (2, 4)) == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{tmp_path}/{DUMP_PREFIX}"}
    assert flight_recorder_env({}, None, (2, 13)) == {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    user = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0", "TORCH_FR_DUMP_TEMP_FILE": "/x/t_"}
    assert flight_recorder_env(user, tmp_path, (2, 13)) == flight_recorder_env(user, tmp_path, None) == {
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}


def test_the_torch_version_is_read_without_importing_torch(tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise SystemExit('imported')\n")
    (tmp_path / "torch" / "version.py").write_text("__version__ = '2.9.1+cu128'\n")
    assert torch_version([str(tmp_path)]) == (2, 9)
    assert torch_version([str(tmp_path / "nothing")]) is None


def test_every_rank_of_a_real_launch_gets_the_flight_recorder(run_runtime: Runner, tmp_path: Path) -> None:
    require("torch")
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    port = str(29000 + os.getpid() % 1000)
    result = run_runtime("launch", "--run-dir", str(tmp_path / "run"), "--", str(script),
                         env={**NODE0, "MASTER_PORT": port, "MLENV_RUN_ID": "fr", "TORCH_NCCL_TRACE_BUFFER_SIZE": "64",
                              "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])},
                         timeout=180)
    assert result.returncode == 0, result.stderr
    shown = sorted(line.partition("rank ")[2] for line in result.stdout.splitlines() if "TORCH_NCCL_" in line)
    prefix = f"{tmp_path / 'run' / 'attempt-0' / 'node0'}/{DUMP_PREFIX}"  # this node's directory of the run
    assert torch_version() == (2, 13)  # the pinned torch reads the TORCH_FR_ names
    assert shown == [f"{rank} TORCH_NCCL_TRACE_BUFFER_SIZE=64 TORCH_NCCL_DUMP_ON_TIMEOUT=1 "
                     f"TORCH_FR_DUMP_TEMP_FILE={prefix}" for rank in (0, 1)]


def test_dumps_are_found_where_the_ranks_wrote_them(tmp_path: Path) -> None:
    for name in (f"{DUMP_PREFIX}10", f"{DUMP_PREFIX}2", f"{DUMP_PREFIX}x", "other"):
        (tmp_path / name).write_bytes(b"\x80\x04pickle")
    assert [p.name for p in flight_dumps(tmp_path)] == [f"{DUMP_PREFIX}2", f"{DUMP_PREFIX}10"]
    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    (elsewhere / "fr_3").write_bytes(b"")
    assert flight_dumps(tmp_path, {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(elsewhere / "fr_")}) == [elsewhere / "fr_3"]


def test_ncclras_answer_is_kept_where_it_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    capture = tmp_path / "capture"
    assert keep_ras_answer(capture, ncclras="no-such-ncclras") is None and not capture.exists()
    tool = tmp_path / "bin" / "ncclras"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho 'Job summary'\necho '  Nodes  Processes  GPUs'\necho 'connection refused' >&2\n"
                    "exit 1\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    kept = keep_ras_answer(capture)
    assert kept == capture / "ncclras.txt"
    assert kept.read_text() == "Job summary\n  Nodes  Processes  GPUs\nconnection refused\n\n(ncclras exit status 1)\n"
    assert subprocess.run(["ncclras"], capture_output=True, check=False).returncode == 1
