"""A node that stops answering without closing a connection (its supervisor and ranks SIGSTOPped, as a hung kernel
or a cut cable): on a local cluster of 2 nodes x 2 ranks, an attached launch names node 1 lost within the control
channel's silence (the cluster file's ``launch.node_silence``, 8 s here), stops node 0, and ends within 60 s of the
freeze; the run records node 1 unreachable."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import MLENV, ROOT
from tests.integration.local_cluster import LocalProject, make_project, require_local

JOB = """\
import time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
grad = torch.ones(4)
for step in range(3000):
    time.sleep(0.1)
    dist.all_reduce(grad)
"""


@pytest.fixture()
def project(tmp_path: Path) -> Iterator[LocalProject]:
    require_local("processes")
    deployed = make_project(tmp_path, "lfz", "10.77.77.0/24", "processes")
    cluster_file = deployed.home / "clusters" / "lfz.yaml"
    cluster_file.write_text(cluster_file.read_text() + "launch:\n  node_silence: 8\n")
    deployed.ok("deploy", deployed.name)
    deployed.ok("sync", "--source", str(deployed.source({"steps.py": JOB})))
    yield deployed
    deployed.mlenv("stop")
    deployed.mlenv("clean", "--delete-data", "--yes")


def _node_share(project: LocalProject, node: int, deadline: float = 120) -> tuple[int, Path]:
    """The supervisor of ``node`` and its cgroup (every process of its share), once its two ranks run."""
    until = time.monotonic() + deadline
    while True:
        found = sorted(project.home.rglob(f"attempt-0/node{node}/ranks.json"))
        if found and len(json.loads(found[0].read_text() or "[]")) >= 2:
            break
        assert time.monotonic() < until, "node 1's ranks never started"
        time.sleep(0.5)
    directory = found[0].parent
    return (int(json.loads((directory / "record.json").read_text())["pid"]),
            Path(json.loads((directory / "state.json").read_text())["cgroup"]))


def _signal(supervisor: int, cgroup: Path, number: int) -> None:
    """``number`` to the supervisor (while it is still ours: the runtime's) and to every process of its cgroup."""
    members = [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()] if cgroup.is_dir() else []
    with contextlib.suppress(OSError):
        if b"mlenv.runtime" in Path(f"/proc/{supervisor}/cmdline").read_bytes():
            members.append(supervisor)
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, number)


def test_a_frozen_node_is_named_lost_and_the_launch_ends(project: LocalProject) -> None:
    launch = subprocess.Popen([str(MLENV), "launch", "--launcher", "torchrun", "steps.py"], cwd=ROOT, text=True,
                              env={**os.environ, "MLENV_HOME": str(project.home)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    supervisor, cgroup = _node_share(project, 1)
    try:
        _signal(supervisor, cgroup, signal.SIGSTOP)
        froze = time.monotonic()
        out, err = launch.communicate(timeout=90)
        ended = time.monotonic() - froze
    finally:
        _signal(supervisor, cgroup, signal.SIGKILL)  # what the launch's own stop left, if anything
        launch.kill()
    assert launch.returncode not in (0, None) and ended < 60, (ended, out[-2000:], err[-3000:])
    assert "error: node-1 was lost (unreachable: node 0 heard nothing from it for 8 s); the other nodes were " \
           "stopped." in err, err[-3000:]
    assert "node 1 stopped answering (nothing heard for 8 s: frozen, or cut off)" in out + err
    run = json.loads(project.ok("status", "--json").stdout)["latest_run"]
    assert run["node_faults"]["1"]["sign"] == "unreachable", run["node_faults"]
