"""What a user sees of a local cluster at a terminal and through pipes: `status` fits any terminal width from 60
columns (one line per pod, every header whole, colour unless NO_COLOR), and a command whose reader goes away
(`mlenv logs | head -1`) ends quietly with exit 0."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
from collections.abc import Iterator

import pytest

from tests.helpers import MLENV, assert_shaped, documented_shape
from tests.integration.local_cluster import TINY_JOB, LocalProject, make_project, require_local

HEADERS = ["POD", "NODE", "PHASE", "READY", "RESTARTS", "GPUS", "IP", "RDMA", "JOBS", "MODE", "NIC"]
ESCAPES = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    """A deployed 2-node local cluster (pods as processes) that ran one job."""
    require_local("processes")
    home = tmp_path_factory.mktemp("out")
    deployed = make_project(home, "out", "10.77.61.0/24", "processes")
    deployed.ok("deploy", deployed.name)
    deployed.ok("sync", "--source", str(deployed.source({"tiny.py": TINY_JOB})))
    deployed.ok("launch", "--launcher", "torchrun", "tiny.py", timeout=90)
    yield deployed
    deployed.mlenv("clean", "--delete-data", "--yes")


def _at_terminal(project: LocalProject, columns: int, *args: str, no_color: bool = False) -> str:
    """What ``mlenv ARGS`` writes to a terminal ``columns`` wide (a pseudo-terminal; no $COLUMNS)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR")}
    env |= {"MLENV_HOME": str(project.home), **({"NO_COLOR": "1"} if no_color else {})}
    with subprocess.Popen([str(MLENV), *args], stdout=follower, stderr=subprocess.PIPE, env=env) as process:
        os.close(follower)
        out = bytearray()
        while True:
            select.select([leader], [], [], 60)
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # the terminal's other end closed: the command ended
                break
            if not chunk:
                break
            out += chunk
        os.close(leader)
        assert process.wait(timeout=60) == 0, process.stderr.read() if process.stderr else ""
    return out.decode().replace("\r\n", "\n")


@pytest.mark.parametrize("columns", [60, 80, 100, 120])
def test_status_fits_the_terminal(project: LocalProject, columns: int) -> None:
    shown = _at_terminal(project, columns, "status")
    lines = ESCAPES.sub("", shown).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("POD"))
    assert re.split(r"\s*┃\s*", lines[head].strip()) == HEADERS, shown
    rows = lines[head + 2:]
    assert [row[:4] for row in rows[:3]] == ["out-", "out-", "late"], shown  # one line per pod, then the run
    assert all(len(line) <= columns for line in lines[:head + 4]), shown
    if columns >= 80:
        assert [row.split("│")[0].strip() for row in rows[:2]] == [f"{project.app}-0", f"{project.app}-1"]
    assert "\x1b[32mRunn" in shown  # a state in colour at a terminal


def test_no_color_is_honoured(project: LocalProject) -> None:
    shown = _at_terminal(project, 100, "status", no_color=True)
    assert "\x1b[" not in shown and "Running" in shown


def _closed_reader(project: LocalProject, *args: str, reader: list[str] | None = None) -> tuple[int, str]:
    """Exit code and stderr of ``mlenv ARGS | READER`` (real processes and a real pipe; default: a pipe nobody
    reads any more); the test fails when mlenv goes on after its reader has gone."""
    env = {**os.environ, "MLENV_HOME": str(project.home)}
    read, write = os.pipe()
    if reader is None:
        os.close(read)
    writer = subprocess.Popen([str(MLENV), *args], stdout=write, stderr=subprocess.PIPE, env=env,
                              start_new_session=True)
    os.close(write)
    try:
        if reader is not None:
            subprocess.run(reader, stdin=read, stdout=subprocess.DEVNULL, check=True, timeout=120)
            os.close(read)
        _, errors = writer.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(writer.pid, signal.SIGKILL)
        writer.communicate()
        pytest.fail(f"mlenv {' '.join(args)} went on after its reader had gone")
    return writer.returncode, errors.decode()


def test_logs_piped_to_head_ends_quietly(project: LocalProject) -> None:
    assert _closed_reader(project, "logs", reader=["head", "-1"]) == (0, "")
    assert _closed_reader(project, "logs") == (0, "")
    assert _closed_reader(project, "status") == (0, "")


def test_an_endless_command_stops_when_its_reader_goes(project: LocalProject) -> None:
    assert _closed_reader(project, "exec", "--", "yes", reader=["head", "-1"]) == (0, "")
    assert [p["extra"]["jobs"] for p in project.status()] == [0, 0]  # no `yes` left on a node


def test_status_json_is_as_documented(project: LocalProject) -> None:
    report = json.loads(project.ok("status", "--json").stdout)
    assert_shaped(report, documented_shape("status"), optional=frozenset({"error", "gpu_state"}))
    assert [pod["extra"]["jobs"] for pod in report["pods"]] == [0, 0]  # a count is a number
