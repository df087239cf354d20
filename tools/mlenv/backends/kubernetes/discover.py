"""``mlenv discover NAME``: clusters/NAME.yaml from the cluster the CLI is logged in to: its API server and
namespace, the GPU nodes (``nvidia.com/gpu.present``, allocatable GPUs, product), the storage classes and which
can be ReadWriteMany, the namespace's NetworkAttachmentDefinitions and the RDMA device-plugin resources of the GPU
nodes, and whether the SCC API is served (OpenShift). The file is commented, with a TODO wherever a person must
decide; it validates before it is written, and an existing file is replaced only with ``--force``."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from mlenv.backends.kubeapi.client import Client, KubeError, resolve_binary
from mlenv.backends.kubeapi.objects import ClusterNode
from mlenv.backends.kubernetes.checks import GPU, is_default_class, rwx_support
from mlenv.config.discover import clusters_dir
from mlenv.config.load import parse_yaml
from mlenv.config.quantity import QuantityError, parse_quantity
from mlenv.core.clusters import validate
from mlenv.errors import OperationError, UsageError, shown
from mlenv.render.yamlsafe import yaml_value
from mlenv.ui import info

NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
SCC_API = "security.openshift.io/v1"
PRESENT = "nvidia.com/gpu.present"
PRODUCT = "nvidia.com/gpu.product"
NO_PROVISIONER = "kubernetes.io/no-provisioner"
"""Local volumes made by hand: no class for claims made on the fly."""
NOT_RDMA = re.compile(r"(cpu|memory|pods|ephemeral-storage|hugepages-.*|nvidia\.com/(gpu|mig-.*)|"
                      r"attachable-volumes-.*)")
RDMA_HINT = re.compile(r"rdma|^openshift\.io/|^nvidia\.com/hostdev|^mellanox\.com/|sriov", re.IGNORECASE)
"""Allocatable resources that device plugins for RDMA NICs offer (rdma/rdma, openshift.io/mlnxnics, ...)."""


@dataclass(frozen=True)
class GpuNode:
    """A node with GPUs, as its labels and allocatable resources say."""

    name: str
    gpus: int
    product: str | None
    ready: bool
    schedulable: bool
    rdma: tuple[str, ...]


@dataclass(frozen=True)
class StorageClass:
    """A storage class and whether its volumes can be ReadWriteMany (None: unknown provisioner)."""

    name: str
    provisioner: str
    default: bool
    rwx: bool | None


@dataclass(frozen=True)
class Discovered:
    """What the cluster told about itself."""

    api: str | None
    namespace: str | None
    openshift: bool
    gpu_nodes: tuple[GpuNode, ...]
    classes: tuple[StorageClass, ...]
    networks: tuple[str, ...]
    notes: tuple[str, ...]
    """What could not be read."""


def _count(value: object) -> int:
    try:
        return int(parse_quantity(str(value)))
    except QuantityError:
        return 0


def _gpu_node(node: ClusterNode) -> GpuNode | None:
    labels = node["metadata"].get("labels") or {}
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    gpus = _count(allocatable.get(GPU, 0))
    if labels.get(PRESENT) != "true" and not gpus:
        return None
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    rdma = tuple(sorted(r for r, amount in allocatable.items()
                        if RDMA_HINT.search(r) and not NOT_RDMA.fullmatch(r) and _count(amount) > 0))
    return GpuNode(node["metadata"]["name"], gpus, labels.get(PRODUCT), ready,
                   not (node.get("spec") or {}).get("unschedulable"), rdma)


def _context(client: Client) -> tuple[str | None, str | None]:
    """(server, namespace) of the current kubeconfig context."""
    try:
        config = json.loads(client.run("config", ["view", "--minify", "-o", "json"], namespaced=False) or "{}")
    except (KubeError, ValueError):
        return None, None
    clusters, contexts = config.get("clusters") or [{}], config.get("contexts") or [{}]
    return (clusters[0].get("cluster") or {}).get("server"), (contexts[0].get("context") or {}).get("namespace")


def discover(client: Client, namespace: str | None) -> Discovered:
    """Ask the cluster; what cannot be read becomes a note (and a TODO in the file)."""
    notes = []
    api, context_namespace = _context(client)
    namespace = namespace or context_namespace
    try:
        openshift = SCC_API in client.run("api-versions", [], namespaced=False).split()
    except KubeError as exc:
        raise OperationError(f"cannot reach the cluster: {exc.detail} (log in first: oc login / a kubeconfig "
                             "context)") from None
    nodes: list[GpuNode] = []
    try:
        nodes = [n for n in map(_gpu_node, client.nodes()) if n is not None]
    except KubeError as exc:
        notes.append(f"nodes cannot be listed ({exc.detail})")
    classes: list[StorageClass] = []
    try:
        classes = [StorageClass(c["metadata"]["name"], str(c.get("provisioner")), is_default_class(c),
                                rwx_support(str(c.get("provisioner")))) for c in client.select("storageclasses")]
    except KubeError as exc:
        notes.append(f"storage classes cannot be listed ({exc.detail})")
    networks: list[str] = []
    if namespace:
        try:
            networks = [n["metadata"]["name"] for n in
                        Client(client.binary, namespace).select("network-attachment-definitions.k8s.cni.cncf.io")]
        except KubeError as exc:
            notes.append(f"NetworkAttachmentDefinitions cannot be listed in {namespace} ({exc.detail})")
    return Discovered(api, namespace, openshift, tuple(sorted(nodes, key=lambda n: n.name)),
                      tuple(sorted(classes, key=lambda c: (not c.default, c.name))), tuple(sorted(networks)),
                      tuple(notes))


def _comment(text: str) -> str:
    return shown(text)


def _storage(found: Discovered) -> list[str]:
    rwx = [c for c in found.classes if c.rwx]
    listing = ", ".join(f"{c.name} ({c.provisioner}{', default' if c.default else ''}"
                        f"{', RWX' if c.rwx else ', RWO only' if c.rwx is False else ', RWX unknown'})"
                        for c in found.classes) or "none found"
    usable = [c for c in found.classes if c.provisioner != NO_PROVISIONER]  # sorted: the default first
    rwo = usable[0] if usable else None
    lines = ["storage:", f"  # Storage classes: {_comment(listing)}"]
    if rwx:
        lines += ["  mode: rwx                            # TODO: rwx (one shared ReadWriteMany workspace, sync copies "
                  "once) or volumeClaimTemplates (a volume per pod)",
                  f"  class_rwx: {yaml_value(rwx[0].name)}"]
    else:
        lines += ["  mode: volumeClaimTemplates           # no ReadWriteMany class known: one volume per pod"]
    lines.append(f"  class_rwo: {yaml_value(rwo.name if rwo else 'standard')}" +
                 ("" if rwo else "   # TODO: no provisioning storage class found: name the one to use"))
    lines += ["  workspace_size: 100Gi                # TODO: size of /workspace",
              "  datasets_size: 500Gi                 # TODO: size of /datasets"]
    return lines


def _rdma_resources(found: Discovered) -> list[str]:
    return sorted({r for node in found.gpu_nodes for r in node.rdma})


def _network(found: Discovered) -> list[str]:
    resources = _rdma_resources(found)
    if not found.networks and not resources:
        return ["network:", "  rdma:", "    enabled: false                     # no NetworkAttachmentDefinition or "
                "RDMA device-plugin resource found", "  tcp:", '    interface_exclude: "^lo,docker0"']
    lines = ["network:", "  rdma:",
             "    enabled: true                      # TODO: RDMA networks or device-plugin resources were found",
             '    gid_index: "auto"                  # each pod finds the RoCE v2 GID index (nccl-env --explain)',
             '    gdr_level: "auto"                  # each pod works out GPUDirect from its PCIe tree']
    if found.networks:
        where = _comment(str(found.namespace))
        lines += [f"    # TODO: keep the RDMA ones of the NetworkAttachmentDefinitions of {where}",
                  f"    networks: {yaml_value(list(found.networks))}"]
    if resources:
        lines += ["    # TODO: the RDMA device-plugin resources the GPU nodes offer; how many each pod asks for",
                  f"    resources: {yaml_value(dict.fromkeys(resources, 1))}"]
    return [*lines, "  tcp:", '    interface_exclude: "^lo,docker0"']


def cluster_text(name: str, found: Discovered) -> str:
    """The commented cluster file (pure)."""
    usable = [n for n in found.gpu_nodes if n.ready and n.schedulable and n.gpus]
    per_node = min((n.gpus for n in usable), default=1)
    products = sorted({n.product for n in found.gpu_nodes if n.product})
    rdma = bool(found.networks or _rdma_resources(found))
    description = f"{len(found.gpu_nodes)} GPU nodes" + (f" ({products[0]})" if products else "")
    backend = "openshift" if found.openshift else "kubernetes"
    why = "the SCC API (security.openshift.io) is served" if found.openshift else "no SCC API: plain Kubernetes"
    lines = ["# yaml-language-server: $schema=../tools/mlenv/config/cluster.schema.json",
             f"# Written by `mlenv discover {name}` from the logged-in cluster. Lines marked TODO need a decision;",
             f"# then `mlenv validate {name}` and `mlenv doctor {name}` check the result.",
             *(f"# Not read: {_comment(note)}" for note in found.notes), "",
             f"backend: {backend}                    # {why}", "",
             "cluster:", f"  name: {yaml_value(name)}"]
    if found.api:
        lines.append(f"  api: {yaml_value(found.api)}")
    lines += [f"  namespace: {yaml_value(found.namespace or 'ml')}"
              + ("                # TODO: the namespace to deploy into" if not found.namespace
                 else "   # the context's namespace; TODO: change it to deploy elsewhere"),
              f"  description: {yaml_value(description)}",
              "", "nodes:",
              "  # TODO: pin the pods to these nodes (one pod per node), or leave the list empty for any GPU node.",
              *(f"  #   - {_comment(n.name):<24} {n.gpus} x {_comment(n.product or 'GPU')}"
                f"{'' if n.ready else ', NOT READY'}{'' if n.schedulable else ', cordoned'}"
                f"{', ' + _comment(', '.join(n.rdma)) if n.rdma else ''}" for n in found.gpu_nodes),
              "  gpu_nodes: []", "", *_storage(found), "", *_network(found), "",
              "security:", "  service_account: ml-dev-sa",
              f"  ipc_lock: {'true' if rdma else 'false'}"
              + ("                       # TODO: RDMA pins memory (IPC_LOCK); on OpenShift a cluster admin applies "
                 f"`mlenv render {name} --admin` once" if rdma else ""),
              "", "gpus:",
              f"  per_node: {per_node}" + (f"                          # TODO: GPUs per pod (the Ready GPU nodes have "
                                           f"{per_node} or more)" if usable else
                                           "                          # TODO: no Ready GPU node found"),
              *([f"  type: {yaml_value(products[0])}"] if products else []),
              f"  default_nodes: {max(len(usable), 1)}"
              f"                     # TODO: pods to deploy ({len(usable)} Ready, schedulable GPU nodes)",
              "", "nccl:", '  debug: "INFO"                        # NCCL logs its transport: nccl-test checks it']
    return "\n".join(lines) + "\n"


def run_discover(name: str, namespace: str | None, force: bool) -> Path:
    """Write clusters/NAME.yaml; UsageError for a bad name or an existing file without ``force``."""
    if not NAME.fullmatch(name):
        raise UsageError(f"NAME: expected a DNS-1123 label (lowercase letters, digits and '-'), got {shown(name)!r}")
    if namespace is not None and not NAME.fullmatch(namespace):
        raise UsageError(f"--namespace: expected a DNS-1123 label, got {shown(namespace)!r}")
    path = clusters_dir() / f"{name}.yaml"
    if path.exists() and not force:
        raise UsageError(f"{path} exists: mlenv discover {name} --force replaces it")
    binary = resolve_binary("oc", say_stand_in=True)
    found = discover(Client(binary, namespace or "default"), namespace)
    text = cluster_text(name, found)
    validate(parse_yaml(text, str(path)))  # a ConfigError here is mlenv's bug: nothing is written
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(text)
    os.replace(partial, path)
    todos = text.count("TODO")
    info(f"wrote {path}: {len(found.gpu_nodes)} GPU nodes, {len(found.classes)} storage classes, "
         f"{len(found.networks)} networks; {todos} TODOs to decide, then: mlenv doctor {name}")
    return path

