"""Server-side printing: ``meta.k8s.io/v1 Table`` answers, which plain ``kubectl get`` asks for.

Columns follow the real server's printers for the kinds a deploy tool shows; other kinds get Name and Age.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from .resources import ResourceType

Obj = dict[str, Any]


def age(timestamp: str | None) -> str:
    """``5s``, ``3m12s``, ``4h``, ``2d3h``, like kubectl's human durations."""
    if not timestamp:
        return "<unknown>"
    then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    seconds = max(0, int((datetime.now(timezone.utc) - then).total_seconds()))
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    return f"{days}d{hours % 24}h" if days < 8 and hours % 24 else f"{days}d"


def _created(obj: Obj) -> str:
    return age(obj["metadata"].get("creationTimestamp"))


def _pod_status(pod: Obj) -> str:
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        reason = (state.get("waiting") or {}).get("reason") or (state.get("terminated") or {}).get("reason")
        if reason:
            return reason
    return status.get("reason") or status.get("phase") or "Unknown"


def _pod(pod: Obj) -> list[Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or [])
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(c.get("restartCount", 0) for c in statuses)
    status = pod.get("status") or {}
    return [pod["metadata"]["name"], f"{ready}/{total}", _pod_status(pod), restarts, _created(pod),
            status.get("podIP") or "<none>", (pod.get("spec") or {}).get("nodeName") or "<none>", "<none>", "<none>"]


def _event(event: Obj) -> list[Any]:
    involved = event.get("involvedObject") or {}
    return [age(event.get("lastTimestamp")), event.get("type", ""), event.get("reason", ""),
            f"{involved.get('kind', '').lower()}/{involved.get('name', '')}", event.get("message", ""),
            event["metadata"]["name"]]


def _statefulset(sts: Obj) -> list[Any]:
    status = sts.get("status") or {}
    containers = ((sts["spec"].get("template") or {}).get("spec") or {}).get("containers") or []
    return [sts["metadata"]["name"], f"{status.get('readyReplicas', 0)}/{sts['spec'].get('replicas', 1)}",
            _created(sts), ",".join(c.get("name", "") for c in containers),
            ",".join(c.get("image", "") for c in containers)]


def _service(svc: Obj) -> list[Any]:
    spec = svc.get("spec") or {}
    ports = ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or []) or "<none>"
    return [svc["metadata"]["name"], spec.get("type", "ClusterIP"), spec.get("clusterIP", "<none>"), "<none>",
            ports, _created(svc)]


_MODES = {"ReadWriteOnce": "RWO", "ReadWriteMany": "RWX", "ReadOnlyMany": "ROX", "ReadWriteOncePod": "RWOP"}


def _claim(pvc: Obj) -> list[Any]:
    spec, status = pvc.get("spec") or {}, pvc.get("status") or {}
    modes = ",".join(_MODES.get(m, m) for m in status.get("accessModes") or [])
    return [pvc["metadata"]["name"], status.get("phase", "Pending"), spec.get("volumeName", ""),
            (status.get("capacity") or {}).get("storage", ""), modes, spec.get("storageClassName", "<unset>"),
            _created(pvc)]


def _namespace(ns: Obj) -> list[Any]:
    return [ns["metadata"]["name"], (ns.get("status") or {}).get("phase", "Active"), _created(ns)]


