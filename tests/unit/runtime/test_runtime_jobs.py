"""jobs, stop and logs over run directories written as ``launch --detach`` writes them, with real processes.

Starting real detached jobs (through torchrun) is tested in tests/integration/test_runtime_launch.py; here the
records point at processes the tests start themselves, including unrelated ones that must never be touched.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlenv.runtime.records.runlayout import NodeDir
from runtime_support import Runner

from tests._prereq import clean_environ
from tests._waiting import wait_until_polling

HOST = "ml-dev-env-0"
NO_PID = (1 << 22) + 1  # above the kernel's largest pid_max: never a process


def write_record(run_dir: Path, rank: int = 0, *, pid: int, start_ticks: int = 0, host: str = HOST,
                 started_at: str = "2030-01-01T00:00:00.000+00:00", log: str = "",
                 exit_code: int | None = None, attempt: int = 0) -> None:
    """A node's files as ``launch --detach`` leaves them (the log exists before the record)."""
    node = NodeDir(run_dir, attempt, rank)
    node.path.mkdir(parents=True, exist_ok=True)
    node.log.write_text(log)
    if exit_code is not None:
        node.exit.write_text(f"{exit_code}\n")
    record = {"run_id": run_dir.name, "node_rank": rank, "host": host, "pid": pid, "start_ticks": start_ticks,
              "started_at": started_at, "argv": ["python3", "-m", "mlenv.runtime", "launch", "--", "train.py"],
              "attempt": attempt}
    node.record.write_text(json.dumps(record))


def start_ticks(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[19])


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def unrelated() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is no job of ours (what a recorded PID may have been reused for)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def runtime(run_runtime: Runner, tmp_path: Path) -> Runner:
    """The runtime on this host (HOSTNAME=ml-dev-env-0) with tmp_path/runs as the runs root."""
    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return run_runtime(*args, env={"HOSTNAME": HOST, "MLENV_RUNS_ROOT": str(tmp_path / "runs"), **(env or {})},
                           timeout=timeout)
    return run


def test_no_runs_yet(runtime: Runner, tmp_path: Path) -> None:
    assert runtime("jobs").stdout == f"no jobs of {HOST} under {tmp_path / 'runs'}\n"
    assert json.loads(runtime("jobs", "--json").stdout) == []
    assert (runtime("stop").stdout, runtime("stop").returncode) == ("nothing to stop\n", 0)
    result = runtime("logs")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"mlenv.runtime logs: failed: no job of {HOST} under {tmp_path / 'runs'}\n"


def test_a_reused_pid_is_not_the_job(runtime: Runner, tmp_path: Path, unrelated: subprocess.Popen[bytes]) -> None:
    """Records whose PID now belongs to another process: one with another start time, one with the right start
    time but without the job's marker in its environment. Neither is running, and stop touches neither."""
    write_record(tmp_path / "runs/old-start", pid=unrelated.pid, start_ticks=start_ticks(unrelated.pid) - 1)
    write_record(tmp_path / "runs/no-marker", pid=unrelated.pid, start_ticks=start_ticks(unrelated.pid))
    found = json.loads(runtime("jobs", "--json").stdout)
    assert [(job["run_id"], job["state"], job["exit_code"]) for job in found] == [
        ("no-marker", "failed", None), ("old-start", "failed", None)]
    assert found[0]["reason"] == "gone without an exit status"
    result = runtime("stop", "--grace", "0")
    assert (result.returncode, result.stdout) == (0, "nothing to stop\n")
    time.sleep(0.3)
    assert alive(unrelated.pid)
    assert not NodeDir(tmp_path / "runs/old-start", 0, 0).exit.exists()


