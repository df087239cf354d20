"""Kubernetes keeps a deployment's pods off its excluded nodes: the node affinity ``deploy`` renders and the merge
patch ``launch`` sends to bring a live StatefulSet to a run's exclusions (backends/kubernetes/exclusion.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlenv.backends.kubeapi.naming import kube_deployment
from mlenv.backends.kubernetes.exclusion import affinity_patch, kept_off
from mlenv.backends.kubernetes.render import render
from mlenv.plan import plan

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
