"""What a user sees of a local cluster at a terminal and through pipes: `status` fits any terminal width from 60
columns (one line per pod, every header whole, colour unless NO_COLOR), a command whose reader goes away
(`mlenv logs | head -1`) ends quietly with exit 0, Ctrl-C during a launch says one line, and the JSON of deploy,
exec, stop, clean, sync, doctor and nodes is what docs/json.md shows."""

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
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import MLENV, assert_shaped, documented_shape, run_mlenv
from tests.integration.local_cluster import FAILING_JOB, TINY_JOB, LocalProject, make_project, require_local

HEADERS = ["POD", "NODE", "PHASE", "READY", "RESTARTS", "GPUS", "IP", "JOBS", "MODE", "NIC"]
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


def test_json_of_deploy_exec_sync_doctor_and_nodes_is_as_documented(project: LocalProject) -> None:
    deployed = json.loads(project.ok("deploy", project.name, "--json").stdout)  # again: it converges
    assert_shaped(deployed, documented_shape("deploy"))
    assert [(p["pod"], p["node"], p["ready"]) for p in deployed["pods"]] == [
        (f"{project.app}-{n}", n, True) for n in (0, 1)]
    ran = project.mlenv("exec", "--json", "--", "sh", "-c", "echo hi $MLENV_NODE_RANK; exit $MLENV_NODE_RANK")
    assert ran.returncode == 1, ran.stderr
    report = json.loads(ran.stdout)  # only JSON on stdout: the nodes' lines are in it, not before it
    assert_shaped(report, documented_shape("exec"))
    assert (report["ok"], report["exit_code"]) == (False, 1)
    assert [(n["node"], n["exit_code"], n["output"]) for n in report["nodes"]] == [(0, 0, ["hi 0"]), (1, 1, ["hi 1"])]
    killed = json.loads(project.mlenv("exec", "--json", "--pod", "1", "--", "sh", "-c", "kill -9 $$").stdout)
    assert [n["exit_code"] for n in killed["nodes"]] == [137], killed  # 128+N, as a shell says
    synced = project.mlenv("sync", "--json", "--delete", "--source", str(project.source({"new.txt": "x"})))
    assert_shaped(json.loads(synced.stdout), documented_shape("sync"))
    (project.home / "src" / "new.txt").unlink()
    deleted = project.ok("sync", "--delete", "--source", str(project.home / "src"))
    assert f"deleted on node-1 ({project.app}-1): new.txt" in deleted.stderr
    assert "node-0: up to date, ok" in project.ok("sync", "--source", str(project.home / "src")).stderr
    checked = json.loads(project.ok("doctor", "--json").stdout)
    assert_shaped(checked, documented_shape("doctor"))
    assert (checked["ok"], checked["verdict"]) == (True, "PASS") or checked["verdict"] == "WARN", checked
    assert_shaped(json.loads(project.ok("nodes", "--json").stdout), documented_shape("nodes"))


def _launched(project: LocalProject, *args: str) -> tuple[subprocess.Popen[bytes], bytes]:
    """``mlenv launch ARGS`` in a session of its own (as a terminal's foreground job), and its stdout up to the line
    of every rank that sleeps."""
    launch = subprocess.Popen([str(MLENV), "launch", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "MLENV_HOME": str(project.home)}, start_new_session=True)
    assert launch.stdout is not None
    seen = b""
    while seen.count(b"] sleeping") < 4:
        assert select.select([launch.stdout], [], [], 90)[0] and launch.poll() is None, seen
        seen += os.read(launch.stdout.fileno(), 1 << 16)
    return launch, seen


def test_ctrl_c_during_a_launch_says_one_line(project: LocalProject) -> None:
    project.ok("sync", "--source", str(project.source({"sleepy.py": FAILING_JOB})))
    launch, seen = _launched(project, "--launcher", "torchrun", "sleepy.py")
    os.killpg(launch.pid, signal.SIGINT)  # what Ctrl-C sends the foreground job
    rest, said = launch.communicate(timeout=60)
    assert launch.returncode == 130, said
    shown = (seen + rest).decode()
    assert "OMP_NUM_THREADS" in shown and not re.search(r"^(\[node-\d\]) \1", shown, re.MULTILINE), shown  # one tag
    assert "Traceback" not in shown and "SIGTERM" not in shown, shown  # the launchers' teardown: in the logs
    (last,) = said.decode().splitlines()[-1:]
    assert last.startswith("error: interrupted: every node stopped; logs in "), said
    run_dir = last.rsplit(" ", 1)[1]
    assert "SignalException" in "".join(p.read_text() for p in Path(run_dir).glob("node-*.log"))


def test_stop_json_says_what_each_node_stopped(project: LocalProject) -> None:
    project.ok("sync", "--source", str(project.source({"sleepy.py": FAILING_JOB})))
    project.ok("launch", "--detach", "--launcher", "torchrun", "sleepy.py")
    _until(lambda: project.mlenv("logs").stdout.count("] sleeping") == 4)  # every rank runs
    stopped = project.ok("stop", "--json")
    report = json.loads(stopped.stdout)
    assert_shaped(report, documented_shape("stop"))
    assert report["ok"] and [n["node"] for n in report["nodes"]] == [0, 1], report
    assert all(any(line.startswith("stopped") for line in n["output"]) for n in report["nodes"]), report
    again = json.loads(project.ok("stop", "--json").stdout)
    assert all("nothing to stop" in " ".join(n["output"]) for n in again["nodes"]), again


def _until(condition: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def test_clean_json_twice(tmp_path: Path) -> None:
    require_local("processes")
    once = make_project(tmp_path, "cj", "10.77.62.0/24", "processes")
    once.ok("deploy", once.name)
    first = json.loads(once.ok("clean", "--json").stdout)
    assert_shaped(first, documented_shape("clean"))
    assert (first["name"], first["cleaned"], first["data_deleted"]) == ("cj", True, False)
    second = json.loads(once.ok("clean", "--json").stdout)  # nothing current any more: fine
    assert (second["ok"], second["name"], second["cleaned"]) == (True, None, False)
    once.ok("clean", "--cluster", once.name, "--delete-data", "--yes")


def test_a_missing_script_is_bad_input_before_anything_starts(project: LocalProject) -> None:
    runs = sorted((project.home / "runs").iterdir())
    recorded = [run["id"] for run in json.loads(project.ok("status", "--json").stdout)["runs"]]
    missing = project.mlenv("launch", "nowhere.py")
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr == (f"error: nowhere.py: no such file in the workspace of node-0 ({project.app}-0), node-1 "
                              f"({project.app}-1): mlenv sync copies workspace/ (or --source DIR) to the nodes\n")
    (project.home / "workspace").mkdir(exist_ok=True)
    (project.home / "workspace" / "unsynced.py").write_text("print('hi')\n")
    unsynced = project.mlenv("launch", "unsynced.py")
    assert unsynced.returncode == 2 and "not synced yet: mlenv sync copies workspace/" in unsynced.stderr
    assert sorted((project.home / "runs").iterdir()) == runs  # no run directory
    assert [run["id"] for run in json.loads(project.ok("status", "--json").stdout)["runs"]] == recorded  # none new


def test_a_shell_with_piped_input_runs_it_without_job_control(project: LocalProject) -> None:
    piped = run_mlenv("shell", "--pod", "1", home=project.home, input='echo "$HOSTNAME $(pwd)"\nexit 3\n')
    assert piped.returncode == 3, piped.stderr
    assert piped.stdout == f"{project.app}-1 {project.pod_dir(1) / 'workspace'}\n"
    assert "job control" not in piped.stderr and "stdin is not a terminal" in piped.stderr
