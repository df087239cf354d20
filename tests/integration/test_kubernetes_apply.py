"""What deploy sends is what render prints, and the NetworkPolicy among it: through the real kubectl against
fakekube, and the ``mlenv`` CLI in-process (fixtures of test_openshift_backend)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.fakekube.api import APPLY
from tests.fakekube.fixtures import FakeCluster, fake_kube_factory  # noqa: F401 - the fixture, re-exported
from tests.helpers import MLENV, ROOT
from tests.integration.test_openshift_backend import (  # noqa: F401 - fixtures, re-exported
    APP,
    NAMESPACE,
    cluster_file,
    fake,
    fast_polling,
    mlenv,
    names,
)

SELECTOR = {"app": f"{APP}-multi", "app.kubernetes.io/instance": APP}
POLICY = f"{APP}-same-deployment"


@pytest.fixture
def applied(fake: FakeCluster, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:  # noqa: F811
    """The body of every server-side apply the fake serves, in order: a spy on the fake API server (its request
    log keeps no bodies), never on mlenv."""
    bodies: list[dict[str, Any]] = []
    serve = fake.server.api.patch

    def patch(rt: Any, namespace: str, name: str, content_type: str, body: Any, manager: str | None,
              dry_run: bool = False) -> tuple[dict[str, Any], bool]:
        if content_type == APPLY:
            bodies.append(copy.deepcopy(body))
        return serve(rt, namespace, name, content_type, body, manager, dry_run)

    monkeypatch.setattr(fake.server.api, "patch", patch)
    return bodies


def _security(path: str, **settings: Any) -> str:
    """``path`` with these ``security:`` settings added."""
    document = yaml.safe_load(Path(path).read_text())
    document["security"].update(settings)
    Path(path).write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def _recorded_kinds(home: Path) -> list[str]:
    state = json.loads((home / ".mlenv" / "state.json").read_text())
    return list(state["deployments"]["fake"]["handle"]["data"]["kinds"])


def test_network_policy_admits_only_the_deployments_own_pods_and_clean_deletes_it(
        fake: FakeCluster, home: Path) -> None:  # noqa: F811
    path = cluster_file(home, fake)
    deployed = mlenv("deploy", path)
    assert deployed.exit_code == 0, deployed.output
    [policy] = fake.server.objects("networkpolicies", NAMESPACE)
    assert policy["metadata"]["name"] == POLICY
    assert policy["spec"] == {"podSelector": {"matchLabels": SELECTOR}, "policyTypes": ["Ingress"],
                              "ingress": [{"from": [{"podSelector": {"matchLabels": SELECTOR}}]}]}  # every port
    pods = fake.server.objects("pods", NAMESPACE)
    assert len(pods) == 2 and all(SELECTOR.items() <= pod["metadata"]["labels"].items() for pod in pods)
    assert "networkpolicy" in _recorded_kinds(home)

    fake.server.requests.clear()
    cleaned = mlenv("clean", "--yes")
    assert cleaned.exit_code == 0, cleaned.output
    assert names(fake, "networkpolicies") == []
    deletes = fake.server.requests.records(resource="networkpolicies", verb="deletecollection")
    deletes += fake.server.requests.records(resource="networkpolicies", verb="delete")
    assert deletes and all(record.status == 200 for record in deletes)


def test_network_policy_false_leaves_it_out(fake: FakeCluster, home: Path,  # noqa: F811
                                            applied: list[dict[str, Any]]) -> None:
    path = _security(cluster_file(home, fake), network_policy=False)
    deployed = mlenv("deploy", path)
    assert deployed.exit_code == 0, deployed.output
    assert [body["kind"] for body in applied] == ["ServiceAccount", "Service", "StatefulSet"]
    assert names(fake, "networkpolicies") == []
    assert "networkpolicy" not in _recorded_kinds(home)


def test_turning_the_network_policy_off_removes_it(fake: FakeCluster, home: Path) -> None:  # noqa: F811
    path = cluster_file(home, fake)
    assert mlenv("deploy", path).exit_code == 0
    assert mlenv("deploy", _security(path, network_policy=False)).exit_code == 0
    assert names(fake, "networkpolicies") == []


@pytest.mark.parametrize("backend", ["kubernetes", "openshift"])
def test_render_equals_dry_run_equals_what_apply_sends(fake: FakeCluster, home: Path,  # noqa: F811
                                                       applied: list[dict[str, Any]], backend: str) -> None:
    path = cluster_file(home, fake, backend=backend, storage="rwx")
    fake.server.requests.clear()
    rendered = mlenv("render", path)
    dry_runs = [mlenv("deploy", path, "--dry-run") for _ in range(2)]
    assert rendered.exit_code == 0 and all(run.exit_code == 0 for run in dry_runs), rendered.output
    assert dry_runs[0].stdout_bytes == dry_runs[1].stdout_bytes == rendered.stdout_bytes
    assert fake.server.requests.api_calls() == []  # a dry run asks nothing of the cluster
    assert not (home / ".mlenv" / "state.json").exists()  # and records nothing

    deployed = mlenv("deploy", path)
    assert deployed.exit_code == 0, deployed.output
    objects = list(yaml.safe_load_all(rendered.stdout))
    assert [o["kind"] for o in objects] == ["ServiceAccount", "PersistentVolumeClaim", "PersistentVolumeClaim",
                                            "Service", "NetworkPolicy", "StatefulSet"]
    assert applied == objects  # object for object, field for field, in order


def test_local_dry_runs_are_byte_identical_and_change_nothing(tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "clusters").mkdir(parents=True)
    shutil.copy(ROOT / "clusters" / "local.yaml", project / "clusters" / "local.yaml")

    def mlenv_out(*args: str) -> bytes:
        done = subprocess.run([str(MLENV), *args], cwd=project, capture_output=True, timeout=120, check=False,
                              env={**os.environ, "MLENV_HOME": str(project)})
        assert done.returncode == 0, done.stderr
        return done.stdout

    first, second = mlenv_out("deploy", "local", "--dry-run"), mlenv_out("deploy", "local", "--dry-run")
    assert first == second == mlenv_out("render", "local")
    assert b"backend: local" in first
    assert sorted(p.name for p in project.iterdir()) == ["clusters"]  # no state, no pod directories
