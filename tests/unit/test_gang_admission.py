"""``scheduling.admission``: what Kueue and Volcano need is on the rendered objects, and each object passes its
strict schema (Kubernetes' own, Volcano's PodGroup CRD)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from mlenv.backends.kubeapi.naming import kube_deployment
from mlenv.backends.kubernetes.render import render
from mlenv.backends.kubernetes.schemas import validate_object
from mlenv.errors import OperationError
from mlenv.plan import plan

from tests.unit.config.files import BARCELONA, edited, loaded


def _render(tmp_path: Path, *fields: str) -> dict[str, dict[str, Any]]:
    """The objects rendered for the Barcelona file with ``fields`` in its scheduling section, by kind."""
    text = edited(BARCELONA, ("nccl:\n", "scheduling:\n" + "".join(f"  {field}\n" for field in fields) + "nccl:\n"))
    objects = render(kube_deployment(plan(loaded(tmp_path / "x.yaml", text), "tcp"), openshift=True)).objects
    kinds = [obj["kind"] for obj in objects]
    assert len(kinds) == len(set(kinds)), kinds
    return {obj["kind"]: obj for obj in objects}


def test_kueue_admits_the_statefulset_through_its_local_queue(tmp_path: Path) -> None:
    objects = _render(tmp_path, "admission: kueue", "queue: team-a", "priority_class: training-high",
                      "topology: {required: topology.kubernetes.io/zone}")
    statefulset = objects["StatefulSet"]
    assert statefulset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert statefulset["spec"]["podManagementPolicy"] == "Parallel"  # ordered creation deadlocks a pod group
    pod = statefulset["spec"]["template"]
    assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]  # Kueue's webhook labels the pods
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] == "topology.kubernetes.io/zone"
    assert pod["spec"]["priorityClassName"] == "training-high"
    assert "schedulerName" not in pod["spec"]
    assert objects["Service"]["spec"]["publishNotReadyAddresses"] is True  # rendezvous before every pod is Ready
    assert "PodGroup" not in objects
    assert not any(obj["metadata"]["labels"].get("kueue.x-k8s.io/queue-name")
                   for kind, obj in objects.items() if kind != "StatefulSet")


def test_kueue_preferred_topology(tmp_path: Path) -> None:
    pod = _render(tmp_path, "admission: kueue", "queue: team-a",
                  "topology: {preferred: example.com/rack}")["StatefulSet"]["spec"]["template"]
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/podset-preferred-topology"] == "example.com/rack"
    assert "kueue.x-k8s.io/podset-required-topology" not in pod["metadata"]["annotations"]


@pytest.mark.parametrize(("fields", "queue"), [(("admission: volcano",), "default"),
                                               (("admission: volcano", "queue: research"), "research")])
def test_volcano_gangs_every_pod_in_one_pod_group(tmp_path: Path, fields: tuple[str, ...], queue: str) -> None:
    objects = _render(tmp_path, *fields, "priority_class: training-high")
    group, statefulset = objects["PodGroup"], objects["StatefulSet"]
    kinds = list(objects)
    assert kinds.index("PodGroup") < kinds.index("StatefulSet")  # the group exists before its pods
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {"minMember": statefulset["spec"]["replicas"], "queue": queue,
                             "priorityClassName": "training-high"}
    assert group["metadata"]["labels"] == statefulset["metadata"]["labels"]  # clean finds it as it finds the rest
    pod = statefulset["spec"]["template"]
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == group["metadata"]["name"]
    assert pod["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"] == queue
    assert "kueue.x-k8s.io/queue-name" not in statefulset["metadata"]["labels"]


def test_the_pod_group_is_checked_against_volcanos_crd(tmp_path: Path) -> None:
    group = copy.deepcopy(_render(tmp_path, "admission: volcano")["PodGroup"])
    validate_object(group, "1.30")
    group["spec"]["minMember"] = "all"
    with pytest.raises(OperationError, match=r"PodGroup/ml-dev-env is invalid at spec\.minMember"):
        validate_object(group, "1.30")
    group["spec"]["minMember"] = 2
    group["spec"]["minMembers"] = 2
    with pytest.raises(OperationError, match="minMembers"):
        validate_object(group, "1.30")


def test_without_admission_the_pods_carry_nothing_of_it(tmp_path: Path) -> None:
    objects = _render(tmp_path, "grace_period: 30")
    pod = objects["StatefulSet"]["spec"]["template"]
    assert not [key for key in (*pod["metadata"]["annotations"], *objects["StatefulSet"]["metadata"]["labels"])
                if "kueue" in key or "volcano" in key or key.startswith("scheduling.k8s.io")]
    assert "schedulerName" not in pod["spec"] and "priorityClassName" not in pod["spec"]
    assert "PodGroup" not in objects
