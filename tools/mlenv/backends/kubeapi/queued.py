"""Why a gang scheduler holds a deployment's pods, in its own words: Kueue gates each pod
(``kueue.x-k8s.io/admission``) until it admits the pod group's Workload, whose conditions say what it waits for
(quota in a ClusterQueue, admission checks) or why it evicted it (``waitForPodsReady``); Volcano leaves the pods of a
PodGroup unscheduled until all of them fit, and says why in the PodGroup's conditions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlenv.backends.kubeapi.client import Client, KubeError

KUEUE_GATE = "kueue.x-k8s.io/admission"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
"""On Kueue's pods: their pod group, whose Workload has the same name."""
WORKLOADS = "workloads.kueue.x-k8s.io"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
PODGROUPS = "podgroups.scheduling.volcano.sh"


def gates(pod: Mapping[str, Any]) -> list[str]:
    """The names of the scheduling gates that hold ``pod`` back."""
    return [str(gate.get("name")) for gate in (pod.get("spec") or {}).get("schedulingGates") or []]


def kueue_group(pod: Mapping[str, Any]) -> str | None:
    """The Kueue Workload that admits ``pod`` when Kueue holds it back; else None."""
    if KUEUE_GATE not in gates(pod):
        return None
    return ((pod.get("metadata") or {}).get("labels") or {}).get(KUEUE_GROUP_LABEL)


def volcano_group(pod: Mapping[str, Any]) -> str | None:
    """The Volcano PodGroup of an unscheduled pod that Volcano schedules; else None."""
    spec = pod.get("spec") or {}
    if spec.get("schedulerName") != "volcano" or spec.get("nodeName"):
        return None
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(VOLCANO_GROUP_ANNOTATION)


def by_name(objects: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Workloads or PodGroups keyed by name."""
    return {str(obj["metadata"]["name"]): obj for obj in objects}


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(c.get("type")): c for c in (obj.get("status") or {}).get("conditions") or []}


def workload_words(name: str, workload: Mapping[str, Any] | None) -> str:
    """Why Kueue has not let the pods of Workload ``name`` start, from its conditions."""
    if workload is None:
        return (f"held by Kueue's admission gate; its Workload {name} is not there (is Kueue's statefulset "
                "integration enabled, and the pod integration it needs?)")
    conditions = _conditions(workload)
    queue = (workload.get("spec") or {}).get("queueName", "?")
    cluster_queue = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue")
    evicted = conditions.get("Evicted", {})
    if evicted.get("status") == "True":
        return (f"evicted by Kueue ({evicted.get('reason', '?')}: {evicted.get('message', '')}); Workload {name} "
                f"waits in LocalQueue {queue} to be admitted again")
    reserved, admitted = conditions.get("QuotaReserved", {}), conditions.get("Admitted", {})
    if reserved.get("status") != "True":
        said = reserved.get("message") or "no quota reserved yet"
        return f"waiting for Kueue to admit Workload {name} (LocalQueue {queue}): {said}"
    if admitted.get("status") != "True":
        return (f"quota reserved in ClusterQueue {cluster_queue}; Workload {name} waits for its admission checks: "
                f"{admitted.get('message') or 'not admitted yet'}")
    return f"admitted by Kueue in ClusterQueue {cluster_queue}; waiting for its admission gate to be lifted"


def podgroup_words(name: str, group: Mapping[str, Any] | None) -> str:
    """Why Volcano has not started the pods of PodGroup ``name``, from its phase and conditions."""
    if group is None:
        return f"waiting for Volcano; its PodGroup {name} is not there"
    status, spec = group.get("status") or {}, group.get("spec") or {}
    unschedulable = _conditions(group).get("Unschedulable", {})
    said = f": {unschedulable['message']}" if unschedulable.get("status") == "True" and unschedulable.get(
        "message") else ""
    return (f"waiting for Volcano to start all {spec.get('minMember', '?')} pods of PodGroup {name} together "
            f"(queue {spec.get('queue', 'default')}, phase {status.get('phase', 'Pending')}){said}")


@dataclass(frozen=True)
class Queues:
    """What the gang schedulers say about the pods' groups: Kueue's Workloads and Volcano's PodGroups, by name."""

    workloads: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    podgroups: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def words(self, pod: Mapping[str, Any]) -> tuple[str, str] | None:
        """(reason, words) when a gang scheduler holds ``pod`` back; else None."""
        if (group := kueue_group(pod)) is not None:
            return "SchedulingGated", workload_words(group, self.workloads.get(group))
        if held := gates(pod):
            return "SchedulingGated", f"held by scheduling gates {', '.join(held)}"
        if (group := volcano_group(pod)) is not None:
            return "GangPending", podgroup_words(group, self.podgroups.get(group))
        return None


def queues(client: Client, pods: Iterable[Mapping[str, Any]]) -> Queues:
    """The Workloads and PodGroups of the namespace, listed only when a pod is held back by Kueue or Volcano (one
    list call each); what cannot be listed (not served, not allowed) is left out."""
    pods = list(pods)
    found: dict[str, dict[str, Mapping[str, Any]]] = {"workloads": {}, "podgroups": {}}
    for key, resource, held in (("workloads", WORKLOADS, kueue_group), ("podgroups", PODGROUPS, volcano_group)):
        if any(held(pod) for pod in pods):
            with contextlib.suppress(KubeError):
                found[key] = by_name(client.select(resource))
    return Queues(found["workloads"], found["podgroups"])
