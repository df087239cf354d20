"""Idle GPUs on a local cluster of 2 nodes x 2 ranks (processes) whose cluster file sets ``launch.idle_minutes: 3s``:
every node reads its GPUs from the nvidia-smi stand-in (first on PATH, its utilization from a file the test writes).
Busy GPUs flag nothing; 0 % on every GPU flags the run idle in the output and in ``status`` (text and
``latest_run.idle``), busy again clears it; ``--on-idle stop`` ends the job with exit code 125 (``make launch
ON_IDLE=stop`` too) and is not restarted under --max-restarts, attached or detached; bad settings are bad input (exit
2)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ROOT
from tests.integration.local_cluster import LocalProject, make_project, require_local
from tests.integration.test_makefile import make

STANDIN = ROOT / "tests" / "fixtures" / "nvidia_smi"
IDLE_EXIT_CODE = 125

# No torch: every rank says it is up, then sleeps (its GPUs as idle or busy as the stand-in says) until told.
SLEEPER = """\
import os, sys, time
print(f"rank {os.environ['RANK']} up on node {os.environ['MLENV_NODE_RANK']}", flush=True)
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:
    time.sleep(0.2)
print(f"rank {os.environ['RANK']} done", flush=True)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    require_local("processes")
    deployed = make_project(tmp_path_factory.mktemp("idle"), "lid", "10.77.87.0/24", "processes")
    cluster_file = deployed.home / "clusters" / f"{deployed.name}.yaml"
    cluster_file.write_text(cluster_file.read_text() + "launch:\n  idle_minutes: 3s\n")
    deployed.ok("deploy", deployed.name)
    deployed.ok("sync", "--source", str(deployed.source({"sleeper.py": SLEEPER})))
    yield deployed
    deployed.mlenv("stop")
    deployed.mlenv("clean", "--delete-data", "--yes")


@pytest.fixture
def gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in first on PATH for every node; the returned file holds its GPUs' utilization (0 to start)."""
    utilization = tmp_path / "utilization"
    utilization.write_text("0\n")
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NVIDIA_SMI_UTILIZATION_FILE", str(utilization))
    monkeypatch.setenv("NVIDIA_SMI_CALLS", str(tmp_path / "calls"))
    return utilization


def _run(project: LocalProject) -> dict[str, Any]:
    return dict(json.loads(project.ok("status", "--json").stdout).get("latest_run") or {})


def _wait(project: LocalProject, what: str, test: Any, deadline: float = 120) -> dict[str, Any]:
    until = time.monotonic() + deadline
    while True:
        run = _run(project)
        if test(run):
            return run
        assert time.monotonic() < until, f"never {what}: {run}"
        time.sleep(0.5)


def _queries(calls: Path) -> dict[str, int]:
    """How many times each node's runtime read its GPUs (``--query-gpu`` calls of the stand-in)."""
    counted: dict[str, int] = {}
    for line in calls.read_text().splitlines() if calls.exists() else []:
        host, _, args = line.partition(" ")
        if "--query-gpu=" in args:
            counted[host] = counted.get(host, 0) + 1
    return counted


def test_busy_gpus_are_not_flagged_idle_ones_are_and_busy_again_clears(project: LocalProject, gpus: Path) -> None:
    gpus.write_text("90\n")
    project.ok("launch", "--detach", "--launcher", "torchrun", "sleeper.py", "600")
    _wait(project, "running", lambda run: run.get("state") == "running" and len(run.get("ranks") or []) == 4)
    calls = gpus.parent / "calls"
    start = _queries(calls)
    until = time.monotonic() + 120
    while not all(_queries(calls).get(f"{project.app}-{n}", 0) >= start.get(f"{project.app}-{n}", 0) + 6
                  for n in (0, 1)):  # 6 samples a node (1 a second): twice the 3 s window, all busy
        assert time.monotonic() < until, _queries(calls)
        time.sleep(0.5)
    busy = _run(project)
    assert busy["state"] == "running" and busy["idle"] is None, busy
    assert "idle: every GPU" not in project.ok("logs").stdout

    gpus.write_text("0\n")
    idle = _wait(project, "flagged idle", lambda run: run.get("idle"))
    assert idle["state"] == "running" and sorted(idle["idle"]) == ["node-0", "node-1"], idle
    for node in (0, 1):
        report = idle["idle"][f"node-{node}"]
        assert report["node"] == node and report["host"] == f"{project.app}-{node}" and report["threshold"] == 5
        assert report["seconds"] >= 3 and report["gpus"] == [{"index": 0, "utilization": 0.0},
                                                             {"index": 1, "utilization": 0.0}]
    logs = project.ok("logs").stdout
    for node in (0, 1):
        assert f"mlenv: node-{node} ({project.app}-{node}) idle: every GPU under 5% for " in logs, logs
    status = project.ok("status").stdout
    assert f"GPUs idle: node-0 ({project.app}-0) idle: every GPU under 5% for" in status, status

    gpus.write_text("75\n")
    _wait(project, "busy again", lambda run: run.get("idle") is None and run.get("state") == "running")
    assert "GPUs are busy again: the job is no longer idle" in project.ok("logs").stdout
    project.ok("stop")


