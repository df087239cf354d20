"""A run's end ends every process its ranks started, however they detached: a double-forked ``setsid`` daemon, a
child started with ``env -i`` (which the job's MLENV_JOB marker cannot find). The runtime runs for real (torchrun,
one node of two ranks), its supervisor in a cgroup of its own (runtime/supervise/reaping.py), also in a network
namespace, whose own /sys shows no cgroup until the supervisor mounts one, as the local backend's pods run. What a
supervisor killed outright leaves in the temporary directory goes with the next supervisor's start."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlenv.runtime.records.runlayout import NodeDir, read_state
from mlenv.runtime.supervise import reaping
from mlenv.runtime.supervise.tempdirs import MARK

from tests._prereq import require
from tests.integration.test_runtime_launch import (
    WORKSPACE,
    detached_env,
    job_processes,
    runtime,
    start_detached,
    wait_for_line,
)

# LOCAL_RANK 0 leaves a double-forked setsid daemon, LOCAL_RANK 1 a child with an empty environment; each writes
# "<pid> <start ticks>" of what it left to OUT/<rank>. argv: OUT, then ok (exit 0), fail (rank 1 exits 3) or wait.
LEAVES = """\
import os, subprocess, sys, time
out, how = sys.argv[1], sys.argv[2]
local = int(os.environ["LOCAL_RANK"])
def ticks(pid):
    text = open(f"/proc/{pid}/stat").read()
    return text[text.rindex(")") + 2:].split()[19]
def record(pid):
    with open(f"{out}/{os.environ['RANK']}.tmp", "w") as f:
        f.write(f"{pid} {ticks(pid)}")
    os.rename(f"{out}/{os.environ['RANK']}.tmp", f"{out}/{os.environ['RANK']}")
if local == 0:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            record(os.getpid())
            os.execvp("sleep", ["sleep", "1000"])
        os._exit(0)
    os.wait()
else:
    record(subprocess.Popen(["env", "-i", "sleep", "1000"], start_new_session=True).pid)
while not os.path.exists(f"{out}/{1 - local}"):  # both have left theirs
    time.sleep(0.05)
print("left one behind", flush=True)
open(f"{out}.said{local}", "w").close()
if how == "fail" and local == 1:
    while not os.path.exists(f"{out}.said0"):  # LOCAL_RANK 0 has said it too
        time.sleep(0.05)
    sys.exit(3)
if how != "ok":
    time.sleep(300)
