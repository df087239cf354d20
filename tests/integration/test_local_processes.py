"""The local backend without root: pods are directories, their processes share loopback."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.local_cluster import DONE, TINY_JOB, leftovers, make_project, require_local, torchless_nodes


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


def test_a_launch_on_nodes_without_torch_is_refused_before_anything_starts(tmp_path: Path) -> None:
    require_local("processes")
    project = make_project(tmp_path, "lnt", "10.77.63.0/24", "processes")
    runner, nodes = torchless_nodes(tmp_path / "pythons")
    project.ok("deploy", project.name)
    unsynced = project.mlenv("launch", "tiny.py", python=runner)  # no runtime on the nodes to answer: test -f does
    assert (unsynced.returncode, unsynced.stderr) == (2, f"error: tiny.py: no such file in the workspace of node-0 "
                                                         f"({project.app}-0), node-1 ({project.app}-1): mlenv sync "
                                                         "copies workspace/ (or --source DIR) to the nodes\n")
    project.ok("sync", "--source", str(project.source({"tiny.py": TINY_JOB})))
    for launcher, lacking in (("torchrun", "torch is"), ("deepspeed", "torch and deepspeed are")):
        refused = project.mlenv("launch", "--launcher", launcher, "tiny.py", python=runner)
        assert (refused.returncode, refused.stdout, refused.stderr) == (
            2, "", f"error: {lacking} not installed in node-0's and node-1's Python ({nodes}): make install-train\n")
    assert not (tmp_path / "runs").exists() and json.loads(project.ok("status", "--json").stdout)["runs"] == []
    assert not list(project.pod_dir(0).glob("workspace/.mlenv/runs/*"))  # nothing started on a node
    project.ok("clean", "--delete-data", "--yes")
    assert leftovers(project) == []
