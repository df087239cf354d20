"""What each gang scheduler needs on the pods mlenv renders (``scheduling.admission``): Kueue admits the StatefulSet
through its LocalQueue (the queue label, topology annotations), Volcano through a PodGroup of all the pods. Kueue's
own objects (ClusterQueue, LocalQueue, ResourceFlavor) are the cluster admin's: mlenv never renders them."""

from __future__ import annotations

from typing import NamedTuple

from mlenv.config.model import Scheduling

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
