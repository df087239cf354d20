"""Objects a cluster admin (or the platform) put there before the tests came: nodes, StorageClasses, OpenShift's
SCCs, Multus networks, ImageStreams. Each builder returns a plain object for ``FakeKube.add``."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

H100 = "NVIDIA-H100-80GB-HBM3"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}


@dataclass(frozen=True)
class NodeSpec:
    """A worker node. ``allocatable`` adds or overrides resources (``{"rdma/rdma": "1"}``); nodes with GPUs get
    the GPU operator's labels (``nvidia.com/gpu.present``, ``.product``, ``.count``); ``labels`` win over all."""

    name: str
    gpus: int = 8
    gpu_product: str = H100
    labels: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)
    ready: bool = True
    unschedulable: bool = False
    ip: str = ""


def node_conditions(ready: bool) -> list[dict[str, Any]]:
    """A node's status.conditions: no pressure, and Ready True (kubelet posting) or Unknown (it stopped)."""
    conditions = [{"type": kind, "status": "False", "reason": f"KubeletHas{reason}"}
                  for kind, reason in (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"),
                                       ("PIDPressure", "SufficientPID"))]
    if ready:
        return [*conditions, {"type": "Ready", "status": "True", "reason": "KubeletReady",
                              "message": "kubelet is posting ready status"}]
    return [*conditions, {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                          "message": "Kubelet stopped posting node status."}]


def node(spec: NodeSpec, ip: str) -> dict[str, Any]:
    """The Node object of ``spec``, with status; not ready means the node lifecycle's not-ready taint too."""
    gpu_labels = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": spec.gpu_product,
                  "nvidia.com/gpu.count": str(spec.gpus)} if spec.gpus else {}
    labels = {"kubernetes.io/hostname": spec.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "node-role.kubernetes.io/worker": "", **gpu_labels, **spec.labels}
    resources = {"cpu": "64", "memory": "512Gi", "pods": "250", "nvidia.com/gpu": str(spec.gpus),
                 **spec.allocatable}
    node_spec: dict[str, Any] = {"unschedulable": True} if spec.unschedulable else {}
    if not spec.ready:
        node_spec["taints"] = [NOT_READY_TAINT]
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": node_spec,
        "status": {
            "capacity": resources, "allocatable": resources,
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": spec.name}],
            "conditions": node_conditions(spec.ready),
            "nodeInfo": {"kubeletVersion": "v1.32.4", "containerRuntimeVersion": "cri-o://1.32.0",
                         "architecture": "amd64", "operatingSystem": "linux"},
        },
    }


def storage_class(
    name: str, provisioner: str, *, default: bool = False, binding_mode: str = "Immediate",
    parameters: Mapping[str, str] | None = None, reclaim_policy: str = "Delete", expansion: bool = True,
) -> dict[str, Any]:
    """A StorageClass; ``default`` marks it the cluster default (the annotation kubectl shows as ``(default)``)."""
    meta: dict[str, Any] = {"name": name}
    if default:
        meta["annotations"] = {DEFAULT_CLASS_ANNOTATION: "true"}
    obj: dict[str, Any] = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": meta,
                           "provisioner": provisioner, "reclaimPolicy": reclaim_policy,
                           "volumeBindingMode": binding_mode, "allowVolumeExpansion": expansion}
    if parameters:
        obj["parameters"] = dict(parameters)
    return obj


# A mixed cluster: NFS (RWX, the default), Ceph RBD (RWO block), CephFS (RWX) and local disks (no provisioner).
DEFAULT_STORAGE_CLASSES: tuple[dict[str, Any], ...] = (
    storage_class("nfs-csi", "nfs.csi.k8s.io", default=True,
                  parameters={"server": "nfs.example.com", "share": "/export"}),
    storage_class("ceph-rbd", "rbd.csi.ceph.com", parameters={"clusterID": "ceph", "pool": "rbd"}),
    storage_class("cephfs", "cephfs.csi.ceph.com", parameters={"clusterID": "ceph", "fsName": "cephfs"}),
    storage_class("local-storage", "kubernetes.io/no-provisioner", binding_mode="WaitForFirstConsumer",
                  expansion=False),
)


