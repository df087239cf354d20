"""`mlenv demo` end to end in a throw-away project: the suite's one DeepSpeed run. Two "nodes" on loopback
(local pods as processes, so it runs without root too) x two processes launch `train_multi_node.py` with ZeRO-2
on gloo through the runtime's DeepSpeed launcher. The demo also leaves behind exactly what it found: pod
workspaces an earlier clean kept, and the record of another deployment."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests._prereq import require
from tests.helpers import ROOT
from tests.integration.local_cluster import leftovers, make_project, require_local

DONE = re.compile(r"\bdone steps=(\d+) first_loss=([\d.]+) last_loss=([\d.]+) world_size=(\d+)")
OTHER_HANDLE = {"backend": "openshift", "name": "barcelona", "nodes": 2, "mode": "rdma", "shared_workspace": False,
                "env": {}, "data": {"app": "ml-dev-env", "namespace": "nccl-test", "flavour": "oc", "api": None,
                                    "cluster_name": "barcelona", "cluster_file": "/srv/clusters/barcelona.yaml",
                                    "kinds": ["statefulset"], "service_account": "ml-dev-sa", "ipc_lock_scc": None}}
OTHER_RECORD = {"version": 2, "current": "barcelona", "deployments": {"barcelona": {
    "name": "barcelona", "backend": "openshift", "cluster_file": "/srv/clusters/barcelona.yaml", "mode": "rdma",
    "nodes": 2, "image": None, "handle": OTHER_HANDLE, "runs": []}}, "jobs": {}}


PR_SET_CHILD_SUBREAPER = 36


@contextmanager
def adopting_orphans() -> Iterator[None]:
    """Make this process the reaper of its descendants' orphans (Linux prctl), for the duration."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _children() -> dict[int, str]:
    """The command lines of this process's live children (orphans it adopted included), by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split() if stat else []
        if fields and int(fields[1]) == os.getpid() and fields[0] != "Z":
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return found


def test_demo_trains_and_leaves_what_it_found(tmp_path: Path) -> None:
    require_local("processes")
    require("deepspeed")
    project = make_project(tmp_path, "local", "10.77.65.0/24", "processes")
    shutil.copytree(ROOT / "workspace", tmp_path / "workspace")
    project.ok("deploy", "local")
    results = project.pod_dir(0) / "workspace" / "results.txt"
    results.write_text("a week of training\n")
    project.ok("clean")  # pods gone, workspaces kept
    record = tmp_path / ".mlenv" / "state.json"
    record.write_text(json.dumps(OTHER_RECORD))
    try:
        with adopting_orphans():  # whatever make demo leaves running would become our child
            before = _children()  # other tests' harnesses (a session's Slurm daemons) are ours already
            demo = subprocess.run(["make", "-s", "demo", "STEPS=5"], cwd=ROOT, capture_output=True, text=True,
                                  timeout=600, env={**os.environ, "MAKEFLAGS": "", "MLENV_HOME": str(tmp_path)},
                                  check=False)
            left = [line for pid, line in _children().items() if pid not in before]
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert left == [], left  # make demo returned only after every process it started had exited
    finally:
        project.mlenv("clean", "--cluster", "local")

    training = sorted((tmp_path / "runs").iterdir())[0]
    logs = [(training / f"node-{n}.log").read_text() for n in (0, 1)]
    assert "engine deepspeed zero_stage=2 backend gloo world_size 4" in "".join(logs)
    (done,) = DONE.findall("".join(logs))
    steps, first, last, world = int(done[0]), float(done[1]), float(done[2]), int(done[3])
    assert (steps, world) == (5, 4) and last < first, done
    # global rank 0, on node 0, prints the result
    assert "peak_busbw_gbps=" in "".join(p.read_text() for p in (tmp_path / "runs").glob("*/node-*.log"))
    assert "gloo over TCP sockets" in demo.stdout
    assert "clean up (the pod workspaces an earlier clean kept stay)" in demo.stderr

    assert results.read_text() == "a week of training\n"
    assert json.loads(record.read_text()) == OTHER_RECORD
    assert [item for item in leftovers(project) if not item.startswith("dir ")] == []
    assert [(p["phase"], p["detail"]) for p in project.status()] == [("Missing", "no pod; its workspace is kept")] * 2
    project.ok("clean", "--cluster", "local", "--delete-data", "--yes")
    assert leftovers(project) == []