def test_states_hosts_and_table(runtime: Runner, tmp_path: Path, unrelated: subprocess.Popen[bytes]) -> None:
    runs = tmp_path / "runs"
    write_record(runs / "r1", pid=unrelated.pid, exit_code=0, started_at="2030-01-01T00:00:00.000+00:00")
    write_record(runs / "r2", rank=1, pid=unrelated.pid, exit_code=137, started_at="2030-01-02T00:00:00.000+00:00")
    write_record(runs / "r2", rank=0, pid=unrelated.pid, host="ml-dev-env-1")  # another host's node, shared FS
    write_record(runs / "r4", pid=unrelated.pid, exit_code=143, started_at="2030-01-03T00:00:00.000+00:00")
    NodeDir(runs / "r3", 0, 0).path.mkdir(parents=True)
    NodeDir(runs / "r3", 0, 0).record.write_text("{not json")  # unreadable: skipped
    lines = runtime("jobs").stdout.splitlines()
    assert [line.split()[:5] for line in lines] == [
        ["RUN", "NODE", "STATE", "PID", "STARTED"],
        ["r1", "0", "succeeded", "(0)", str(unrelated.pid)],
        ["r2", "1", "failed", "(137)", str(unrelated.pid)],  # SIGKILLed, no state of its own: not mlenv's stop
        ["r4", "0", "stopped", "(143)", str(unrelated.pid)],  # SIGTERM's code alone: a stop (docs/runs.md)
    ]
    assert lines[1].endswith(str(NodeDir(runs / "r1", 0, 0).log))
    other = json.loads(runtime("jobs", "--json", env={"HOSTNAME": "ml-dev-env-1"}).stdout)
    assert [(job["run_id"], job["node_rank"], job["host"], job["state"]) for job in other] == [
        ("r2", 0, "ml-dev-env-1", "failed")]
    assert set(other[0]) == {"run_id", "node_rank", "host", "pid", "start_ticks", "started_at", "argv", "attempt",
                             "state", "exit_code", "reason", "first_failure", "node_fault", "transport", "stacks",
                             "idle", "stragglers", "lost_nodes", "ranks", "attempts", "run_dir", "node_dir", "log"}


def test_logs_prints_the_newest_run_of_this_host(runtime: Runner, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    write_record(runs / "a", pid=NO_PID, log="old run\n", exit_code=0, started_at="2030-01-01T00:00:00.000+00:00")
    write_record(runs / "b", pid=NO_PID, log="new run\n", exit_code=0, started_at="2030-01-02T00:00:00.000+00:00")
    write_record(runs / "c", pid=NO_PID, log="other host\n", host="elsewhere",
                 started_at="2030-01-03T00:00:00.000+00:00")
    assert runtime("logs").stdout == "new run\n"
    assert runtime("logs", "--run", "a").stdout == "old run\n"
    assert runtime("logs", "--runs-root", str(runs), "--run", "b", env={"MLENV_RUNS_ROOT": "/nowhere"}).stdout == (
        "new run\n")


def test_logs_picks_this_nodes_rank_when_nodes_share_a_host(runtime: Runner, tmp_path: Path) -> None:
    for rank in (0, 1):
        write_record(tmp_path / "runs/r", rank=rank, pid=NO_PID, log=f"node {rank}\n", exit_code=0)
    assert runtime("logs", env={"MLENV_NODE_RANK": "1", "MLENV_NUM_NODES": "2", "MASTER_ADDR": "m"}).stdout == (
        "node 1\n")


def test_follow_an_ended_job_exits_with_its_status(runtime: Runner, tmp_path: Path) -> None:
    write_record(tmp_path / "runs/r", pid=NO_PID, log="step 1/2\nstep 2/2\n", exit_code=7)
    result = runtime("logs", "--follow")
    assert (result.returncode, result.stdout) == (7, "step 1/2\nstep 2/2\n")


def test_follow_a_restarted_run_prints_every_attempt_and_ends_with_the_last(runtime: Runner, tmp_path: Path) -> None:
    write_record(tmp_path / "runs/r", pid=NO_PID, log="try 0\n", exit_code=3)
    write_record(tmp_path / "runs/r", pid=NO_PID, log="try 1\n", exit_code=0, attempt=1)
    result = runtime("logs", "--follow")
    assert (result.returncode, result.stdout) == (0, "mlenv: ==== attempt 0 (MLENV_RESTART_COUNT=0) of run r, node 0 "
                                                     "====\ntry 0\nmlenv: ==== attempt 1 (MLENV_RESTART_COUNT=1) of "
                                                     "run r, node 0 ====\ntry 1\n"), result.stderr


def test_follow_goes_on_to_the_attempt_a_supervisor_starts_before_it_ends(runtime: Runner, tmp_path: Path) -> None:
    """A follower of attempt 0 whose supervisor, after writing its exit status, says it restarts the run and
    records attempt 1 before it ends: the follower copies that, then attempt 1 to its end, and exits with its
    status (not attempt 0's)."""
    run, first = tmp_path / "runs/r", NodeDir(tmp_path / "runs/r", 0, 0)
    first.path.mkdir(parents=True)
    release = tmp_path / "release"
    script = ("import os, sys, time\n"
              f"while not os.path.exists({str(release)!r}): time.sleep(0.05)\n"
              f"open({str(first.log)!r}, 'a').write('restarting the run\\n')\n")
    supervisor = subprocess.Popen([sys.executable, "-c", script],
                                  env=clean_environ({"MLENV_JOB": str(first.record.resolve())}))
    try:
        write_record(run, pid=supervisor.pid, start_ticks=start_ticks(supervisor.pid), log="try 0\n")
        command = [sys.executable, "-m", "mlenv.runtime", "logs", "--follow"]
        env = clean_environ({"HOSTNAME": HOST, "MLENV_RUNS_ROOT": str(tmp_path / "runs")})
        with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) as follower:
            wait_until_polling(follower.pid)  # following attempt 0 while its supervisor runs
            first.exit.write_text("3\n")
            write_record(run, pid=NO_PID, log="try 1\n", exit_code=5, attempt=1)
            release.touch()  # the supervisor says so and ends
            out, err = follower.communicate(timeout=30)
    finally:
        supervisor.kill()
        supervisor.wait()
    assert (follower.returncode, out) == (5, "try 0\nrestarting the run\nmlenv: ==== attempt 1 "
                                             "(MLENV_RESTART_COUNT=1) of run r, node 0 ====\ntry 1\n"), err