def security_context_constraints(
    name: str, *, capabilities: tuple[str, ...] = (), privileged: bool = False, run_as_user: str = "MustRunAsRange",
    priority: int | None = None, users: tuple[str, ...] = (), groups: tuple[str, ...] = (),
    drop: tuple[str, ...] = ("KILL", "MKNOD", "SETUID", "SETGID"),
) -> dict[str, Any]:
    """An OpenShift SCC with the fields its printer columns show (``drop``: its requiredDropCapabilities)."""
    return {
        "apiVersion": "security.openshift.io/v1", "kind": "SecurityContextConstraints",
        "metadata": {"name": name},
        "allowPrivilegedContainer": privileged, "allowPrivilegeEscalation": privileged,
        "allowedCapabilities": list(capabilities) or None,
        "allowHostDirVolumePlugin": privileged, "allowHostIPC": privileged, "allowHostNetwork": privileged,
        "allowHostPID": privileged, "allowHostPorts": privileged, "readOnlyRootFilesystem": False,
        "requiredDropCapabilities": None if privileged else list(drop),
        "runAsUser": {"type": run_as_user}, "seLinuxContext": {"type": "RunAsAny" if privileged else "MustRunAs"},
        "fsGroup": {"type": "RunAsAny" if privileged else "MustRunAs"},
        "supplementalGroups": {"type": "RunAsAny"}, "priority": priority,
        "users": list(users), "groups": list(groups),
        "volumes": ["*"] if privileged else ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                             "persistentVolumeClaim", "projected", "secret"],
    }


# What a fresh OpenShift 4 cluster has (the ones the SCC admission errors name, and the one mlenv never uses).
DEFAULT_SCCS: tuple[dict[str, Any], ...] = (
    security_context_constraints("restricted-v2", capabilities=("NET_BIND_SERVICE",), groups=("system:authenticated",),
                                 drop=("ALL",)),
    security_context_constraints("anyuid", run_as_user="RunAsAny", priority=10, groups=("system:cluster-admins",)),
    security_context_constraints("privileged", capabilities=("*",), privileged=True, run_as_user="RunAsAny",
                                 users=("system:admin",), groups=("system:cluster-admins", "system:nodes")),
)


def network_attachment_definition(namespace: str, name: str, config: Mapping[str, Any] | None = None,
                                  resource_name: str = "") -> dict[str, Any]:
    """A Multus NetworkAttachmentDefinition (CNI ``config`` as JSON; ``resource_name``: the device-plugin resource
    its pods must request, e.g. ``rdma/rdma``)."""
    cni = dict(config or {"cniVersion": "0.3.1", "name": name, "type": "macvlan", "master": "ens1f0",
                          "ipam": {"type": "whereabouts", "range": "192.168.100.0/24"}})
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_name:
        meta["annotations"] = {"k8s.v1.cni.cncf.io/resourceName": resource_name}
    return {"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition", "metadata": meta,
            "spec": {"config": json.dumps(cni)}}


def image_stream(namespace: str, name: str, tags: Mapping[str, str]) -> list[dict[str, Any]]:
    """An ImageStream with ``tags`` (tag → image pull spec) and one ImageStreamTag per tag."""
    repository = f"image-registry.openshift-image-registry.svc:5000/{namespace}/{name}"
    stream = {
        "apiVersion": "image.openshift.io/v1", "kind": "ImageStream",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"tags": [{"name": t, "from": {"kind": "DockerImage", "name": ref}} for t, ref in tags.items()]},
        "status": {"dockerImageRepository": repository,
                   "tags": [{"tag": t, "items": [{"dockerImageReference": ref, "image": _digest(ref)}]}
                            for t, ref in tags.items()]},
    }
    stream_tags = [
        {"apiVersion": "image.openshift.io/v1", "kind": "ImageStreamTag",
         "metadata": {"name": f"{name}:{t}", "namespace": namespace},
         "tag": {"name": t, "from": {"kind": "DockerImage", "name": ref}},
         "image": {"metadata": {"name": _digest(ref)}, "dockerImageReference": ref}}
        for t, ref in tags.items()
    ]
    return [stream, *stream_tags]


def _digest(reference: str) -> str:
    return f"sha256:{hashlib.sha256(reference.encode()).hexdigest()}"
