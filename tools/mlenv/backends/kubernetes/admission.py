"""What each gang scheduler needs on the pods mlenv renders, and from the cluster (``scheduling.admission``): Kueue
admits the StatefulSet through its LocalQueue (the queue label, topology annotations), Volcano through a PodGroup of
all the pods. Kueue's own objects (ClusterQueue, LocalQueue, ResourceFlavor) are the cluster admin's: mlenv never
renders them; ``doctor`` says when one is missing, and ``deploy`` refuses in its words."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from mlenv.config.model import Scheduling
from mlenv.core.capabilities import Check

if TYPE_CHECKING:  # render imports this module: it does not pay for the client
    from mlenv.backends.kubeapi.client import Client

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""On the StatefulSet: the LocalQueue that admits it (Kueue's statefulset integration)."""
KUEUE_TOPOLOGY_ANNOTATIONS = {"required": "kueue.x-k8s.io/podset-required-topology",
                              "preferred": "kueue.x-k8s.io/podset-preferred-topology"}
"""On the pod template: the node label whose domains hold the pods (Kueue's topology-aware scheduling)."""
VOLCANO_SCHEDULER = "volcano"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
"""On the pods: the PodGroup they belong to."""
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
VOLCANO_DEFAULT_QUEUE = "default"
"""The queue Volcano gives a PodGroup that names none."""


class Admission(NamedTuple):
    """The StatefulSet's extra labels, the pods' extra annotations, scheduler and priority, and the PodGroup (Volcano's
    minimum membership and queue; None without Volcano)."""

    workload_labels: dict[str, str]
    pod_annotations: dict[str, str]
    scheduler_name: str | None
    priority_class: str | None
    pod_group_queue: str | None


def admission(scheduling: Scheduling, group_name: str) -> Admission:
    """What ``scheduling`` asks of the rendered objects; ``group_name`` names Volcano's PodGroup."""
    if scheduling.admission == "kueue":
        topology = ({} if scheduling.topology is None
                    else {KUEUE_TOPOLOGY_ANNOTATIONS[scheduling.topology.mode]: scheduling.topology.level})
        return Admission({KUEUE_QUEUE_LABEL: scheduling.queue or ""}, topology, None, scheduling.priority_class, None)
    if scheduling.admission == "volcano":
        queue = scheduling.queue or VOLCANO_DEFAULT_QUEUE
        return Admission({}, {VOLCANO_GROUP_ANNOTATION: group_name, VOLCANO_QUEUE_ANNOTATION: queue},
                         VOLCANO_SCHEDULER, scheduling.priority_class, queue)
    return Admission({}, {}, None, scheduling.priority_class, None)


def admission_checks(client: Client, namespace: str, scheduling: Scheduling) -> list[Check]:
    """``doctor``: the gang scheduler's API is served and the job's queue exists (Kueue's LocalQueue in the
    namespace, Volcano's Queue); what a cluster admin must create when not."""
    if scheduling.admission == "kueue":
        return [_queue_check(client, f"Kueue LocalQueue {scheduling.queue}", "localqueues.kueue.x-k8s.io",
                             scheduling.queue or "", f"in namespace {namespace}",
                             "Kueue (kueue.x-k8s.io) is not installed on this cluster",
                             "a cluster admin installs Kueue (on OpenShift: the Red Hat build of Kueue) with its "
                             "statefulset and pod integrations, or set scheduling.admission: none",
                             f"a cluster admin creates LocalQueue {scheduling.queue} in namespace {namespace}, its "
                             "spec.clusterQueue naming a ClusterQueue with GPU quota")]
    if scheduling.admission == "volcano":
        queue = scheduling.queue or VOLCANO_DEFAULT_QUEUE
        return [_queue_check(client, f"Volcano queue {queue}", "queues.scheduling.volcano.sh", queue, "",
                             "Volcano (scheduling.volcano.sh) is not installed on this cluster",
                             "a cluster admin installs Volcano, or set scheduling.admission: none",
                             f"a cluster admin creates Volcano Queue {queue} (kubectl get queues lists them)")]
    return []


def _queue_check(client: Client, name: str, resource: str, queue: str, where: str, absent: str, install: str,
                 create: str) -> Check:
    from mlenv.backends.kubeapi.client import KubeError  # lazy: mlenv render's cold start (as above)

    try:
        found = {str(obj["metadata"]["name"]): obj for obj in client.select(resource)}
    except KubeError as exc:
        if exc.reason == "NotServed":
            return Check(name, "FAIL", absent, install)
        return Check(name, "WARN", f"cannot list {resource}: {exc.detail}")
    if queue not in found:
        there = ", ".join(sorted(found)) or "none"
        return Check(name, "FAIL", f"{queue} does not exist{f' {where}' if where else ''} (there: {there})", create)
    target = (found[queue].get("spec") or {}).get("clusterQueue")
    return Check(name, "PASS", f"exists{f' {where}' if where else ''}"
                               f"{f', admitting into ClusterQueue {target}' if target else ''}")
