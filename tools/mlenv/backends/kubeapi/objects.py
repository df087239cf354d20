"""The parts of Kubernetes API objects mlenv reads (pods, events, StatefulSets, nodes), as TypedDicts: what
``kubectl get -o=json`` returns, typed field by field where read (every key optional, as the API leaves empty ones
out)."""

from __future__ import annotations

from typing import TypedDict


class ObjectMeta(TypedDict, total=False):
    """``metadata``."""

    name: str
    namespace: str
    uid: str
    labels: dict[str, str]
    annotations: dict[str, str]
    generation: int
    creationTimestamp: str
    deletionTimestamp: str


class Resources(TypedDict, total=False):
    """A container's ``resources``: quantities by resource name."""

    requests: dict[str, str]
    limits: dict[str, str]


class PodContainer(TypedDict, total=False):
    """A container of a pod's ``spec``."""

    name: str
    image: str
    resources: Resources


class PodSpec(TypedDict, total=False):
    """A pod's ``spec``."""

    containers: list[PodContainer]
    nodeName: str


class Condition(TypedDict, total=False):
    """A pod's ``status.conditions`` entry."""

    type: str
    status: str
    reason: str
    message: str


class Waiting(TypedDict, total=False):
    """A container state's ``waiting``."""

    reason: str
    message: str


class Terminated(TypedDict, total=False):
    """A container state's ``terminated``."""

    exitCode: int
    reason: str


class ContainerState(TypedDict, total=False):
    """A container's ``state`` or ``lastState``."""

    waiting: Waiting
    terminated: Terminated


class ContainerStatus(TypedDict, total=False):
    """A pod's ``status.containerStatuses`` entry."""

    name: str
    image: str
    state: ContainerState
    lastState: ContainerState
    restartCount: int


class PodStatus(TypedDict, total=False):
    """A pod's ``status``."""

    phase: str
    podIP: str
    conditions: list[Condition]
    containerStatuses: list[ContainerStatus]


class Pod(TypedDict, total=False):
    """A pod."""

    metadata: ObjectMeta
    spec: PodSpec
    status: PodStatus


class ObjectReference(TypedDict, total=False):
    """An event's ``involvedObject``."""

    kind: str
    name: str
    uid: str


class EventSeries(TypedDict, total=False):
    """An event's ``series``."""

    lastObservedTime: str


class Event(TypedDict, total=False):
    """An event."""

    metadata: ObjectMeta
    involvedObject: ObjectReference
    type: str
    reason: str
    message: str
    lastTimestamp: str
    eventTime: str
    series: EventSeries


class StatefulSetStatus(TypedDict, total=False):
    """A StatefulSet's ``status``."""

    observedGeneration: int
    updateRevision: str


class StatefulSet(TypedDict, total=False):
    """A StatefulSet, as read back (what exclusion annotates is sent as YAML it renders)."""

    metadata: ObjectMeta
    status: StatefulSetStatus


class ClusterNodeSpec(TypedDict, total=False):
    """A node's ``spec``."""

    unschedulable: bool


class ClusterNodeStatus(TypedDict, total=False):
    """A node's ``status``: what it can give pods (quantities by resource name) and its conditions."""

    allocatable: dict[str, str]
    conditions: list[Condition]


class ClusterNode(TypedDict, total=False):
    """A node of the cluster (``kubectl get nodes``)."""

    metadata: ObjectMeta
    spec: ClusterNodeSpec
    status: ClusterNodeStatus
