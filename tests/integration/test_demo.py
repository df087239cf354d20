"""`mlenv demo` end to end in a throw-away project: the suite's one DeepSpeed run. Two "nodes" on loopback
(local pods as processes, so it runs without root too) x two processes launch `train_multi_node.py` with ZeRO-2
on gloo through the runtime's DeepSpeed launcher. The demo also leaves behind exactly what it found: pod
workspaces an earlier clean kept, and the record of another deployment."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from tests._prereq import require
from tests.integration.local_cluster import ROOT, leftovers, make_project, require_local

DONE = re.compile(r"\bdone steps=(\d+) first_loss=([\d.]+) last_loss=([\d.]+) world_size=(\d+)")
OTHER_RECORD = {"cluster_file": "/srv/clusters/barcelona.yaml", "mode": "rdma", "nodes": 2, "image": None,
                "namespace": "nccl-test", "app": "ml-dev-env", "backend": "openshift"}


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
        demo = project.ok("demo", "--steps", "5", timeout=300)
    finally:
        project.mlenv("clean", "--cluster", "local")

    training = sorted((tmp_path / "runs").iterdir())[0]
    logs = [(training / f"node-{n}.log").read_text() for n in (0, 1)]
    assert "engine deepspeed zero_stage=2 backend gloo world_size 4" in "".join(logs)
    (done,) = DONE.findall("".join(logs))
    steps, first, last, world = int(done[0]), float(done[1]), float(done[2]), int(done[3])
    assert (steps, world) == (5, 4) and last < first, done
    # c10d gives global rank 0, which prints the result, to whichever node joins first
    assert "peak_busbw_gbps=" in "".join(p.read_text() for p in (tmp_path / "runs").glob("*/node-*.log"))
    assert "gloo over TCP sockets" in demo.stdout
    assert "clean up (the pod workspaces an earlier clean kept stay)" in demo.stderr

    assert results.read_text() == "a week of training\n"
    assert json.loads(record.read_text()) == OTHER_RECORD
    assert [item for item in leftovers(project) if not item.startswith("dir ")] == []
    assert [(p["phase"], p["detail"]) for p in project.status()] == [("Missing", "no pod; its workspace is kept")] * 2
    project.ok("clean", "--cluster", "local", "--delete-data", "--yes")
    assert leftovers(project) == []
