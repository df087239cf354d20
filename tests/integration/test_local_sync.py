"""`mlenv sync` for real, to local pods: incremental, excludes, .mlenvignore, --delete only when asked, the
in-pod runtime shipped, one copy for a shared (RWX) workspace, and the tar stream when a pod has no rsync."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
from mlenv.backends.base import CopyTarget, Pod
from mlenv.backends.local.backend import LocalBackend
from mlenv.config import load_cluster
from mlenv.ops.sync import sync
from mlenv.plan import Deployment, plan

from tests.integration.local_cluster import LocalProject, make_project, require_local

FILES = {
    "train.py": "print('hi')\n",
    "data/config.json": "{}\n",
    "data/big.ckpt": "weights\n",
    "logs/run.log": "old\n",
    ".git/HEAD": "ref\n",
    "pkg/__pycache__/m.cpython-311.pyc": "x",
    "pkg/m.pyc": "x",
    "pkg/m.py": "x = 1\n",
    ".DS_Store": "x",
    ".mlenvignore": "*.ckpt\nlogs/\n",
}


def _sync(project: LocalProject, source: Path, *extra: str) -> dict[str, object]:
    return dict(json.loads(project.ok("sync", "--cluster", project.name, "--source", str(source), "--json",
                                      *extra).stdout))


def _tree(root: Path) -> set[str]:
    relative = (p.relative_to(root) for p in root.rglob("*") if p.is_file())
    return {str(p) for p in relative if p.parts[0] != ".mlenv"}


@pytest.fixture
def project(tmp_path: Path) -> Iterator[LocalProject]:
    require_local("processes")
    deployed = make_project(tmp_path, "lsy", "10.77.63.0/24", "processes")
    deployed.ok("deploy", deployed.name)
    yield deployed
    deployed.mlenv("clean", "--cluster", deployed.name, "--delete-data", "--yes")


def test_incremental_with_excludes_and_runtime(project: LocalProject) -> None:
    source = project.source(FILES)
    first = _sync(project, source)
    assert first["ok"] and [p["method"] for p in first["pods"]] == ["rsync", "rsync"]  # type: ignore[union-attr]
    for ordinal in (0, 1):
        workspace = project.pod_dir(ordinal) / "workspace"
        assert _tree(workspace) == {"train.py", "data/config.json", "pkg/m.py", ".mlenvignore"}
        assert (workspace / ".mlenv" / "mlenv" / "runtime" / "__main__.py").is_file()
        assert not list((workspace / ".mlenv").rglob("__pycache__"))
    second = _sync(project, source)
    assert [p["files"] for p in second["pods"]] == [0, 0]  # type: ignore[union-attr]
    (source / "train.py").write_text("print('changed')\n")
    third = _sync(project, source)
    assert [p["files"] for p in third["pods"]] == [1, 1]  # type: ignore[union-attr]


def test_delete_only_when_asked(project: LocalProject) -> None:
    source = project.source(FILES)
    _sync(project, source)
    (source / "train.py").unlink()
    _sync(project, source)
    workspace = project.pod_dir(1) / "workspace"
    assert (workspace / "train.py").is_file()
    _sync(project, source, "--delete")
    assert not (workspace / "train.py").exists()
    assert (workspace / ".mlenv" / "mlenv" / "runtime" / "__main__.py").is_file()  # the runtime survives


def test_shared_workspace_is_synced_once(tmp_path: Path) -> None:
    require_local("processes")
    shared = make_project(tmp_path, "lsh", "10.77.64.0/24", "processes", storage="storage:\n  mode: rwx\n")
    shared.ok("deploy", shared.name)
    try:
        report = _sync(shared, shared.source({"train.py": "x\n"}))
        methods = [p["method"] for p in report["pods"]]  # type: ignore[union-attr]
        assert methods == ["rsync", f"shared with {shared.app}-0"]
        out = shared.ok("exec", "--cluster", shared.name, "--", "sh", "-c", "pwd; ls").stdout
        assert out.count("shared-workspace") == 2 and out.count("train.py") == 2
    finally:
        shared.mlenv("clean", "--cluster", shared.name, "--delete-data", "--yes")
    assert not (tmp_path / ".mlenv" / "local" / "lsh-ns").exists()


class NoRsyncPods(LocalBackend):
    """Local pods reached through a remote shell whose PATH has no rsync: sync must stream tar over exec."""

    def __init__(self, tools: Path) -> None:
        self.tools = tools

    def copy_target(self, deployment: Deployment, pod: Pod) -> CopyTarget:
        return CopyTarget(destination=f"{pod.name}:{pod.workspace}/", rsh=["false"])

    def exec_argv(self, deployment: Deployment, pod: Pod, argv: Sequence[str], *,
                  env: Mapping[str, str] | None = None, interactive: bool = False) -> list[str]:
        return super().exec_argv(deployment, pod, argv, env={**(env or {}), "PATH": str(self.tools)})


def test_tar_stream_when_the_pod_has_no_rsync(project: LocalProject, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("sh", "tar", "mkdir", "date"):
        (tools / tool).symlink_to(next(Path(d) / tool for d in os.environ["PATH"].split(os.pathsep)
                                       if (Path(d) / tool).is_file()))
    monkeypatch.setenv("MLENV_HOME", str(project.home))
    deployment = plan(load_cluster(project.name))
    report = sync(NoRsyncPods(tools), deployment, source=project.source(FILES), as_json=True)
    assert report.ok and [p.method for p in report.pods] == ["tar", "tar"]
    workspace = project.pod_dir(1) / "workspace"
    assert _tree(workspace) == {"train.py", "data/config.json", "pkg/m.py", ".mlenvignore"}
    assert (workspace / ".mlenv" / "mlenv" / "runtime" / "__main__.py").is_file()
