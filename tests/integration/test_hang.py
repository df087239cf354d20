"""The hang watchdog on a local cluster of 2 nodes x 2 ranks (gloo): a random rank sits in a randomly named
function, the others wait in all_reduce, nobody writes. ``launch --hang-timeout`` captures every rank's stack once
into the run directory, status says hung with the capture's path, output again leaves hung; ``--on-hang stop``
stops the job with exit code 124."""

from __future__ import annotations

import json
import os
import random
import string
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlenv.runtime.forensics.stacks import find_py_spy

from tests._prereq import require
from tests.helpers import MLENV, ROOT
from tests.integration.local_cluster import LocalProject, make_project, require_local
from tests.integration.test_makefile import make

HANG = """\
import os, sys, time
import torch
import torch.distributed as dist

def {function}():
    while not os.path.exists({release!r}):
        time.sleep(0.2)

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
print(f"rank {{rank}} up", flush=True)
if rank == {stuck}:
    {function}()
dist.all_reduce(t)
for step in range(60):
    print(f"rank {{rank}} step {{step}}", flush=True)
    time.sleep(1)
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    require_local("processes")
    if find_py_spy() is None:
        require("py-spy")
    deployed = make_project(tmp_path_factory.mktemp("hang"), "lhg", "10.77.74.0/24", "processes")
    deployed.ok("deploy", deployed.name)
    yield deployed
    deployed.mlenv("stop")
    deployed.mlenv("clean", "--delete-data", "--yes")


def _job(project: LocalProject, release: Path) -> tuple[str, int]:
    """Sync a fresh hanging job: (its function's name, the stuck rank)."""
    draw = random.Random()  # noqa: S311 - a test's choice, not a secret
    function = "stuck_" + "".join(draw.choices(string.ascii_lowercase, k=10))
    stuck = draw.randrange(4)
    project.ok("sync", "--source", str(project.source({"hang.py": HANG.format(function=function, stuck=stuck,
                                                                              release=str(release))})))
    return function, stuck


def _latest_run(project: LocalProject, state: str, deadline: float = 180) -> dict[str, Any]:
    until = time.monotonic() + deadline
    while True:
        run = json.loads(project.ok("status", "--json").stdout).get("latest_run") or {}
        if run.get("state") == state:
            return dict(run)
        assert time.monotonic() < until, f"run never became {state}: {run}"
        time.sleep(1)


def test_hung_with_a_capture_that_names_the_function_then_output_again(project: LocalProject,
                                                                       tmp_path: Path) -> None:
    release = tmp_path / "release"
    function, stuck = _job(project, release)
    project.ok("launch", "--detach", "--launcher", "torchrun", "--hang-timeout", "10", "hang.py")
    run = _latest_run(project, "hung")
    capture = Path(run["stacks"])
    text = (capture / "stacks.txt").read_text()
    others = {0: "1-3", 1: "0,2-3", 2: "0-1,3", 3: "0-2"}[stuck]
    assert text.splitlines()[0] == f"collectives: ranks {others} wait in all_reduce #1; rank {stuck} never " \
                                   f"entered a collective and is in hang.py:7 {function}", text
    assert text.splitlines()[1].startswith(f"rank {stuck} (node-") and f"hang.py:7 {function}" in text
    report = json.loads((capture / "stacks.json").read_text())
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1, 2, 3] and report["missing_nodes"] == []
    odd, rest = report["groups"]
    assert odd["ranks"] == [stuck] and odd["frames"][-1]["function"] == function
    assert rest["frames"][-1]["function"] == "all_reduce"
    assert report["collectives"]["verdict"] == "behind"
    captures = [p for p in capture.parent.iterdir() if p.name not in ("faulthandler", "collectives")]
    assert captures == [capture]  # captured once
    logs = project.ok("logs").stdout
    assert "no rank wrote output for 10 s: the job looks hung" in logs and function in logs
    release.touch()
    assert _latest_run(project, "running")["stacks"] == run["stacks"]
    assert "output again: the job is no longer hung" in project.ok("logs").stdout
    project.ok("stop")


def test_an_attached_run_is_hung_in_status_from_another_terminal(project: LocalProject, tmp_path: Path) -> None:
    function, _ = _job(project, tmp_path / "never")
    attached = subprocess.Popen([str(MLENV), "launch", "--launcher", "torchrun", "--hang-timeout", "10", "hang.py"],
                                cwd=ROOT, env={**os.environ, "MLENV_HOME": str(project.home)},
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run = _latest_run(project, "hung")
        assert function in (Path(run["stacks"]) / "stacks.txt").read_text()
        project.ok("stop")
        output, _ = attached.communicate(timeout=120)
        assert "the job looks hung" in output and function in output  # told to the attached user
    finally:
        attached.kill()
        attached.wait()


def test_on_hang_stop_ends_the_job_with_124_through_make(project: LocalProject, tmp_path: Path) -> None:
    function, _ = _job(project, tmp_path / "never")
    made = make("launch", "SCRIPT=hang.py", "LAUNCHER=torchrun", "HANG_TIMEOUT=8", "ON_HANG=stop", home=project.home)
    assert made.returncode != 0 and "Error 124" in made.stderr, made.stdout[-3000:] + made.stderr[-3000:]
    assert "no rank wrote output for 8 s" in made.stdout and function in made.stdout


def test_bad_timeouts_exit_2_and_help_names_124(project: LocalProject) -> None:
    for value in ("0", "-5", "nan", "soon"):
        result = project.mlenv("launch", "--hang-timeout", value, "hang.py")
        assert result.returncode == 2, (value, result.stderr)
    assert "124" in project.ok("launch", "--help").stdout
    assert project.mlenv("launch", "--on-hang", "stop", "hang.py").returncode == 2  # no timeout to act on
    cluster_file = project.home / "clusters" / f"{project.name}.yaml"
    original = cluster_file.read_text()
    cluster_file.write_text(original + "launch:\n  hang_timeout: 20\n")
    try:
        dry = project.ok("launch", "--dry-run", "--on-hang", "stop", "hang.py").stdout
        assert "--hang-timeout 20 --on-hang stop --" in dry
        assert "--hang-timeout 7 " in project.ok("launch", "--dry-run", "--hang-timeout", "7", "hang.py").stdout
    finally:
        cluster_file.write_text(original)