"""


def require_cgroup() -> None:
    """A writable cgroup (v2, else v1's freezer) for this process, as the supervisor would make one."""
    require("torch")
    probe, why = reaping.make_cgroup(f"mlenv-probe-{os.getpid()}")
    if probe is None:
        pytest.skip(f"no writable cgroup: {why}")
    probe.remove()


@pytest.fixture
def left(tmp_path: Path) -> Iterator[Path]:
    """Where the script records what its ranks left behind; whatever is still alive at the end is killed."""
    out = tmp_path / "left"
    out.mkdir()
    yield out
    for pid, ticks in recorded(out):
        if alive(pid, ticks):
            os.kill(pid, signal.SIGKILL)


def recorded(out: Path) -> list[tuple[int, int]]:
    return [(int(pid), int(ticks)) for path in sorted(out.iterdir()) if path.suffix != ".tmp"
            for pid, ticks in [path.read_text().split()]]


def alive(pid: int, ticks: int) -> bool:
    """Process ``pid``, started at ``ticks``, is alive (a zombie is dead: only its parent's wait is missing)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = text[text.rindex(")") + 2:].split()
    return fields[0] not in "ZX" and int(fields[19]) == ticks


def gone_within_15_s(out: Path) -> None:
    """Both processes the ranks left are gone, at the latest 15 s from now."""
    left = recorded(out)
    assert len(left) == 2, left
    deadline = time.monotonic() + 15
    while any(alive(pid, ticks) for pid, ticks in left):
        assert time.monotonic() < deadline, [pid for pid, ticks in left if alive(pid, ticks)]
        time.sleep(0.1)


def detach_leaving(tmp_path: Path, left: Path, run_id: str) -> tuple[dict[str, str], int]:
    """A detached run of two ranks that have each left a process behind and wait: its environment and the pid of
    its supervisor."""
    require_cgroup()
    env = detached_env(tmp_path, run_id, MLENV_PROCS_PER_NODE="2")
    result = runtime(env, "launch", "--detach", "--launcher", "torchrun", "--", str(script(tmp_path)), str(left),
                     "wait")
    assert result.returncode == 0, result.stderr
    match = re.match(r"mlenv: node 0 started in the background: pid (\d+),", result.stdout)
    assert match, result.stdout
    log = NodeDir(Path(env["MLENV_RUN_DIR"]), 0, 0).log
    wait_for_line(log, "r1] left one behind")
    wait_for_line(log, "r0] left one behind")
    return env, int(match.group(1))


def cgroup_mounts() -> list[str]:
    """This (the host's) mount namespace's cgroup mounts, as /proc/self/mountinfo lists them."""
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if " - cgroup" in line]


def script(tmp_path: Path) -> Path:
    path = tmp_path / "leaves.py"
    path.write_text(LEAVES)
    return path


def cgroup_of(env: dict[str, str], attempt: int = 0) -> str:
    """The cgroup the node's supervisor recorded in state.json."""
    recorded_cgroup = read_state(NodeDir(Path(env["MLENV_RUN_DIR"]), attempt, 0)).get("cgroup")
    assert isinstance(recorded_cgroup, str), recorded_cgroup
    return recorded_cgroup


@pytest.mark.parametrize("how, code", [("ok", 0), ("fail", 3)])
def test_a_run_that_ends_ends_what_its_ranks_left_and_says_how_many(
    tmp_path: Path, left: Path, how: str, code: int
) -> None:
    require_cgroup()
    env = detached_env(tmp_path, f"run-{how}", MLENV_PROCS_PER_NODE="2")
    result = runtime(env, "launch", "--launcher", "torchrun", "--", str(script(tmp_path)), str(left), how)
    assert result.returncode == code, result.stderr[-3000:]
    assert result.stdout.count("left one behind") == 2, result.stdout
    gone_within_15_s(left)
    ended = re.findall(r"^mlenv: ended (\d+) process(?:es)? the ranks left behind$", result.stderr, re.MULTILINE)
    if how == "ok":
        assert ended == ["2"], result.stderr[-3000:]
    else:  # the failure's stop ended the daemon (it carries the job's marker); the cgroup what was left
        assert len(ended) == 1 and 1 <= int(ended[0]) <= 2, result.stderr[-3000:]
    assert "no writable cgroup" not in result.stderr
    assert not Path(cgroup_of(env)).exists()  # removed
    log = NodeDir(Path(env["MLENV_RUN_DIR"]), 0, 0).log.read_text()
    assert f"mlenv: ended {ended[0]} process" in log

    stop = runtime(env, "stop")  # a finished run: nothing killed, nothing "stopped"
    state = "succeeded" if how == "ok" else "failed"
    assert (stop.returncode, stop.stdout) == (0, f"run run-{how} already finished ({state}): nothing to stop\n")
    assert runtime(env, "stop", "--run", f"run-{how}").stdout == stop.stdout


def test_a_stopped_run_ends_what_its_ranks_left(tmp_path: Path, left: Path) -> None:
    env, pid = detach_leaving(tmp_path, left, "run-stop")
    log = NodeDir(Path(env["MLENV_RUN_DIR"]), 0, 0).log
    stopped = runtime(env, "stop")
    assert stopped.stdout == f"stopped node 0 of run run-stop (pid {pid}): ended after SIGTERM\n", stopped.stdout
    gone_within_15_s(left)
    assert re.search(r"^mlenv: ended [12] process(es)? the ranks left behind$", log.read_text(), re.MULTILINE)
    assert not Path(cgroup_of(env)).exists()


def test_the_cgroup_of_a_supervisor_killed_outright_is_ended_by_the_next_start(tmp_path: Path, left: Path) -> None:
    env, pid = detach_leaving(tmp_path, left, "run-killed")
    stale = Path(cgroup_of(env))
    os.kill(pid, signal.SIGKILL)  # no supervisor to end anything: its ranks and what they left run on
    try:
        assert all(alive(pid, ticks) for pid, ticks in recorded(left))
        again = detached_env(tmp_path, "run-next")
        (tmp_path / "ok.py").write_text("print('ok')\n")
        result = runtime(again, "launch", "--launcher", "torchrun", "--", str(tmp_path / "ok.py"))
        assert result.returncode == 0, result.stderr[-3000:]
        assert re.search(rf"^mlenv: removed cgroup {re.escape(str(stale))} of a supervisor that is gone \(ended \d+ "
                         r"process(es)? left in it\)$", result.stderr, re.MULTILINE), result.stderr[-3000:]
        gone_within_15_s(left)
        assert not stale.exists()
    finally:
        kill_cgroup(stale)


def test_stop_of_a_run_whose_supervisor_was_killed_ends_what_its_cgroup_holds(tmp_path: Path, left: Path) -> None:
    env, pid = detach_leaving(tmp_path, left, "run-lost")
    cgroup = Path(cgroup_of(env))
    os.kill(pid, signal.SIGKILL)
    try:
        stopped = runtime(env, "stop", "--run", "run-lost")
        assert (stopped.returncode, stopped.stdout) == (
            0, f"stopped node 0 of run run-lost (pid {pid}): ended after SIGTERM\n")
        gone_within_15_s(left)  # the env -i child too: it is in the cgroup
        assert not cgroup.exists()
    finally:
        kill_cgroup(cgroup)


def kill_cgroup(path: Path) -> None:
    """After a failed test: what a cgroup of the test's own runs still holds, and the cgroup."""
    for pid in reaping.procs_of(path):
        os.kill(pid, signal.SIGKILL)
    reaping.remove_cgroup(path)


def test_a_v1_freezer_cgroup_ends_a_daemon(tmp_path: Path, left: Path) -> None:
    """The v1 path (freeze, SIGKILL, thaw) on its own, where a v1 freezer hierarchy is mounted and writable."""
    freezer = Path("/sys/fs/cgroup/freezer")
    name = reaping.cgroup_name(os.getpid(), reaping.start_ticks(os.getpid()) or 0)
    try:
        (freezer / name).mkdir()
    except OSError as err:
        pytest.skip(f"no writable cgroup v1 freezer hierarchy at {freezer}: {err.strerror}")
    own = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
               if "freezer" in line.split(":")[1].split(","))
    assert own == "/", own  # the hierarchy's root: the directory made above is this process's child cgroup
    cgroup = reaping.Cgroup(freezer / name, f"/{name}", 1)
    try:
        ranks = [subprocess.Popen([sys.executable, str(script(tmp_path)), str(left), "ok"], preexec_fn=cgroup.join,
                                  env={**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank)}) for rank in (0, 1)]
        assert [rank.wait(timeout=60) for rank in ranks] == [0, 0]
        assert sorted(cgroup.procs()) == sorted(pid for pid, _ in recorded(left))
        assert cgroup.end(0) == 2
        gone_within_15_s(left)
    finally:
        assert cgroup.remove()


