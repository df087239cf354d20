"""``mlenv drill`` on a local cluster of 2 nodes x 2 ranks (processes): a rank that exits and a frozen node are each
detected, named, stopped, restarted and resumed at the checkpointed step within the default targets; every phase has
a time and PASS, the timeline picture is written, the deployment's excluded nodes are as before (a frozen node 0
too, ``--node 0``); bad input (an unknown fault, a node the deployment lacks, no deployment, a live run) exits 2 and
starts nothing; a drill interrupted while its node is frozen
(Ctrl-C, SIGTERM) exits 130 and its run is recorded stopped, no node blamed."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

from tests.helpers import MLENV, assert_shaped, documented_shape
from tests.integration.local_cluster import FAILING_JOB, LocalProject, leftovers, make_project, require_local

PHASES = ["detected", "stopped", "started", "resumed"]
PREEMPT_PHASES = ["detected", "checkpointed", "stopped", "started", "resumed"]


class Deployed(Protocol):
    """A deployed project of any backend's tests: the real ``mlenv`` against it."""

    def mlenv(self, *args: str, timeout: float = ...) -> subprocess.CompletedProcess[str]: ...

    def ok(self, *args: str, timeout: float = ...) -> subprocess.CompletedProcess[str]: ...


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    require_local("processes")
    deployed = make_project(tmp_path_factory.mktemp("drill"), "ldr", "10.77.78.0/24", "processes")
    deployed.ok("deploy", deployed.name)
    deployed.ok("sync", "--source", str(deployed.source({"sleeper.py": FAILING_JOB})))
    yield deployed
    deployed.mlenv("stop")
    deployed.mlenv("clean", "--delete-data", "--yes")


def _runs(project: LocalProject) -> list[str]:
    return sorted(path.name for path in (project.home / "runs").glob("*")) if (project.home / "runs").is_dir() else []


