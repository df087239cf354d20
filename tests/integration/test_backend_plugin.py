"""Adding a backend touches one place: a throw-away backend defined here, registered with one registry entry,
runs deploy, status, exec, sync, launch (a real 2 x 2 torchrun job), logs, stop and clean through the unchanged
ops/ and cli/. Its "nodes" are directories on this machine; every command is an argv run locally."""

from __future__ import annotations

import json
import os
import shutil
import sys
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from mlenv.cli import main
from mlenv.config import schema
from mlenv.core.capabilities import Check, CopyTarget, Feature, Handle, Node, NodeStatus, Recorder, Request
from mlenv.core.fanout import FanoutJobs
from mlenv.core.registry import BACKENDS, BackendInfo
from mlenv.core.remote import script
from mlenv.plan import JobPlan

from tests._prereq import require
from tests.helpers import invoke as mlenv
from tests.integration.local_cluster import DONE, TINY_JOB


class DirectoryBackend(FanoutJobs):
    """Nodes are directories under ``<project>/nodes/<name>``; exec runs the remote wrapper locally."""

    name = "directories"

    def prepare(self, plan: JobPlan) -> Request:
        root = os.path.join(os.environ["MLENV_HOME"], "nodes", plan.name)  # the backend's own setting
        port = 20000 + zlib.crc32(root.encode()) % 20000
        env = {**plan.env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo",
               "NCCL_SOCKET_IFNAME": "lo"}
        nodes = [f"{root}/node-{i}" for i in range(plan.nodes)]
        handle = Handle(self.name, plan.name, plan.nodes, plan.mode, plan.storage.shared, env, {"nodes": nodes})
        text = yaml.safe_dump({"nodes": nodes}, sort_keys=False)
        return Request(handle, text, {"nodes.yaml": text}, nodes)

    def apply(self, request: Request, record: Recorder) -> Handle:
        record(request.handle)
        for directory in request.handle.data["nodes"]:
            Path(directory, "workspace").mkdir(parents=True, exist_ok=True)
        return request.handle

    def wait_ready(self, handle: Handle, timeout: float, record: Recorder) -> None:
        return None

    def status(self, handle: Handle) -> list[NodeStatus]:
        return [NodeStatus(Path(d).name, i, "localhost", "Running", True, 0, 0, "127.0.0.1")
                for i, d in enumerate(handle.data["nodes"]) if Path(d).is_dir()]

    def nodes(self, handle: Handle) -> list[Node]:
        return [Node(i, Path(d).name, f"{d}/workspace", "127.0.0.1", True) for i, d in enumerate(handle.data["nodes"])
                if Path(d).is_dir()]

    def exec_argv(self, handle: Handle, node: Node, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  interactive: bool = False, stop_on_stdin_eof: bool = False,
                  secrets: Sequence[str] = ()) -> list[str]:
        variables = {**handle.env, "MLENV_NODE_RANK": str(node.ordinal), "HOSTNAME": node.name,
                     "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **(env or {})}
        return ["env", *(f"{k}={v}" for k, v in variables.items()), "sh", "-c",
                script(stop_on_stdin_eof=stop_on_stdin_eof, secrets=secrets), "sh", node.workspace, *argv]

    def copy_target(self, handle: Handle, node: Node) -> CopyTarget:
        return CopyTarget(destination=f"{node.workspace}/")

    def data_volumes(self, handle: Handle) -> list[str]:
        return [d for d in handle.data["nodes"] if Path(d).is_dir()]

    def clean(self, handle: Handle, delete_data: bool) -> None:
        if delete_data:
            for directory in handle.data["nodes"]:
                shutil.rmtree(directory, ignore_errors=True)

    def checks(self, plan: JobPlan) -> list[Check]:
        return [Check("sh", "PASS" if shutil.which("sh") else "FAIL", shutil.which("sh") or "no sh")]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project whose cluster file names the throw-away backend, registered for this test only."""
    monkeypatch.setitem(BACKENDS, "directories", BackendInfo("directories", f"{__name__}:DirectoryBackend",
                                                             cpu_nodes=True))
    schema.cluster_schema.cache_clear()
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "clusters").mkdir()
    (tmp_path / "manifests").mkdir()
    (tmp_path / "clusters" / "dirs.yaml").write_text(
        "backend: directories\ncluster: {name: dirs}\ngpus: {per_node: 0, default_nodes: 2, procs_per_node: 2}\n"
        "env: {OMP_NUM_THREADS: '1'}\n")
    yield tmp_path
    monkeypatch.undo()
    schema.cluster_schema.cache_clear()


def test_a_backend_from_a_test_module_runs_every_verb(project: Path) -> None:
    require("torch", "rsync")
    assert mlenv("render", "dirs").stdout == mlenv("deploy", "dirs", "--dry-run").stdout
    deployed = mlenv("deploy", "dirs")
    assert deployed.exit_code == 0, deployed.output
    recorded = json.loads((project / ".mlenv" / "state.json").read_text())
    assert recorded["current"] == "dirs" and recorded["deployments"]["dirs"]["backend"] == "directories"
    status = json.loads(mlenv("status", "--json").stdout)
    assert [pod["pod"] for pod in status["pods"]] == ["node-0", "node-1"]

    executed = mlenv("exec", "--", "sh", "-c", "echo rank=$MLENV_NODE_RANK threads=$OMP_NUM_THREADS")
    assert executed.exit_code == 0, executed.output
    assert sorted(executed.stdout.splitlines()) == ["[node-0] rank=0 threads=1", "[node-1] rank=1 threads=1"]

    source = project / "src"
    source.mkdir()
    (source / "tiny.py").write_text(TINY_JOB)
    synced = mlenv("sync", "--source", str(source), "--json")
    assert synced.exit_code == 0 and json.loads(synced.stdout)["ok"], synced.output
    assert (project / "nodes" / "dirs" / "node-1" / "workspace" / "tiny.py").is_file()

    launched = mlenv("launch", "--launcher", "torchrun", "tiny.py")
    assert launched.exit_code == 0, launched.output
    assert DONE.search(launched.stdout), launched.stdout
    logs = mlenv("logs")  # the latest run's output on every node
    assert logs.exit_code == 0 and "done world_size=4" in logs.stdout, logs.output
    assert mlenv("stop").stdout.count("nothing to stop") == 2

    cleaned = mlenv("clean", "--delete-data", "--yes")
    assert cleaned.exit_code == 0, cleaned.output
    assert not (project / "nodes" / "dirs" / "node-0").exists()
    assert json.loads((project / ".mlenv" / "state.json").read_text())["deployments"] == {}


def test_a_capability_the_backend_lacks_is_one_line_exit_2(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Registered without Jobs: launch and stop say what to use instead; deploy, status and exec still work, and
    status --all shows no traceback."""
    monkeypatch.setitem(BACKENDS, "directories", BackendInfo("directories", f"{__name__}:DirectoryBackend",
                                                             cpu_nodes=True,
                                                             unsupported={Feature.JOBS: "run the job with mlenv "
                                                                          "exec on every node"}))
    assert mlenv("deploy", "dirs").exit_code == 0
    for verb in (["launch", "tiny.py"], ["stop"]):
        refused = CliRunner().invoke(main, verb)
        assert refused.exit_code == 2, refused.output
        assert refused.output == ("error: the directories backend cannot launch, follow or stop jobs; run the job "
                                  "with mlenv exec on every node\n")
    assert mlenv("exec", "--", "true").exit_code == 0
    everything = mlenv("status", "--all", "--json")
    assert everything.exit_code == 0 and json.loads(everything.stdout)["deployments"][0]["pods"], everything.output

    info = BACKENDS.pop("directories")  # its code is gone: status --all says so for it, without a traceback
    try:
        gone = CliRunner().invoke(main, ["status", "--all", "--json"])
    finally:
        BACKENDS["directories"] = info
    assert gone.exit_code == 1 and "Traceback" not in gone.output, gone.output
    (report,) = json.loads(gone.stdout)["deployments"]
    assert report["error"].startswith("unknown backend 'directories'"), report
    assert mlenv("clean", "--delete-data", "--yes").exit_code == 0
