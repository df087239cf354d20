"""The nodes' control channel of a detached run on a local cluster (processes, 2 nodes x 2 ranks): a second launch
while the run is live is refused and the run goes on to succeed; a stranger on every port the run listens on,
saying hello and asking for a stop or reporting a failure, and one holding a connection open, change nothing; the
run's control secret is in no file, no command line, no dry run. A run started under ``ulimit -n 1024`` outlives a
stranger that never says hello (closed within the deadline), a replayed and an altered line of a connection that
proved the secret (each closes that connection, never obeyed), and a flood of 1100 connections held open (node 0
keeps at most UNPROVEN_LIMIT of them), and succeeds."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import selectors
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlenv.runtime.supervise.control import ControlChannel
from mlenv.runtime.supervise.door import HELLO_SECONDS, UNPROVEN_LIMIT
from mlenv.runtime.supervise.proofs import SECRET_VARIABLE

from tests.integration.local_cluster import LocalProject, leftovers, make_project, require_local
from tests.unit.runtime.test_control_attempts import FORGED, forge, pump

# No torch: every rank says it waits, then waits for the file named by argv[1]; then it succeeds.
GATED_JOB = """\
import os, sys, time
print(f"rank {os.environ['RANK']} waiting", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.2)
print(f"rank {os.environ['RANK']} done", flush=True)
"""
SECRET = SECRET_VARIABLE


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    """A deployed 2 x 2 local cluster (processes) holding gated.py."""
    require_local("processes")
    made = make_project(tmp_path_factory.mktemp("ctl"), "lctl", "10.77.71.0/24", "processes")
    made.ok("deploy", made.name)
    made.ok("sync", "--source", str(made.source({"gated.py": GATED_JOB})))
    yield made
    made.mlenv("stop", timeout=120)
    made.mlenv("clean", "--cluster", made.name, "--delete-data", "--yes")


def latest(project: LocalProject) -> dict[str, Any]:
    return json.loads(project.ok("status", "--json").stdout)["latest_run"] or {}


def environ(pid: str) -> dict[str, str]:
    try:
        entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return {}
    return dict(entry.decode(errors="replace").partition("=")[::2] for entry in entries if b"=" in entry)


def run_processes(project: LocalProject) -> list[str]:
    return [item.split()[1] for item in leftovers(project) if item.startswith("process")]


def listening_ports(pids: list[str]) -> set[int]:
    """The TCP ports the processes ``pids`` listen on (their sockets' inodes in /proc/net/tcp and tcp6)."""
    inodes = set()
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        inodes |= {link[len("socket:["):-1] for link in links if link.startswith("socket:[")}
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def wait_for_lines(project: LocalProject, *texts: str, seconds: float = 180) -> str:
    deadline = time.monotonic() + seconds
    while not all(text in (logs := project.ok("logs", timeout=60).stdout) for text in texts):
        assert time.monotonic() < deadline, logs
        time.sleep(1)
    return logs


def test_a_live_run_is_left_alone_by_a_second_launch_and_by_strangers(project: LocalProject, tmp_path: Path) -> None:
    gate = tmp_path / "go"
    project.ok("launch", "--launcher", "torchrun", "--detach", "gated.py", str(gate), timeout=120)
    run_id = json.loads(project.ok("status", "--json").stdout)["runs"][-1]["id"]
    wait_for_lines(project, *(f"rank {rank} waiting" for rank in range(4)))

    second = project.mlenv("launch", "--launcher", "torchrun", "gated.py", str(gate), timeout=120)
    assert second.returncode == 2, second.stdout + second.stderr
    (line,) = second.stderr.strip().splitlines()
    assert run_id in line and "mlenv stop" in line, line
    assert len(json.loads(project.ok("status", "--json").stdout)["runs"]) == 1  # nothing of the second one started

    pids = run_processes(project)
    ports = listening_ports(pids)
    assert ports, pids
    held = []
    for port in sorted(ports):  # a stranger on every port: hello, a stop, a failure; and a connection held open
        with socket.create_connection(("127.0.0.1", port), timeout=10) as stranger:
            stranger.sendall(b'{"hello":1,"attempt":0}\n{"stop":"forged","exit_code":143}\n'
                             b'{"failure":{"rank":3,"node":1,"exit_code":9},"ended":0}\n')
        held.append(socket.create_connection(("127.0.0.1", port), timeout=10))

    secrets = {value for pid in pids if (value := environ(pid).get(SECRET))}
    assert len(secrets) == 1, secrets  # one secret for the run, on every node
    (secret,) = secrets
    assert len(secret) >= 32
    shown = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert secret not in shown
    for root in (project.home, tmp_path):
        for path in (p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
            if secret.encode() in path.read_bytes():
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    dry = project.ok("launch", "--launcher", "torchrun", "--dry-run", "gated.py", str(gate))
    assert secret not in dry.stdout + dry.stderr

    try:
        gate.write_text("go\n")
        deadline = time.monotonic() + 180
        while (run := latest(project)).get("state") != "succeeded":  # held connections do not keep it running
            assert time.monotonic() < deadline and run.get("state") in ("running", "succeeded"), run
            time.sleep(1)
    finally:
        for connection in held:
            connection.close()
    assert run["id"] == run_id and run["first_failure"] is None, run
    assert sorted((rank["rank"], rank["state"], rank["exit_code"]) for rank in run["ranks"]) == [
        (rank, "succeeded", 0) for rank in range(4)], run
    assert json.loads(project.ok("nodes", "--json").stdout)["excluded"] == []
    logs = project.ok("logs", timeout=60).stdout
    assert "dropped a control connection from 127.0.0.1: bad secret (said once)" in logs, logs
    assert "forged" not in logs and "stopping the job" not in logs, logs
    assert run_processes(project) == []


@contextlib.contextmanager
def descriptors(limit: int) -> Iterator[None]:
    """This process, and what it starts meanwhile, may open ``limit`` descriptors (``ulimit -n``)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def node_0(project: LocalProject) -> tuple[str, int]:
    """Node 0's supervisor (its pid) and the control port it listens on (MASTER_PORT + 1)."""
    for pid in run_processes(project):
        env = environ(pid)
        if env.get("MLENV_NODE_RANK") == "0" and int(env.get("MASTER_PORT", "-2")) + 1 in listening_ports([pid]):
            return pid, int(env["MASTER_PORT"]) + 1
    raise AssertionError("no process of node 0 listens on the control port")


def descriptors_of(pid: str) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_run_under_1024_descriptors_outlives_a_flood_forged_lines_and_silent_strangers(
        project: LocalProject, tmp_path: Path) -> None:
    gate = tmp_path / "go"
    with descriptors(1024):
        project.ok("launch", "--launcher", "torchrun", "--detach", "gated.py", str(gate), timeout=120)
    run_id = json.loads(project.ok("status", "--json").stdout)["runs"][-1]["id"]
    wait_for_lines(project, *(f"rank {rank} waiting" for rank in range(4)))
    pid, port = node_0(project)
    assert re.search(r"^Max open files\s+1024\s", Path(f"/proc/{pid}/limits").read_text(), re.MULTILINE)

    with socket.create_connection(("127.0.0.1", port), timeout=10) as silent, silent.makefile("rb") as lines:
        assert b'"challenge"' in lines.readline()
        started = time.monotonic()
        assert lines.readline() == b""  # closed by node 0: it never said hello
        assert time.monotonic() - started < HELLO_SECONDS + 2

    stops: list[Any] = []
    for how in sorted(FORGED):  # a connection that proved the secret (said its job ended: no lost node) forges
        fake = ControlChannel(1, 2, "127.0.0.1", port, lambda *stop: stops.append(stop), print,
                              selectors.DefaultSelector(), run_id=run_id, secret=environ(pid)[SECRET])
        fake.open()
        pump([fake], lambda fake=fake: fake.connected)
        fake.done()
        forge(fake, how)
        pump([fake], lambda fake=fake: fake.upstream is None)  # node 0 closed it
        fake.close()
    assert stops == []

    before, flood, deadline = descriptors_of(pid), list[socket.socket](), time.monotonic() + 60
    while len(flood) < 1100 and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            flood.append(socket.create_connection(("127.0.0.1", port), timeout=2))
    during = descriptors_of(pid)
    for connection in flood:
        connection.close()
    assert len(flood) > 1024 and during <= before + UNPROVEN_LIMIT + 2, (len(flood), before, during)

    gate.write_text("go\n")
    deadline = time.monotonic() + 180
    while (run := latest(project)).get("state") != "succeeded":
        assert time.monotonic() < deadline and run.get("state") in ("running", "succeeded"), run
        time.sleep(1)
    assert run["id"] == run_id and run["first_failure"] is None, run
    assert sorted((rank["rank"], rank["state"], rank["exit_code"]) for rank in run["ranks"]) == [
        (rank, "succeeded", 0) for rank in range(4)], run
    logs = project.ok("logs", timeout=60).stdout
    for words in (f"more than {UNPROVEN_LIMIT} control connections waiting to prove the run's secret: dropping the "
                  "oldest first (said once)",
                  f"dropped a control connection from 127.0.0.1: no answer to its challenge in {HELLO_SECONDS:g} s "
                  "(said once)"):
        assert logs.count(words) == 1, logs
    for words in FORGED.values():
        assert f"dropped a control message from 127.0.0.1: {words}" in logs, logs
    assert "forged" not in logs and "Traceback" not in logs and "stopping the job" not in logs, logs
