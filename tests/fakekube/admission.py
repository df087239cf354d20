"""What the API server does to an object before storing it: defaults, status ownership, SCC admission."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any

from . import errors, scc
from .faults import Faults
from .resources import ResourceType, by_kind
from .store import Store

NAMESPACES, SCCS, PODS = by_kind("Namespace"), by_kind("SecurityContextConstraints"), by_kind("Pod")

_INITIAL_STATUS: dict[str, dict[str, Any]] = {
    "Namespace": {"phase": "Active"},
    "Pod": {"phase": "Pending"},
    "PersistentVolumeClaim": {"phase": "Pending"},
}


def added_capabilities(pod_spec: dict[str, Any]) -> list[tuple[int, str]]:
    """(container index, capability) for every capability a pod's containers add."""
    found: list[tuple[int, str]] = []
    for index, container in enumerate(pod_spec.get("containers") or []):
        capabilities = (container.get("securityContext") or {}).get("capabilities") or {}
        found.extend((index, cap) for cap in capabilities.get("add") or [])
    return found


def scc_rejection(pod_spec: dict[str, Any]) -> str | None:
    """Why OpenShift's SCC admission would reject this pod spec when capabilities are forbidden, or None."""
    added = added_capabilities(pod_spec)
    if not added:
        return None
    invalid = [
        f'spec.containers[{i}].securityContext.capabilities.add: Invalid value: "{cap}": capability may not be added'
        for i, cap in added
    ]
    providers = [
        'provider "anyuid": Forbidden: not usable by user or serviceaccount',
        *invalid,
        'provider "restricted-v2": Forbidden: not usable by user or serviceaccount',
    ]
    return f"unable to validate against any security context constraint: [{', '.join(providers)}]"


def _check_gates(pod: dict[str, Any], old: dict[str, Any]) -> None:
    """A pod's scheduling gates may only be removed after creation, as the API server validates them."""
    before = {gate.get("name") for gate in (old.get("spec") or {}).get("schedulingGates") or []}
    for gate in (pod.get("spec") or {}).get("schedulingGates") or []:
        if gate.get("name") not in before:
            raise errors.invalid(PODS, pod["metadata"]["name"], "Forbidden: only deletion is allowed, but found "
                                 f"new scheduling gate '{gate.get('name')}'", field="spec.schedulingGates")


class Admission:
    """Defaulting and validation applied to every create and update that comes through the API."""

    def __init__(self, faults: Faults, store: Store, openshift: Callable[[], bool]) -> None:
        self.faults = faults
        self.store = store
        self.openshift = openshift
        """Whether the cluster is OpenShift now (its SCC API is served): namespaces get UID ranges, pods SCCs."""
        self._cluster_ips = itertools.count(10)
        self._ranges = scc.Ranges()
        self.pod_webhooks: list[Callable[[dict[str, Any]], None]] = []
        """Mutating webhooks run on every new pod before it is stored (an add-on's, such as Kueue's)."""

    def admit(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        """The object to store for a create (``old`` None) or an update; raises ApiError to reject it."""
        obj = copy.deepcopy(obj)
        if rt.has_status:
            obj["status"] = copy.deepcopy(old.get("status", {})) if old else dict(_INITIAL_STATUS.get(rt.kind, {}))
        defaults = getattr(self, f"_default_{rt.kind.lower()}", None)
        if defaults:
            defaults(obj, old)
        if rt.kind == "Pod" and old is None:
            for webhook in self.pod_webhooks:
                webhook(obj)
        if rt.kind == "Pod" and old is not None:
            _check_gates(obj, old)
        if rt.kind == "Pod" and old is None and self.faults.forbid_capabilities:
            reason = scc_rejection(obj.get("spec") or {})
            if reason:
                raise errors.forbidden(rt, obj["metadata"]["name"], reason)
        if rt.kind == "Pod" and old is None and self.openshift():
            namespace = self.store.get(NAMESPACES, "", obj["metadata"].get("namespace", ""))
            sccs = {s["metadata"]["name"]: s for s in self.store.list(SCCS)}
            reason = scc.admit(obj, namespace or {"metadata": {}}, sccs)
            if reason:
                raise errors.forbidden(rt, obj["metadata"]["name"], reason)
        return obj

    def _default_namespace(self, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        labels = obj["metadata"].setdefault("labels", {})
        labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        kept = {k: v for k, v in ((old or {}).get("metadata", {}).get("annotations") or {}).items()
                if k in (scc.UID_RANGE, scc.GROUP_RANGE, scc.MCS)}
        if kept:  # set once, by the cluster
            obj["metadata"]["annotations"] = {**(obj["metadata"].get("annotations") or {}), **kept}
        elif self.openshift():
            self._ranges.annotate(obj)

    def _default_statefulset(self, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("replicas", 1)
        spec.setdefault("podManagementPolicy", "OrderedReady")
        spec.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})

    def _default_service(self, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        if old and (old.get("spec") or {}).get("clusterIP"):
            spec["clusterIP"] = old["spec"]["clusterIP"]
        elif not spec.get("clusterIP"):
            n = next(self._cluster_ips)
            spec["clusterIP"] = f"172.30.{n // 250}.{n % 250 + 1}"
        spec["clusterIPs"] = [spec["clusterIP"]]
