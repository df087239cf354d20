"""``python3 -m mlenv.runtime fault``: the pids come from the run's own records of the node, and only those get the
signal: one rank (the node's highest global rank still running), or the node's share (its ranks and the supervisor
while its pid is still the runtime's); no run is bad input (exit 2), nothing running there is a failure (exit 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture()
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started = [subprocess.Popen(SLEEP) for _ in range(2)]
    yield started
    for process in started:
        process.kill()
        process.wait()


def _fault(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mlenv.runtime", "fault", "--runs-root", str(root), "--run", "r1",
                           "--node", "1", *args], capture_output=True, text=True, timeout=30, check=False,
                          env={"PYTHONPATH": str(ROOT / "tools")})


def _layout(root: Path, ranks: list[tuple[int, int, str]]) -> None:
    node = root / "r1" / "attempt-0" / "node1"
    node.mkdir(parents=True)
    (node / "ranks.json").write_text(json.dumps([
        {"rank": rank, "local_rank": rank - 2, "node": 1, "host": "h", "pid": pid, "state": state, "exit_code": None,
         "signal": None, "started_at": "2026-11-27T20:00:00.000+00:00", "ended_at": None, "last_output_at": None}
        for rank, pid, state in ranks]))
    (node / "record.json").write_text(json.dumps({"pid": 1, "run_id": "r1"}))  # pid 1 is no runtime: left alone
    (node / "state.json").write_text(json.dumps({"state": "running", "cgroup": None}))


def test_one_rank_gets_the_signal(tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]) -> None:
    _layout(tmp_path, [(2, sleepers[0].pid, "running"), (3, sleepers[1].pid, "running")])
    done = _fault(tmp_path, "--target", "rank", "--signal", "KILL")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["pids"] == [sleepers[1].pid]
    assert sleepers[1].wait(timeout=10) == -9
    assert sleepers[0].poll() is None


def test_the_node_share_gets_the_signal(tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]) -> None:
    _layout(tmp_path, [(2, sleepers[0].pid, "running"), (3, sleepers[1].pid, "running")])
    done = _fault(tmp_path, "--target", "node", "--signal", "KILL")
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["signal"] == "SIGKILL" and said["pids"] == sorted(p.pid for p in sleepers)
    assert [p.wait(timeout=10) for p in sleepers] == [-9, -9]


def test_no_run_is_bad_input_and_nothing_running_a_failure(tmp_path: Path) -> None:
    missing = _fault(tmp_path, "--target", "rank", "--signal", "STOP")
    assert missing.returncode == 2 and "no run r1" in missing.stderr
    _layout(tmp_path, [(2, 999999, "failed")])
    ended = _fault(tmp_path, "--target", "rank", "--signal", "STOP")
    assert ended.returncode == 1 and "nothing of node 1 runs in attempt 0 of run r1" in ended.stderr