def test_in_a_network_namespace_its_own_cgroup2_mount_ends_both(tmp_path: Path, left: Path) -> None:
    """In a network namespace (``ip netns exec`` mounts a /sys of its own, without cgroups: the local backend's
    pods) the supervisor mounts cgroup v2 in that mount namespace and ends both processes, the ``env -i`` child
    too; the host's mounts are unchanged."""
    require_cgroup()
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and ip to make a network namespace")
    namespace = f"mlenv-reap-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    try:
        subprocess.run(["ip", "-n", namespace, "link", "set", "lo", "up"], check=True)
        host_cgroups = cgroup_mounts()
        env = detached_env(tmp_path, "run-netns", MLENV_PROCS_PER_NODE="2")
        result = subprocess.run(
            ["ip", "netns", "exec", namespace, sys.executable, "-m", "mlenv.runtime", "launch", "--launcher",
             "torchrun", "--", str(script(tmp_path)), str(left), "ok"],
            env=env, cwd=WORKSPACE, capture_output=True, text=True, timeout=180, check=False)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "no writable cgroup" not in result.stderr, result.stderr[-3000:]
        assert "mlenv: ended 2 processes the ranks left behind" in result.stderr, result.stderr[-3000:]
        gone_within_15_s(left)
        assert cgroup_mounts() == host_cgroups
    finally:
        subprocess.run(["ip", "netns", "delete", namespace], check=False)


def marked_dirs(temp: Path) -> dict[int, Path]:
    """The supervisor's pid -> its directory, of the directories under ``temp`` that a supervisor marked."""
    return {int((path / MARK).read_text()): path for path in temp.iterdir() if (path / MARK).is_file()}


def test_the_socket_directory_of_a_supervisor_killed_outright_goes_with_the_next_start(tmp_path: Path) -> None:
    """Never a live supervisor's directory, nor one without mlenv's mark."""
    require("torch")
    temp, sleeps = tmp_path / "tmp", tmp_path / "sleeps.py"
    (temp / "mlenv-not-marked").mkdir(parents=True)
    sleeps.write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(300)\n")
    envs = {run: detached_env(tmp_path, run, TMPDIR=str(temp)) for run in ("run-killed", "run-live", "run-next")}
    killed, live = (start_detached(envs[run], sleeps) for run in ("run-killed", "run-live"))
    try:
        for run in ("run-killed", "run-live"):
            wait_for_line(NodeDir(Path(envs[run]["MLENV_RUN_DIR"]), 0, 0).log, "sleeping")
        dirs = marked_dirs(temp)
        assert sorted(dirs) == sorted((killed, live)), dirs
        os.kill(killed, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while reaping.start_ticks(killed) is not None:
            assert time.monotonic() < deadline, "the killed supervisor is still there"
            time.sleep(0.1)
        assert dirs[killed].is_dir()  # nobody removed it
        (tmp_path / "ok.py").write_text("print('ok')\n")
        result = runtime(envs["run-next"], "launch", "--", str(tmp_path / "ok.py"))
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"mlenv: removed 1 directory of supervisors that are gone from {temp}\n" in result.stderr
        assert marked_dirs(temp) == {live: dirs[live]}  # the next run's own went with it
        assert (temp / "mlenv-not-marked").is_dir()
    finally:
        runtime(envs["run-live"], "stop")
        for pid in job_processes("run-killed"):  # its torchrun and rank, where no cgroup ended them
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