def test_on_idle_stop_ends_the_job_with_125_and_it_is_not_restarted(project: LocalProject, gpus: Path) -> None:
    result = project.mlenv("launch", "--launcher", "torchrun", "--on-idle", "stop", "--max-restarts", "2",
                           "sleeper.py", "600", timeout=240)
    assert result.returncode == IDLE_EXIT_CODE, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"mlenv: node-1 ({project.app}-1) idle: every GPU under 5% for " in result.stdout
    assert result.stdout.count(" up on node ") == 4  # judged from the ranks' start on, not the launchers'
    assert "restarting" not in result.stderr and "attempt 1" not in result.stdout + result.stderr
    assert "stopped on every node: every GPU of the job was idle (--on-idle stop)" in result.stderr
    run = _run(project)
    assert run["state"] == "failed" and run["attempt"] == 0 and sorted(run["idle"]) == ["node-0", "node-1"], run
    # each node ends as the idle stop says, also one that mlenv's fail-fast stopped after another node ended
    states = json.loads(project.ok("status", "--json").stdout)["run_states"]
    assert states == {"0": f"failed ({IDLE_EXIT_CODE})", "1": f"failed ({IDLE_EXIT_CODE})"}, states


def test_a_detached_idle_stop_is_not_restarted_by_the_nodes(project: LocalProject, gpus: Path) -> None:
    project.ok("launch", "--detach", "--launcher", "torchrun", "--on-idle", "stop", "--max-restarts", "2",
               "sleeper.py", "600")
    run = _wait(project, "stopped for idle", lambda run: run.get("state") == "failed")
    assert run["attempt"] == 0 and sorted(run["idle"]) == ["node-0", "node-1"], run
    states = json.loads(project.ok("status", "--json").stdout)["run_states"]
    assert states == {"0": f"failed ({IDLE_EXIT_CODE})", "1": f"failed ({IDLE_EXIT_CODE})"}, states
    logs = project.ok("logs").stdout
    assert "stopping the job: idle: every GPU of the job under 5% for" in logs and "restarting" not in logs, logs


def test_busy_gpus_never_stop_a_job_under_on_idle_stop(project: LocalProject, gpus: Path) -> None:
    gpus.write_text("60\n")
    result = project.mlenv("launch", "--launcher", "torchrun", "--on-idle", "stop", "sleeper.py", "12", timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count(" done") == 4 and "idle: every GPU" not in result.stdout
    counted = _queries(gpus.parent / "calls")  # 4 samples at least 1 s apart: longer than the 3 s window
    assert sorted(counted) == [f"{project.app}-0", f"{project.app}-1"] and min(counted.values()) >= 4, counted
    assert _run(project)["idle"] is None


def test_make_launch_on_idle_stop_exits_125(project: LocalProject, gpus: Path) -> None:
    made = make("launch", "SCRIPT=sleeper.py", "ARGS=600", "LAUNCHER=torchrun", "ON_IDLE=stop", home=project.home)
    assert made.returncode != 0 and f"Error {IDLE_EXIT_CODE}" in made.stderr, made.stdout[-3000:] + made.stderr[-3000:]
    assert "idle: every GPU under 5% for" in made.stdout


def test_on_idle_is_bad_input_without_idle_minutes_or_unknown_and_help_names_125(project: LocalProject) -> None:
    assert "125" in project.ok("launch", "--help").stdout
    dry = project.ok("launch", "--dry-run", "--on-idle", "stop", "sleeper.py").stdout
    assert "--idle-seconds 3 --on-idle stop --" in dry, dry
    through_make = make("launch-dry-run", "SCRIPT=sleeper.py", "ON_IDLE=stop", home=project.home)
    assert through_make.returncode == 0 and "--idle-seconds 3 --on-idle stop --" in through_make.stdout
    assert project.mlenv("launch", "--on-idle", "sometimes", "sleeper.py").returncode == 2
    cluster_file = project.home / "clusters" / f"{project.name}.yaml"
    original = cluster_file.read_text()
    cluster_file.write_text(original.replace("  idle_minutes: 3s\n", "  idle_util: 12.5\n"))
    try:
        refused = project.mlenv("launch", "--on-idle", "stop", "sleeper.py")
        assert refused.returncode == 2 and "--on-idle stop needs launch.idle_minutes" in refused.stderr, refused.stderr
        assert project.mlenv("launch", "--on-idle", "warn", "sleeper.py").returncode == 2
        assert "--idle" not in project.ok("launch", "--dry-run", "sleeper.py").stdout  # nothing watched
        cluster_file.write_text(original.replace("  idle_minutes: 3s\n", "  idle_minutes: 30m\n  idle_util: 12.5\n"))
        dry = project.ok("launch", "--dry-run", "--on-idle", "warn", "sleeper.py").stdout
        assert "--idle-seconds 1800 --idle-util 12.5 --" in dry, dry
    finally:
        cluster_file.write_text(original)