def check_drill(project: Deployed, fault: str, *cluster: str, node: int | None = None) -> dict[str, object]:
    """``mlenv drill --fault FAULT --json`` on ``project`` (``cluster``: ``-c NAME``, else its deployment; ``node``:
    ``--node N``): every phase timed and PASS, the timeline written, no node left excluded; the one drill's report."""
    at = ("--node", str(node)) if node is not None else ()
    result = project.mlenv("drill", *cluster, "--fault", fault, *at, "--json", timeout=400)
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], (result.stdout, result.stderr[-4000:])
    assert_shaped(report, documented_shape("drill"))
    (drill,) = report["drills"]
    assert drill["fault"] == fault and drill["exit_code"] == 0
    assert [phase["phase"] for phase in drill["phases"]] == (PREEMPT_PHASES if fault == "preempt" else PHASES)
    for phase in drill["phases"]:
        assert phase["verdict"] == "PASS" and isinstance(phase["seconds"], float), drill["phases"]
        assert phase["seconds"] >= 0 and (phase["target"] is None or phase["seconds"] <= phase["target"])
    assert drill["resumed_step"] >= 1 and 0 <= drill["lost_steps"] <= 2, drill
    found = drill["goodput"]  # the run's: two attempts, its phases summing to its wall time
    assert found["attempts"] == 2 and abs(sum(found["phases"].values()) - found["wall"]) <= 0.05 * found["wall"], found
    run_dir = Path(drill["run_dir"])
    assert (run_dir / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((run_dir / "drill.json").read_text())["verdict"] == "PASS"
    assert json.loads(project.ok("nodes", *cluster, "--json").stdout)["excluded"] == []
    return dict(drill)


def test_bad_input_starts_nothing(project: LocalProject, tmp_path: Path) -> None:
    unknown = project.mlenv("drill", "--fault", "meteor")
    assert unknown.returncode == 2 and "--fault meteor: not a fault the drill knows" in unknown.stderr
    beyond = project.mlenv("drill", "--fault", "node-freeze", "--node", "2")
    assert beyond.returncode == 2 and "has 2 nodes (0 to 1)" in beyond.stderr, beyond.stderr
    own = project.mlenv("drill", "--fault", "rank-exit", "--node", "0")
    assert own.returncode == 2 and "--node: rank-exit's fault is the job's own" in own.stderr, own.stderr
    preempt = project.mlenv("drill", "--fault", "preempt")
    assert preempt.returncode == 2 and "the local backend cannot" in preempt.stderr, preempt.stderr
    undeployed = make_project(tmp_path, "lnd", "10.77.79.0/24", "processes")
    nothing = undeployed.mlenv("drill", "--fault", "rank-exit")
    assert nothing.returncode == 2 and "Traceback" not in nothing.stderr, nothing.stderr
    before = _runs(project)
    project.ok("launch", "--detach", "sleeper.py")
    try:
        live = project.mlenv("drill", "--fault", "rank-exit")
    finally:
        project.ok("stop")
    assert live.returncode == 2 and "the drill runs only where nothing else does" in live.stderr, live.stderr
    assert len(_runs(project)) == len(before) + 1  # the user's run only: the drill started none


def test_a_rank_that_exits(project: LocalProject) -> None:
    drill = check_drill(project, "rank-exit")
    assert "exited with 1" in drill["phases"][0]["evidence"]


def test_a_frozen_node(project: LocalProject) -> None:
    drill = check_drill(project, "node-freeze")
    assert "node-1 unreachable" in drill["phases"][0]["evidence"]


def test_a_frozen_node_0(project: LocalProject) -> None:
    """Node 0 holds the rendezvous and the control channel: node 1 names it, from its silence."""
    drill = check_drill(project, "node-freeze", node=0)
    assert drill["node"] == 0
    assert "node-0 unreachable: node 1 heard nothing from it" in drill["phases"][0]["evidence"], drill["phases"]


def _frozen_supervisor(project: LocalProject, ordinal: int) -> bool:
    """Whether the supervisor of node ``ordinal`` is stopped (SIGSTOP: state T)."""
    marker = f"MLENV_POD_DIR={project.pod_dir(ordinal)}".encode()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            text, command = stat.read_text(), (stat.parent / "cmdline").read_bytes()
            if text[text.rindex(")") + 2] == "T" and b"mlenv.runtime\0launch" in command \
                    and marker in (stat.parent / "environ").read_bytes().split(b"\0"):
                return True
    return False


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_an_interrupted_drill_is_recorded_stopped_and_blames_nobody(project: LocalProject, tmp_path: Path,
                                                                    how: str) -> None:
    """Ctrl-C (SIGINT to the drill's process group, as a terminal sends it) or SIGTERM while node 1 is frozen: the
    node is thawed first, so that its supervisor stops its share as node 0's does."""
    with (tmp_path / "out").open("w") as out, (tmp_path / "err").open("w") as err:
        drill = subprocess.Popen([str(MLENV), "drill", "--fault", "node-freeze"], stdout=out, stderr=err,
                                 env={**os.environ, "MLENV_HOME": str(project.home)}, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not _frozen_supervisor(project, 1):
            assert drill.poll() is None and time.monotonic() < deadline, (tmp_path / "err").read_text()[-3000:]
            time.sleep(0.1)
        if how == "ctrl-c":
            os.killpg(drill.pid, signal.SIGINT)
        else:
            drill.send_signal(signal.SIGTERM)
        assert drill.wait(timeout=120) == 130
    finally:
        if drill.poll() is None:
            os.killpg(drill.pid, signal.SIGKILL)
            drill.wait()
    said = (tmp_path / "err").read_text()
    assert said.splitlines()[-1] == "error: interrupted" and "Traceback" not in said, said[-3000:]
    deadline = time.monotonic() + 30
    while left := [item for item in leftovers(project) if item.startswith("process")]:
        assert time.monotonic() < deadline, left
        time.sleep(0.2)
    run = json.loads(project.ok("status", "--json").stdout)["latest_run"]
    assert (run["state"], run["exit_code"], run["first_failure"], run["node_faults"]) == ("stopped", 143, None, {}), run
    assert json.loads(project.ok("nodes", "--json").stdout)["excluded"] == []
