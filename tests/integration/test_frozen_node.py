"""A node that stops answering without closing a connection (its supervisor and ranks SIGSTOPped, as a hung kernel
or a cut cable): on a local cluster of 2 nodes x 2 ranks, an attached launch names node 1 lost within the control
channel's silence (the cluster file's ``launch.node_silence``, 8 s here), stops node 0, and ends within 60 s of the
freeze; the run records node 1 unreachable. A detached run whose node 0 freezes names node 0 within 30 s, node 1
stops for it (its own record says stopped: it is not the failure named) and does not restart into a rendezvous that
cannot happen: the run never reads ``running`` again."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def node_share(root: Path, node: int, since: float, deadline: float = 120) -> list[int]:
    """Pidfds (never a pid that is reused later) of node ``node``'s share (its supervisor and every process of its
    cgroup, else its ranks: a supervisor in a Slurm step makes no cgroup) of the run under ``root`` that started
    after ``since`` (seconds since the epoch), once its two ranks run. The supervisor's recorded pid is the one of
    its own PID namespace (an ssh machine's): it is the process of the share's namespace with that pid there, and
    only while it runs the runtime."""
    until = time.monotonic() + deadline
    while True:
        found = [path for path in root.rglob(f"attempt-0/node{node}/ranks.json") if path.stat().st_mtime >= since]
        ranks = json.loads(found[0].read_text() or "[]") if found else []
        if len(ranks) >= 2 and all(rank["pid"] for rank in ranks):  # a rank is recorded (pid 0) before it started
            break
        assert time.monotonic() < until, f"node {node}'s ranks never started"
        time.sleep(0.5)
    directory = found[0].parent
    cgroup = json.loads((directory / "state.json").read_text())["cgroup"]
    members = [int(pid) for pid in Path(cgroup, "cgroup.procs").read_text().split()] if cgroup else [
        rank["pid"] for rank in json.loads((directory / "ranks.json").read_text()) if rank["state"] == "running"]
    assert members, "nothing of the node's share runs"
    recorded = int(json.loads((directory / "record.json").read_text())["pid"])
    namespace = os.readlink(f"/proc/{members[0]}/ns/pid")
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            nspids = next(line for line in (proc / "status").read_text().splitlines() if line.startswith("NSpid:"))
            if (int(nspids.split()[-1]) == recorded and os.readlink(proc / "ns" / "pid") == namespace
                    and b"mlenv.runtime" in (proc / "cmdline").read_bytes()):
                members.append(int(proc.name))
    pidfds = []
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            pidfds.append(os.pidfd_open(pid))
    return pidfds


def signal_share(pidfds: list[int], number: int) -> None:
    """``number`` to each process of a node's share (:func:`node_share`) that still runs."""
    for pidfd in pidfds:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, number)


def freeze_node_1(argv: list[str], cwd: Path, env: dict[str, str],
                  root: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the attached launch ``argv`` and freeze node 1's share (SIGSTOP) once its ranks run (its records under
    ``root``): how the launch ended, and the seconds from the freeze to its end. What the launch's own stop left of
    the share is killed after."""
    since = time.time()
    launch = subprocess.Popen(argv, cwd=cwd, text=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    share: list[int] = []
    try:
        share = node_share(root, 1, since)
        signal_share(share, signal.SIGSTOP)
        froze = time.monotonic()
        out, err = launch.communicate(timeout=90)
        ended = time.monotonic() - froze
    finally:
        signal_share(share, signal.SIGKILL)
        launch.kill()
    return subprocess.CompletedProcess(argv, launch.returncode, out, err), ended


def test_a_frozen_node_is_named_lost_and_the_launch_ends(project: LocalProject) -> None:
    done, ended = freeze_node_1([str(MLENV), "launch", "--launcher", "torchrun", "steps.py"], ROOT,
                                {**os.environ, "MLENV_HOME": str(project.home)}, project.home)
    out, err = done.stdout, done.stderr
    assert done.returncode != 0 and ended < 60, (ended, out[-2000:], err[-3000:])
    assert "error: node-1 was lost (unreachable: node 0 heard nothing from it for 8 s); the other nodes were " \
           "stopped." in err, err[-3000:]
    assert "node 1 stopped answering (nothing heard for 8 s: frozen, or cut off)" in out + err
    run = json.loads(project.ok("status", "--json").stdout)["latest_run"]
    assert run["node_faults"]["1"]["sign"] == "unreachable", run["node_faults"]


def test_a_frozen_node_0_of_a_detached_run_is_named_and_the_run_reads_running_no_more(project: LocalProject) -> None:
    since = time.time()
    project.ok("launch", "--launcher", "torchrun", "--detach", "--max-restarts", "1", "steps.py")
    share = node_share(project.home, 0, since)
    try:
        signal_share(share, signal.SIGSTOP)
        froze = time.monotonic()
        while "0" not in (run := latest_run(project))["node_faults"]:
            assert time.monotonic() - froze < 30, run
            time.sleep(0.5)
        assert run["node_faults"]["0"] == {"sign": "unreachable", "evidence": "node 1 heard nothing from it for 8 s"}
        (log,) = [path for path in project.home.rglob("attempt-0/node1/output.log") if path.stat().st_mtime >= since]
        refused = ("mlenv: node-0 must be left out of the run (unreachable: node 1 heard nothing from it for 8 s): not "
                   "restarting it (node 0 holds the rendezvous, which a standby cannot take over: no rendezvous host "
                   "is left)")
        while refused not in log.read_text():  # node 1 ended and decided: every read meanwhile is not running
            assert run["state"] == "failed" and time.monotonic() - froze < 90, (run, log.read_text()[-2000:])
            run = latest_run(project)
        said = json.loads(project.ok("status", "--json").stdout)
        assert (said["latest_run"]["state"], said["latest_run"]["attempt"]) == ("failed", 0), said["latest_run"]
        assert said["run_states"] == {"0": "failed", "1": "stopped (1)"}, said["run_states"]
        own = json.loads((log.parent / "state.json").read_text())  # node 1's own record says so, as status does
        assert (own["state"], own["lost_nodes"]) == ("stopped", {"0": run["node_faults"]["0"]}), own
        assert not list(project.home.rglob("attempt-1/node*/record.json"))  # no node restarted
    finally:
        signal_share(share, signal.SIGKILL)


def latest_run(project: LocalProject) -> dict[str, Any]:
    """``status --json``'s ``latest_run``."""
    return dict(json.loads(project.ok("status", "--json").stdout)["latest_run"] or {"node_faults": {}})
