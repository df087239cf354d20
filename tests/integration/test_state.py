"""Several deployments in .mlenv/state.json: recorded by name with their handle, `use` switches, `status --all`;
the file of earlier versions is migrated; a corrupt or foreign-shaped file is one clear error and changes nothing;
commands work from the recorded handle when the cluster file has changed or no longer validates."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import MLENV, ROOT, lock_held, said_until
from tests.integration.local_cluster import LocalProject, make_project, require_local

SECOND = """\
backend: local
cluster: {name: two, namespace: two-ns}
gpus: {per_node: 0, default_nodes: 1, procs_per_node: 1}
local: {isolation: processes}
"""


@pytest.fixture
def project(tmp_path: Path) -> Iterator[LocalProject]:
    require_local("processes")
    deployed = make_project(tmp_path, "one", "10.77.67.0/24", "processes")
    deployed.ok("deploy", "one")
    yield deployed
    for name in ("one", "two"):
        deployed.mlenv("clean", "--cluster", name, "--delete-data", "--yes")


def _state(project: LocalProject) -> dict[str, object]:
    return dict(json.loads((project.home / ".mlenv" / "state.json").read_text()))


def test_several_deployments_use_and_status_all(project: LocalProject) -> None:
    (project.home / "clusters" / "two.yaml").write_text(SECOND)
    project.ok("deploy", "-c", "two")
    assert _state(project)["current"] == "two"
    assert sorted(_state(project)["deployments"]) == ["one", "two"]  # type: ignore[call-overload]
    assert json.loads(project.ok("status", "--json").stdout)["name"] == "two"
    project.ok("use", "one")
    assert json.loads(project.ok("status", "--json").stdout)["name"] == "one"
    project.ok("use", str(project.home / "clusters" / "two.yaml"))  # by its file, too
    assert _state(project)["current"] == "two"
    every = json.loads(project.ok("status", "--all", "--json").stdout)["deployments"]
    assert [(d["name"], d["current"], len(d["pods"])) for d in every] == [("one", False, 2), ("two", True, 1)]
    unknown = project.mlenv("use", "three")
    assert unknown.returncode == 2 and "no deployment three is recorded (recorded: one, two)" in unknown.stderr
    project.ok("clean", "--cluster", "two", "--delete-data", "--yes")
    assert _state(project)["current"] == "one"  # the current one moved to the one left


def test_the_recorded_handle_works_when_the_file_changed_or_broke(project: LocalProject) -> None:
    path = project.home / "clusters" / "one.yaml"
    path.write_text(path.read_text().replace("default_nodes: 2", "default_nodes: 5"))
    assert len(json.loads(project.ok("status", "--json").stdout)["pods"]) == 2  # what was deployed
    path.write_text("cluster: [this is not a cluster file\n")
    assert project.mlenv("validate", str(path)).returncode == 2
    out = project.ok("exec", "--", "sh", "-c", "echo $MLENV_NODE_RANK").stdout
    assert sorted(out.splitlines()) == ["[node-0] 0", "[node-1] 1"]
    project.ok("clean", "--delete-data", "--yes")  # no pod left behind because the file broke
    assert not project.pod_dir(0).exists() and not project.pod_dir(1).exists()


@pytest.mark.parametrize(("content", "why"), [
    ("[]", "expected a JSON object, got list"),
    ("null", "expected a JSON object, got NoneType"),
    ('{"version": 2, "current": "one", "deployments": {"one": {"name": 3}}}', "unexpected shape"),
    ('{"version": 2, "current": "x", "deployments": {}}', "current deployment 'x' is not recorded"),
    ("{not json", "invalid JSON"),
])
def test_a_corrupt_state_file_is_one_error_and_changes_nothing(project: LocalProject, content: str,
                                                                 why: str) -> None:
    state = project.home / ".mlenv" / "state.json"
    state.write_text(content)
    for args in (["status"], ["clean", "--delete-data", "--yes"], ["clean", "--cluster", "one", "--yes"],
                 ["deploy", "one"], ["use", "one"]):
        result = project.mlenv(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.count("\n") == 1 and why in result.stderr and f"{state}" in result.stderr
        assert "Traceback" not in result.stderr
    assert state.read_text() == content
    assert (project.pod_dir(0) / "workspace").is_dir() and (project.pod_dir(1) / "workspace").is_dir()


def test_a_directory_as_state_file(project: LocalProject) -> None:
    state = project.home / ".mlenv" / "state.json"
    state.unlink()
    state.mkdir()
    result = project.mlenv("status")
    assert result.returncode == 2 and "not a regular file" in result.stderr


def test_the_file_of_earlier_versions_is_migrated(project: LocalProject) -> None:
    state = project.home / ".mlenv" / "state.json"
    state.write_text(json.dumps({"cluster_file": str(project.home / "clusters" / "one.yaml"), "mode": "tcp",
                                 "nodes": 2, "image": None, "namespace": "one-ns", "app": "one-app",
                                 "backend": "local"}))
    assert len(json.loads(project.ok("status", "--json").stdout)["pods"]) == 2
    migrated = _state(project)
    assert migrated["version"] == 2 and migrated["current"] == "one"


def test_a_bad_recorded_value_blames_the_record(project: LocalProject) -> None:
    state = project.home / ".mlenv" / "state.json"
    record = json.loads(state.read_text())
    record["deployments"]["one"]["nodes"] = 99999999999
    state.write_text(json.dumps(record))
    result = project.mlenv("deploy")  # again, as recorded
    assert result.returncode == 2
    assert f"the deployment one recorded in {state} has nodes 99999999999 (expected 1-1024)" in result.stderr
    assert "--nodes" not in result.stderr


def test_two_deploys_at_once_wait_for_each_other(project: LocalProject) -> None:
    env = {"MLENV_HOME": str(project.home)}
    with lock_held(project.home / ".mlenv" / "deploy-one.lock"):
        second = subprocess.Popen([str(MLENV), "deploy", "one"], cwd=ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env={**os.environ, **env},
                                  stdin=subprocess.DEVNULL)
        # the deploy says it waits, and waits (never half-way) until the lock is free
        said = said_until(second, "waiting for another mlenv to finish with one")
        assert second.poll() is None, "".join(said)
    _, rest = second.communicate(timeout=120)
    assert second.returncode == 0, "".join(said) + rest
    assert "waiting for another mlenv to finish with one" in said[-1], "".join(said) + rest
