"""Read what ``status`` shows from pod objects: ordinal, readiness, GPUs, restarts, RDMA interfaces."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from mlenv.backends.kubeapi.objects import Pod
from mlenv.core.capabilities import Node, NodeStatus

POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
NETWORK_STATUS = "k8s.v1.cni.cncf.io/network-status"


def ordinal(pod: Pod, app: str) -> int | None:
    """The StatefulSet ordinal (pod-index label, else the ``APP-N`` name); None for a pod not of ``app``."""
    meta = pod.get("metadata") or {}
    index = (meta.get("labels") or {}).get(POD_INDEX_LABEL)
    if index is None:
        prefix, _, index = str(meta.get("name", "")).rpartition("-")
        if prefix != app:
            return None
    return int(index) if str(index).isdigit() else None


def by_ordinal(pods: Iterable[Pod], owner: str,
               ordinal_of: Callable[[Pod, str], int | None] = ordinal) -> dict[int, Pod]:
    """The pods of ``owner`` (a StatefulSet's app, or another controller's name with its own ``ordinal_of``)
    keyed by ordinal."""
    found: dict[int, Pod] = {}
    for pod in pods:
        index = ordinal_of(pod, owner)
        if index is not None:
            found[index] = pod
    return found


def is_ready(pod: Pod) -> bool:
    """Whether the pod's Ready condition is True."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def gpus(pod: Pod) -> int:
    """GPUs the pod's containers ask for (``*/gpu`` limits, else requests)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        wanted = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        total += sum(int(value) for key, value in wanted.items() if key.endswith("/gpu") and str(value).isdigit())
    return total


def restarts(pod: Pod) -> int:
    """Container restarts, summed."""
    return sum(int(s.get("restartCount") or 0) for s in (pod.get("status") or {}).get("containerStatuses") or [])


def rdma_devices(pod: Pod) -> str | None:
    """Secondary interfaces from the Multus network-status annotation: ``net1=mlx5_6,net2`` (RDMA device if known)."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(NETWORK_STATUS)
    if not text:
        return None
    try:
        networks = json.loads(text)
    except ValueError:
        return None
    seen = []
    for network in networks if isinstance(networks, list) else []:
        if not isinstance(network, dict) or network.get("default") or not network.get("interface"):
            continue
        device = ((network.get("device-info") or {}).get("pci") or {}).get("rdma-device")
        seen.append(f"{network['interface']}={device}" if device else str(network["interface"]))
    return ",".join(seen) or None


def pod_status(pod: Pod, index: int, detail: str | None) -> NodeStatus:
    """One ``status`` row."""
    status = pod.get("status") or {}
    deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    return NodeStatus(
        name=pod["metadata"]["name"],
        ordinal=index,
        node=(pod.get("spec") or {}).get("nodeName"),
        phase="Terminating" if deleting else status.get("phase", "Unknown"),
        ready=is_ready(pod),
        restarts=restarts(pod),
        gpus=gpus(pod),
        ip=status.get("podIP"),
        rdma_devices=rdma_devices(pod),
        detail=detail,
    )


def running_nodes(pods: dict[int, Pod], workspace: str) -> list[Node]:
    """The Running pods that are not being deleted, as nodes in ordinal order."""
    return [Node(ordinal=index, name=pod["metadata"]["name"], workspace=workspace,
                 ip=(pod.get("status") or {}).get("podIP"), ready=is_ready(pod),
                 machine=(pod.get("spec") or {}).get("nodeName"))
            for index, pod in sorted(pods.items())
            if (pod.get("status") or {}).get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp")]
