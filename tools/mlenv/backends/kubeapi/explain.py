"""Pod conditions and events -> what is wrong, in plain words, and how long to wait before calling it permanent."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone

from mlenv.backends.kubeapi import pods as podview
from mlenv.backends.kubeapi.naming import KubeHandle
from mlenv.backends.kubeapi.objects import ContainerStatus, Event, Pod
from mlenv.backends.kubeapi.queued import Queues
from mlenv.core.capabilities import NodeStatus

GRACE_SECONDS = {
    "FailedCreate": 5.0,
    "InvalidImageName": 0.0,
    "ErrImagePull": 20.0,
    "ImagePullBackOff": 20.0,
    "CreateContainerConfigError": 20.0,
    "CrashLoopBackOff": 30.0,
    "Unschedulable": 60.0,
}
"""How long a reason may last before deploy gives up (reasons not listed are waited for until --timeout)."""
PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")
NO_QUEUES = Queues()


@dataclass(frozen=True)
class Trouble:
    """Why one pod (or the StatefulSet) is not Ready."""

    subject: str
    reason: str
    words: str

    @property
    def grace(self) -> float | None:
        """Seconds after which this reason counts as permanent; None if it may clear by itself."""
        return GRACE_SECONDS.get(self.reason)

    def __str__(self) -> str:
        return f"{self.subject}: {self.words}"


def event_time(event: Event) -> datetime | None:
    """When an event was last seen (lastTimestamp, series, eventTime or creation), in UTC."""
    stamp = (event.get("lastTimestamp") or (event.get("series") or {}).get("lastObservedTime")
             or event.get("eventTime") or (event.get("metadata") or {}).get("creationTimestamp"))
    if not stamp:
        return None
    try:
        parsed = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _latest(events: Iterable[Event]) -> Event | None:
    oldest = datetime.min.replace(tzinfo=timezone.utc)
    return max(events, key=lambda e: event_time(e) or oldest, default=None)


def _scheduler_words(message: str, gpus: int) -> str:
    """``0/5 nodes are available: 5 Insufficient nvidia.com/gpu. preemption: ...`` -> plain words + the quote."""
    quote = message.split(" preemption:")[0].strip()
    if "Insufficient nvidia.com/gpu" in message:
        return f"no node has {gpus} free nvidia.com/gpu (scheduler: {quote}); free GPUs or deploy fewer --nodes"
    return f"cannot be scheduled (scheduler: {quote})"


def _pull_words(pod: Pod, container: ContainerStatus, events: list[Event]) -> str:
    """The image that cannot be pulled, why (from the pod's latest Failed event) and what to check."""
    image = container.get("image") or next(
        (c.get("image", "") for c in (pod.get("spec") or {}).get("containers") or []
         if c.get("name") == container.get("name")), "")
    failed = _latest(e for e in events if str(e.get("message", "")).startswith("Failed to pull image"))
    why = f" ({failed['message'].split(': ', 1)[-1]})" if failed else ""
    return (f'cannot pull image "{image}"{why}: check the image name and tag, and that the cluster can reach '
            "the registry (pull secret?); use --image to pick another")


def _crash_words(container: ContainerStatus) -> str:
    """A container that keeps exiting: its last exit code and restarts, and where its output is."""
    ended = (container.get("lastState") or {}).get("terminated") or {}
    code = ended.get("exitCode")
    how = f"exit code {code}" + (f", {ended['reason']}" if ended.get("reason") else "") if code is not None else ""
    return (f"CrashLoopBackOff: container {container.get('name', '')} keeps exiting"
            f"{f' ({how})' if how else ''} and was restarted {container.get('restartCount', 0)} times; its output: "
            f"kubectl logs --previous")


def pod_trouble(pod: Pod, events: list[Event], queues: Queues = NO_QUEUES) -> Trouble | None:
    """Why a pod is not Ready (``events`` are all events of the namespace; those of this pod are used; ``queues``
    what Kueue or Volcano say about the pod's group)."""
    if podview.is_ready(pod):
        return None
    meta, status = pod["metadata"], pod.get("status") or {}
    own = [e for e in events if (e.get("involvedObject") or {}).get("uid") == meta.get("uid")]
    if meta.get("deletionTimestamp"):
        return Trouble(meta["name"], "Terminating", "terminating")
    if (held := queues.words(pod)) is not None:
        return Trouble(meta["name"], *held)
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == "Unschedulable":
            return Trouble(meta["name"], "Unschedulable",
                           _scheduler_words(str(condition.get("message", "")), podview.gpus(pod)))
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in PULL_FAILURES:
            return Trouble(meta["name"], reason, _pull_words(pod, container, own))
        if reason == "CrashLoopBackOff":
            return Trouble(meta["name"], reason, _crash_words(container))
        if reason:
            message = waiting.get("message")
            return Trouble(meta["name"], reason, f"{reason}: {message}" if message else reason)
    phase = status.get("phase", "Pending")
    return Trouble(meta["name"], phase, "running, not Ready yet" if phase == "Running" else "waiting to start")


def _failed_create_words(message: str, d: KubeHandle) -> str:
    """A FailedCreate message in plain words; for a forbidden capability, the command an admin must run."""
    if "capabilit" in message or "security context constraint" in message:
        if d.ipc_lock_scc:
            fix = (f"a cluster admin must apply the SCC and RBAC once: mlenv render {d.cluster_file} --admin "
                   "| oc apply -f -")
        else:
            fix = f"ask a cluster admin to allow IPC_LOCK in namespace {d.namespace}"
        return (f"the cluster's security policy forbids the IPC_LOCK capability for ServiceAccount "
                f"{d.service_account}: {fix} (or set security.ipc_lock: false). Server said: {message}")
    return f"the StatefulSet cannot create pods: {message}"


def statefulset_trouble(events: list[Event], d: KubeHandle, since: datetime) -> Trouble | None:
    """The newest FailedCreate of the deployment's StatefulSet seen after ``since``, in plain words."""
    failed = _latest(
        e for e in events
        if e.get("reason") == "FailedCreate"
        and (e.get("involvedObject") or {}).get("kind") == "StatefulSet"
        and (e.get("involvedObject") or {}).get("name") == d.app
        and (event_time(e) or since) >= since
    )
    if failed is None:
        return None
    return Trouble(f"statefulset {d.app}", "FailedCreate", _failed_create_words(str(failed.get("message", "")), d))


def owner_trouble(events: list[Event], name: str, since: datetime) -> Trouble | None:
    """The newest warning seen after ``since`` about an object called ``name`` that is not a pod: why a workload
    made by another controller (Run:ai, a training operator) has no pods yet, in its controller's words."""
    latest = _latest(
        e for e in events
        if (e.get("involvedObject") or {}).get("name") == name
        and (e.get("involvedObject") or {}).get("kind") != "Pod"
        and (event_time(e) or since) >= since
    )
    if latest is None:
        return None
    kind = str((latest.get("involvedObject") or {}).get("kind") or "object")
    reason = str(latest.get("reason") or "Warning")
    return Trouble(f"{kind.lower()} {name}", reason, f"{reason}: {latest.get('message', '')}".rstrip(": "))


def statuses(pods: dict[int, Pod], queues: Queues = NO_QUEUES) -> list[NodeStatus]:
    """The ``status`` rows of pods keyed by ordinal, in ordinal order, each with why it is not Ready."""
    rows = []
    for index, pod in sorted(pods.items()):
        trouble = pod_trouble(pod, [], queues)
        rows.append(podview.pod_status(pod, index, trouble.words if trouble else None))
    return rows
