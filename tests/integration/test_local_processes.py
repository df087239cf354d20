"""The local backend without root: pods are directories, their processes share loopback."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.local_cluster import DONE, TINY_JOB, leftovers, make_project, require_local


def test_processes_mode_end_to_end(tmp_path: Path) -> None:
    require_local("processes")
    project = make_project(tmp_path, "lpr", "10.77.62.0/24", "processes")
    project.ok("deploy", project.name)
    pods = project.status()
    assert [(p["extra"]["mode"], p["extra"]["nic"], p["ip"]) for p in pods] == [("processes", "lo", "127.0.0.1")] * 2
    project.ok("sync", "--source", str(project.source({"tiny.py": TINY_JOB})))  # the recorded deployment
    topology = project.ok("exec", "--", "python3", "-m", "mlenv.runtime", "topology", "--json").stdout
    assert '[node-1] {"node_rank": 1, "num_nodes": 2, "procs_per_node": 2, "master_addr": "127.0.0.1"' in topology
    assert project.mlenv("exec", "--", "sh", "-c", "exit $MLENV_NODE_RANK").returncode == 1
    result = project.ok("launch", "--launcher", "torchrun", "tiny.py", timeout=90)
    assert DONE.search(result.stdout), result.stdout
    assert len(list((tmp_path / "runs").glob("*/node-1.log"))) == 1
    project.ok("clean", "--delete-data", "--yes")
    assert leftovers(project) == []
    assert json.loads((tmp_path / ".mlenv" / "state.json").read_text())["deployments"] == {}
