"""Kubernetes keeps a deployment's pods off its excluded nodes: the node affinity ``deploy`` renders and the merge
patch ``launch`` sends to bring a live StatefulSet to a run's exclusions (backends/kubernetes/exclusion.py), the
same patch a detached run sends itself (runtime/supervise/kubemove.py) and what it needs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mlenv.backends.kubeapi.naming import kube_deployment
from mlenv.backends.kubernetes.exclusion import moved_by_a_run
from mlenv.backends.kubernetes.render import owned_kinds, render
from mlenv.plan import plan
from mlenv.runtime.records.runlayout import LEFT_OUT, LEFT_OUT_ANNOTATION, MOVES_PODS
from mlenv.runtime.supervise.kubemove import moved, recorded
from mlenv.runtime.supervise.podmover import affinity_patch, kept_off
from mlenv.state import RECORDS

from tests.unit.config.files import BARCELONA, loaded

PINNED = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-a", "gpu-b", "gpu-c"]}


def statefulset(*expressions: dict[str, Any]) -> dict[str, Any]:
    """A StatefulSet whose pods have these required node-affinity expressions (none: no node affinity)."""
    affinity: dict[str, Any] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}
    if expressions:
        affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": list(expressions)}]}}
    return {"spec": {"template": {"spec": {"affinity": affinity}}}}


def node_affinity(patch: dict[str, Any] | None) -> Any:
    assert patch is not None
    return patch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]


def test_an_exclusion_keeps_the_pinned_nodes_and_adds_not_in() -> None:
    patch = affinity_patch(statefulset(PINNED), ["gpu-b"])
    assert node_affinity(patch) == {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [PINNED, {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-b"]}]}]}}


def test_a_statefulset_that_says_so_already_is_left_alone() -> None:
    excluded = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-b", "gpu-c"]}
    assert affinity_patch(statefulset(PINNED, excluded), ["gpu-c", "gpu-b", "gpu-c"]) is None
    assert kept_off(statefulset(PINNED, excluded)) == ["gpu-b", "gpu-c"]
    assert affinity_patch(statefulset(), []) is None


def test_forgetting_lets_the_pods_back() -> None:
    excluded = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["gpu-b"]}
    assert node_affinity(affinity_patch(statefulset(PINNED, excluded), [])) == {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [PINNED]}]}}
    assert node_affinity(affinity_patch(statefulset(excluded), [])) is None  # a merge patch's null deletes it


def test_deploy_renders_the_deployments_exclusions(tmp_path: Path) -> None:
    job = plan(loaded(tmp_path / "x.yaml", BARCELONA), "tcp")
    for excluded in ((), ("moc-r4pcc04u23-nairr",)):
        objects = render(kube_deployment(job._replace(excluded=excluded), openshift=True)).objects
        [sts] = [obj for obj in objects if obj["kind"] == "StatefulSet"]
        assert kept_off(sts) == list(excluded)
        assert [e["operator"] for e in sts["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]] == (
            ["In", "NotIn"] if excluded else ["In"])  # Barcelona pins its nodes


def test_a_detached_run_may_move_its_pods_only_when_the_cluster_file_says_so(tmp_path: Path) -> None:
    """scheduling.move_faulty_pods: a Role granting get on the StatefulSet's own pods and get/patch on the
    StatefulSet, by name and nothing else, bound to the deployment's own ServiceAccount, whose token only the mover
    mounts (test_kubernetes_mover.py); the pods learn the StatefulSet's name and read the last move through the
    downward API. Without it: none of that."""
    job = plan(loaded(tmp_path / "x.yaml", BARCELONA + "scheduling:\n  move_faulty_pods: true\n"), "tcp")
    d = kube_deployment(job, openshift=True)
    objects = render(d).objects
    [role] = [obj for obj in objects if obj["kind"] == "Role"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "resourceNames": [f"{d.app}-{n}" for n in range(d.nodes)],
         "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["statefulsets"], "resourceNames": [d.app], "verbs": ["get", "patch"]}]
    [binding] = [obj for obj in objects if obj["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": d.service_account, "namespace": d.namespace}]
    assert role["metadata"]["labels"]["mlenv.io/grant"] == binding["metadata"]["labels"]["mlenv.io/grant"]
    [sts] = [obj for obj in objects if obj["kind"] == "StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and d.service_account == f"{d.app}-move-pods"
    env = {item["name"]: item for item in pod["containers"][0]["env"]}
    assert env[MOVES_PODS]["value"] == d.app
    assert env[LEFT_OUT]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.annotations['{LEFT_OUT_ANNOTATION}']"
    assert "role" not in owned_kinds(objects)  # clean deletes it by its own labels, never an admin's SCC Role

    plain = render(kube_deployment(plan(loaded(tmp_path / "y.yaml", BARCELONA), "tcp"), openshift=True)).objects
    assert not [obj for obj in plain if obj["kind"] in ("Role", "RoleBinding")]
    [sts] = [obj for obj in plain if obj["kind"] == "StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and [c["name"] for c in pod["containers"]] == ["ml-dev"]
    assert not {MOVES_PODS, LEFT_OUT} & {item["name"] for item in pod["containers"][0]["env"]}


def test_a_pod_made_again_by_a_move_resumes_only_that_runs_next_attempt(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    record: dict[str, Any] = {"run": "r1", "attempt": 0, "env": {"MLENV_FAILED_FIRST": "n1"},
              "nodes": [{"node": 1, "host": "gpu-b", "reason": "NCCL network error", "saved": True, "since": "x"}]}
    environ = {LEFT_OUT: json.dumps(record)}
    assert moved(environ, "r1", 0) == {"MLENV_FAILED_FIRST": "n1"}
    assert moved(environ, "r1", 1) is None  # a later attempt ended otherwise: no move made this pod
    assert moved(environ, "r2", 0) is None  # another run's move
    assert moved({LEFT_OUT: ""}, "r1", 0) is None and moved({LEFT_OUT: "{not json"}, "r1", 0) is None
    assert recorded(json.dumps({"nodes": "gpu-b"})) is None

    pods: list[dict[str, Any]] = [{"metadata": {"annotations": {LEFT_OUT_ANNOTATION: json.dumps(record)}}},
                                  {"metadata": {}}]
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))
    assert moved_by_a_run(pods, RECORDS, "c")
    RECORDS.exclude("c", {1: ("gpu-b", "NCCL network error")})
    assert not moved_by_a_run(pods, RECORDS, "c")  # recorded already
    run_only = {**record, "nodes": [{**record["nodes"][0], "saved": False}]}
    assert not moved_by_a_run([{"metadata": {"annotations": {LEFT_OUT_ANNOTATION: json.dumps(run_only)}}}],
                              RECORDS, "d")
