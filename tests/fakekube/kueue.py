"""A test playing Kueue (kueue.sigs.k8s.io, API kueue.x-k8s.io/v1beta1) for a StatefulSet, from its documented
behaviour, never from mlenv's code: Kueue's pod webhook gates every pod of a StatefulSet labelled
``kueue.x-k8s.io/queue-name`` (gate ``kueue.x-k8s.io/admission``) and groups them (``kueue.x-k8s.io/pod-group-name``,
``pod-group-total-count``); the group's Workload, named as the group, carries the conditions (QuotaReserved,
Admitted, Evicted) that say why it waits; admission lifts the gates."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from .resources import by_kind
from .server import FakeKube
from .store import now_iso

GATE = "kueue.x-k8s.io/admission"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
MANAGED_LABEL = "kueue.x-k8s.io/managed"
NO_QUOTA = ("couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor h100, "
            "8 more needed")
"""What Kueue's scheduler writes on a Workload that does not fit its ClusterQueue's quota."""

PODS, STATEFULSETS, WORKLOADS = by_kind("Pod"), by_kind("StatefulSet"), by_kind("Workload")


def local_queue(namespace: str, name: str, cluster_queue: str) -> dict[str, Any]:
    """A LocalQueue (what a cluster admin creates in a team's namespace)."""
    return {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": cluster_queue}}


class KueuePlayer:
    """Kueue's webhook and the conditions its controllers write, for the StatefulSets of one FakeKube."""

    def __init__(self, server: FakeKube, pending: str = NO_QUOTA) -> None:
        self.server = server
        self.pending = pending
        """The QuotaReserved=False message of a new Workload."""
        server.hidden_groups.discard("kueue.x-k8s.io")
        server.pod_webhooks.append(self._webhook)

    def _webhook(self, pod: dict[str, Any]) -> None:
        owner = next((ref for ref in pod["metadata"].get("ownerReferences") or [] if ref.get("kind") == "StatefulSet"),
                     None)
        if owner is None:
            return
        namespace = pod["metadata"]["namespace"]
        sts = self.server.store.get(STATEFULSETS, namespace, owner["name"])
        queue = ((sts or {}).get("metadata", {}).get("labels") or {}).get(QUEUE_LABEL)
        if sts is None or queue is None:
            return
        group = f"statefulset-{owner['name']}-{hashlib.sha256(owner['uid'].encode()).hexdigest()[:5]}"
        pod["metadata"].setdefault("labels", {}).update({QUEUE_LABEL: queue, GROUP_LABEL: group, MANAGED_LABEL: "true"})
        pod["metadata"].setdefault("annotations", {})[TOTAL_ANNOTATION] = str(sts["spec"].get("replicas", 1))
        pod.setdefault("spec", {}).setdefault("schedulingGates", []).append({"name": GATE})
        if self.server.store.get(WORKLOADS, namespace, group) is None:
            self.server.add({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload",
                             "metadata": {"name": group, "namespace": namespace},
                             "spec": {"queueName": queue,
                                      "podSets": [{"name": "main", "count": sts["spec"].get("replicas", 1)}]},
                             "status": {"conditions": [_condition("QuotaReserved", "False", "Pending", self.pending)]}})

    def workloads(self, namespace: str) -> list[dict[str, Any]]:
        """The Workloads of a namespace."""
        return self.server.store.list(WORKLOADS, namespace)

    def evict(self, namespace: str, reason: str, message: str) -> None:
        """Kueue evicts every Workload of the namespace (``PodsReadyTimeout``: waitForPodsReady ran out) and
        requeues it: quota released, pods deleted (the StatefulSet makes them again, gated)."""
        for workload in self.workloads(namespace):
            self._write(workload, [_condition("Evicted", "True", reason, message),
                                   _condition("QuotaReserved", "False", "Pending", message),
                                   _condition("Admitted", "False", "NoReservation", "The workload has no reservation")],
                        admission=None)
            for pod in self._pods(workload):
                self.server.store.delete(PODS, namespace, pod["metadata"]["name"])

    def admit(self, namespace: str, cluster_queue: str) -> None:
        """Kueue admits every Workload of the namespace in ``cluster_queue`` and lifts its pods' gates."""
        for workload in self.workloads(namespace):
            self._write(workload, [_condition("QuotaReserved", "True", "QuotaReserved",
                                              f"Quota reserved in ClusterQueue {cluster_queue}"),
                                   _condition("Admitted", "True", "Admitted",
                                              "The workload is admitted")],
                        admission={"clusterQueue": cluster_queue,
                                   "podSetAssignments": [{"name": "main", "count": workload["spec"]["podSets"][0]
                                                          ["count"]}]})
            for pod in self._pods(workload):
                lifted = copy.deepcopy(pod)
                lifted["spec"]["schedulingGates"] = [g for g in pod["spec"].get("schedulingGates") or []
                                                     if g.get("name") != GATE]
                self.server.api.save(PODS, lifted, pod)
        self.server.reconcile()

    def _pods(self, workload: dict[str, Any]) -> list[dict[str, Any]]:
        name = workload["metadata"]["name"]
        return [pod for pod in self.server.store.list(PODS, workload["metadata"]["namespace"])
                if (pod["metadata"].get("labels") or {}).get(GROUP_LABEL) == name]

    def _write(self, workload: dict[str, Any], conditions: list[dict[str, str]],
               admission: dict[str, Any] | None) -> None:
        status: dict[str, Any] = {"conditions": conditions}
        if admission is not None:
            status["admission"] = admission
        self.server.store.update(WORKLOADS, {**copy.deepcopy(workload), "status": status})


def _condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": now_iso()}