def test_follow_a_lost_job(runtime: Runner, tmp_path: Path, unrelated: subprocess.Popen[bytes]) -> None:
    write_record(tmp_path / "runs/r", pid=unrelated.pid, log="step 1/2\n")
    result = runtime("logs", "-f")
    assert (result.returncode, result.stdout) == (1, "step 1/2\n")
    assert result.stderr == f"mlenv: node 0 of run r (pid {unrelated.pid}) is gone without an exit status\n"


def test_follow_waits_a_bounded_time_for_the_job(runtime: Runner, tmp_path: Path) -> None:
    started = time.monotonic()
    result = runtime("logs", "--follow", "--run", "r", "--wait", "1")
    assert 1 <= time.monotonic() - started < 10
    assert (result.returncode, result.stderr) == (2, f"mlenv.runtime logs: error: no job of {HOST} in run r "
                                                     f"under {tmp_path / 'runs'}\n")


def test_follow_picks_up_a_job_that_starts_while_waiting(runtime: Runner, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "mlenv.runtime", "logs", "--follow", "--run", "late", "--wait", "30"]
    env = clean_environ({"HOSTNAME": HOST, "MLENV_RUNS_ROOT": str(tmp_path / "runs")})
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as follower:
        wait_until_polling(follower.pid)  # it found no job and waits for one
        write_record(tmp_path / "runs/late", pid=NO_PID, log="hello\n", exit_code=0)
        out, err = follower.communicate(timeout=30)
    assert (follower.returncode, out) == (0, "hello\n"), err


def test_logs_of_one_rank(runtime: Runner, tmp_path: Path) -> None:
    lines = "[node-0 r1] a\nmlenv: note\n[node-0 r10] not rank 1\n[node-0] torchrun says\n[node-0 r1] b\n"
    write_record(tmp_path / "runs/r", pid=NO_PID, log=lines, exit_code=0)
    ranks = [{"rank": rank, "local_rank": rank - 1, "node": 0, "host": HOST, "pid": 1, "state": "succeeded",
              "exit_code": 0, "signal": None, "started_at": "t", "ended_at": "t", "last_output_at": None}
             for rank in (1, 10)]
    NodeDir(tmp_path / "runs/r", 0, 0).ranks.write_text(json.dumps(ranks))
    assert runtime("logs", "--rank", "1").stdout == "[node-0 r1] a\n[node-0 r1] b\n"
    assert runtime("logs", "--rank", "1", "--follow").stdout == "[node-0 r1] a\n[node-0 r1] b\n"
    unknown = runtime("logs", "--rank", "2")
    assert (unknown.returncode, unknown.stdout) == (2, "")
    assert unknown.stderr == "mlenv.runtime logs: error: rank 2 is not on node 0 of run r (its ranks: 1, 10)\n"
    assert runtime("logs", "--rank", "x").returncode == 2
