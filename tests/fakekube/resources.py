"""The API resources the fake serves, and the discovery documents kubectl reads to find them."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.4",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.23.6",
    "compiler": "gc",
    "platform": "linux/amd64",
}

CRUD_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    """One REST resource: where it lives, what its objects are called, whether it is namespaced."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = CRUD_VERBS
    has_status: bool = False

    @property
    def api_version(self) -> str:
        """The apiVersion field of this resource's objects (``v1``, ``apps/v1``)."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """The name Kubernetes uses in error messages: ``pods``, ``statefulsets.apps``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def discovery_entry(self) -> dict[str, Any]:
        """This resource as an APIResource entry of an APIResourceList."""
        entry: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.kind.lower(),
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(self.verbs),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        if self.categories:
            entry["categories"] = list(self.categories)
        return entry


_ALL = ("all",)
RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "Namespace", "namespaces", False, ("ns",), has_status=True),
    ResourceType("", "v1", "Node", "nodes", False, ("no",), has_status=True),
    ResourceType("", "v1", "Pod", "pods", True, ("po",), _ALL, has_status=True),
    ResourceType("", "v1", "Service", "services", True, ("svc",), _ALL, has_status=True),
    ResourceType("", "v1", "ServiceAccount", "serviceaccounts", True, ("sa",)),
    ResourceType("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", True, ("pvc",), has_status=True),
    ResourceType("", "v1", "Event", "events", True, ("ev",)),
    ResourceType("", "v1", "ConfigMap", "configmaps", True, ("cm",)),
    ResourceType("", "v1", "Secret", "secrets", True),
    ResourceType("apps", "v1", "StatefulSet", "statefulsets", True, ("sts",), _ALL, has_status=True),
    ResourceType("rbac.authorization.k8s.io", "v1", "Role", "roles"),
    ResourceType("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings"),
    ResourceType(
        "security.openshift.io", "v1", "SecurityContextConstraints", "securitycontextconstraints", False, ("scc",)
    ),
    ResourceType("route.openshift.io", "v1", "Route", "routes", True, (), _ALL, has_status=True),
    # OpenShift's read-only view of namespaces (what `oc get project` reads); stored as the namespaces.
    ResourceType("project.openshift.io", "v1", "Project", "projects", False, verbs=("get", "list")),
    ResourceType(
        "k8s.cni.cncf.io", "v1", "NetworkAttachmentDefinition", "network-attachment-definitions", True,
        ("net-attach-def",),
    ),
    ResourceType(
        "authentication.k8s.io", "v1", "SelfSubjectReview", "selfsubjectreviews", False, verbs=("create",)
    ),
    ResourceType(
        "authorization.k8s.io", "v1", "SelfSubjectAccessReview", "selfsubjectaccessreviews", False,
        verbs=("create",),
    ),
    ResourceType(
        "authorization.k8s.io", "v1", "SubjectAccessReview", "subjectaccessreviews", False, verbs=("create",)
    ),
    ResourceType("storage.k8s.io", "v1", "StorageClass", "storageclasses", False, ("sc",)),
    ResourceType("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", True, ("netpol",)),
    ResourceType("image.openshift.io", "v1", "ImageStream", "imagestreams", True, ("is",), has_status=True),
    ResourceType("image.openshift.io", "v1", "ImageStreamTag", "imagestreamtags", True, ("istag",),
                 verbs=("create", "delete", "get", "list", "patch", "update")),
    # Add-ons a cluster admin installs (Kueue, Volcano): served only by a FakeKube made with them (``addons``).
    ResourceType("kueue.x-k8s.io", "v1beta1", "LocalQueue", "localqueues", True, ("queue", "queues", "lq"),
                 has_status=True),
    ResourceType("kueue.x-k8s.io", "v1beta1", "ClusterQueue", "clusterqueues", False, ("cq",), has_status=True),
    ResourceType("kueue.x-k8s.io", "v1beta1", "Workload", "workloads", True, ("wl",), has_status=True),
    ResourceType("scheduling.volcano.sh", "v1beta1", "PodGroup", "podgroups", True, ("pg", "podgroup-v1beta1"),
                 has_status=True),
    ResourceType("scheduling.volcano.sh", "v1beta1", "Queue", "queues", False, ("q", "queue-v1beta1"),
                 has_status=True),
)

ADDONS = {"kueue": "kueue.x-k8s.io", "volcano": "scheduling.volcano.sh"}
"""The add-ons a FakeKube can be made with, and the API group each serves."""

# The API groups only OpenShift serves (``FakeKube(openshift=False)`` hides them, as plain Kubernetes has none).
OPENSHIFT_GROUPS = frozenset(r.group for r in RESOURCES if r.group.endswith(".openshift.io"))

# Subresources listed in discovery: (parent plural, subresource, kind, group/version of that kind, verbs).
SUBRESOURCES: tuple[tuple[str, str, str, str, tuple[str, ...]], ...] = (
    ("pods", "log", "Pod", "v1", ("get",)),
    ("pods", "eviction", "Eviction", "policy/v1", ("create",)),
    ("statefulsets", "scale", "Scale", "autoscaling/v1", ("get", "patch", "update")),
)

_BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}
_BY_KIND = {r.kind: r for r in RESOURCES}


def lookup(group: str, version: str, plural: str) -> ResourceType | None:
    """The resource served at ``/api/v1/<plural>`` (group "") or ``/apis/<group>/<version>/<plural>``."""
    return _BY_PATH.get((group, version, plural))


def by_kind(kind: str) -> ResourceType:
    """The resource whose objects have this kind (``Pod`` → pods); KeyError if not served."""
    return _BY_KIND[kind]


def group_versions(hidden: AbstractSet[str] = frozenset()) -> list[tuple[str, str]]:
    """Every (group, version) served under /apis, in a stable order; ``hidden``: API groups left out."""
    seen: dict[tuple[str, str], None] = {}
    for r in RESOURCES:
        if r.group and r.group not in hidden:
            seen[(r.group, r.version)] = None
    return list(seen)


def resource_list(group: str, version: str, hidden: AbstractSet[str] = frozenset()) -> dict[str, Any] | None:
    """The APIResourceList of one group-version, or None when the fake does not serve it."""
    members = [r for r in RESOURCES if (r.group, r.version) == (group, version) and group not in hidden]
    if not members:
        return None
    entries = []
    for r in members:
        entries.append(r.discovery_entry())
        for parent, sub, kind, gv, verbs in SUBRESOURCES:
            if parent == r.plural:
                sub_group, _, sub_version = gv.rpartition("/")
                entries.append({
                    "name": f"{parent}/{sub}", "singularName": "", "namespaced": r.namespaced,
                    "group": sub_group, "version": sub_version, "kind": kind, "verbs": list(verbs),
                })
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group}/{version}" if group else version,
        "resources": entries,
    }


def api_group(group: str, hidden: AbstractSet[str] = frozenset()) -> dict[str, Any] | None:
    """The APIGroup document of ``/apis/<group>``, or None when the fake does not serve the group."""
    versions = [v for g, v in group_versions(hidden) if g == group]
    if not versions:
        return None
    listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": listed, "preferredVersion": listed[0]}


def api_group_list(hidden: AbstractSet[str] = frozenset()) -> dict[str, Any]:
    """The APIGroupList of ``/apis``."""
    groups = [api_group(g) for g in dict.fromkeys(g for g, _ in group_versions(hidden))]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_versions(server_address: str) -> dict[str, Any]:
    """The APIVersions document of ``/api``."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    }