def _node(node: Obj) -> list[Any]:
    labels = node["metadata"].get("labels") or {}
    roles = ",".join(sorted(k.rpartition("/")[2] for k in labels if k.startswith("node-role.kubernetes.io/")))
    status = node.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    state = "Ready" if ready else "NotReady"
    if (node.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    version = (status.get("nodeInfo") or {}).get("kubeletVersion", "")
    return [node["metadata"]["name"], state, roles or "<none>", _created(node), version]


def _storage_class(sc: Obj) -> list[Any]:
    name = sc["metadata"]["name"]
    if (sc["metadata"].get("annotations") or {}).get("storageclass.kubernetes.io/is-default-class") == "true":
        name += " (default)"
    return [name, sc.get("provisioner", ""), sc.get("reclaimPolicy", "Delete"),
            sc.get("volumeBindingMode", "Immediate"), str(bool(sc.get("allowVolumeExpansion"))).lower(),
            _created(sc)]


def _network_policy(policy: Obj) -> list[Any]:
    labels = ((policy.get("spec") or {}).get("podSelector") or {}).get("matchLabels") or {}
    return [policy["metadata"]["name"], ",".join(f"{k}={v}" for k, v in labels.items()) or "<none>",
            _created(policy)]


def _cell(value: Any) -> str:
    """A CRD printer column's cell: ``<no value>`` for null, JSON for lists."""
    if value is None:
        return "<no value>"
    if isinstance(value, list):
        return json.dumps(value, separators=(",", ":"))
    return str(value).lower() if isinstance(value, bool) else str(value)


def _scc(scc: Obj) -> list[Any]:
    return [scc["metadata"]["name"], *(_cell(v) for v in (
        scc.get("allowPrivilegedContainer"), scc.get("allowedCapabilities"),
        (scc.get("seLinuxContext") or {}).get("type"), (scc.get("runAsUser") or {}).get("type"),
        (scc.get("fsGroup") or {}).get("type"), (scc.get("supplementalGroups") or {}).get("type"),
        scc.get("priority"), scc.get("readOnlyRootFilesystem"), scc.get("volumes")))]


def _default(obj: Obj) -> list[Any]:
    return [obj["metadata"]["name"], _created(obj)]


# kind → (columns as (name, priority), cells of one object); priority 1 columns show with -o wide.
PRINTERS: dict[str, tuple[list[tuple[str, int]], Callable[[Obj], list[Any]]]] = {
    "Pod": ([("Name", 0), ("Ready", 0), ("Status", 0), ("Restarts", 0), ("Age", 0), ("IP", 1), ("Node", 1),
             ("Nominated Node", 1), ("Readiness Gates", 1)], _pod),
    "Event": ([("Last Seen", 0), ("Type", 0), ("Reason", 0), ("Object", 0), ("Message", 0), ("Name", 1)], _event),
    "StatefulSet": ([("Name", 0), ("Ready", 0), ("Age", 0), ("Containers", 1), ("Images", 1)], _statefulset),
    "Service": ([("Name", 0), ("Type", 0), ("Cluster-IP", 0), ("External-IP", 0), ("Port(s)", 0), ("Age", 0)],
                _service),
    "PersistentVolumeClaim": ([("Name", 0), ("Status", 0), ("Volume", 0), ("Capacity", 0), ("Access Modes", 0),
                               ("StorageClass", 0), ("Age", 0)], _claim),
    "Namespace": ([("Name", 0), ("Status", 0), ("Age", 0)], _namespace),
    "Project": ([("Name", 0), ("Display Name", 0), ("Status", 0)], lambda p: [p["metadata"]["name"], "", "Active"]),
    "Node": ([("Name", 0), ("Status", 0), ("Roles", 0), ("Age", 0), ("Version", 0)], _node),
    "StorageClass": ([("Name", 0), ("Provisioner", 0), ("ReclaimPolicy", 0), ("VolumeBindingMode", 0),
                      ("AllowVolumeExpansion", 0), ("Age", 0)], _storage_class),
    "NetworkPolicy": ([("Name", 0), ("Pod-Selector", 0), ("Age", 0)], _network_policy),
    "SecurityContextConstraints": ([("Name", 0), ("Priv", 0), ("Caps", 0), ("SELinux", 0), ("RunAsUser", 0),
                                    ("FSGroup", 0), ("SupGroup", 0), ("Priority", 0), ("ReadOnlyRootFS", 0),
                                    ("Volumes", 0)], _scc),
}


def table(rt: ResourceType, objects: list[Obj], resource_version: str, include: str = "Metadata") -> Obj:
    """A Table of ``objects``; each row carries the object's metadata (``include="Object"``: the whole object,
    ``"None"``: nothing), as the real server does for ``?includeObject=``."""
    columns, cells = PRINTERS.get(rt.kind, ([("Name", 0), ("Age", 0)], _default))
    rows = []
    for obj in objects:
        row: Obj = {"cells": cells(obj)}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj["metadata"]}
        rows.append(row)
    definitions = [
        {"name": name, "type": "integer" if name == "Restarts" else "string",
         "format": "name" if name == "Name" else "", "description": name, "priority": priority}
        for name, priority in columns
    ]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": definitions, "rows": rows}
