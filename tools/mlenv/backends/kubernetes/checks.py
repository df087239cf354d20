"""Before deploying to Kubernetes/OpenShift, for ``mlenv doctor``: login, namespace and permissions (preflight),
then the pinned GPU nodes (exist, Ready, schedulable, enough allocatable GPUs and RDMA resources) and enough of
them for one pod per node, the storage class (and ReadWriteMany for ``rwx``), every Multus network, the gang
scheduler's queue (admission.py), IPC_LOCK (an SCC the ServiceAccount may use, or the namespace's Pod Security
level) and the image reference (with its ImageStream tag when it names one). Every check runs; each has its
evidence and its fix."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from mlenv.backends.kubeapi.client import Client, KubeError
from mlenv.backends.kubeapi.naming import DATA_KIND, KubeHandle
from mlenv.backends.kubeapi.preflight import check_networks, preflight
from mlenv.backends.kubernetes.admission import admission_checks
from mlenv.config.quantity import QuantityError, parse_quantity
from mlenv.core.capabilities import Check
from mlenv.plan import JobPlan

GPU = "nvidia.com/gpu"
ENFORCE = "pod-security.kubernetes.io/enforce"
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
INTERNAL_REGISTRY = re.compile(r"image-registry\.openshift-image-registry\.svc(?::\d+)?")
RWX_PROVISIONERS = ("nfs.csi.k8s.io", "cephfs.csi.ceph.com", "efs.csi.aws.com", "file.csi.azure.com",
                    "kubernetes.io/azure-file", "filestore.csi.storage.gke.io", "nfs-subdir-external-provisioner",
                    "nfs.csi.trident.netapp.io", "spectrumscale.csi.ibm.com", "fsx.csi.aws.com", "csi.weka.io",
                    "beegfs.csi.netapp.com", "manila.csi.openstack.org", "nfs-provisioner")
"""Provisioners whose volumes can be ReadWriteMany (a suffix after ``.`` or ``/`` matches too)."""
RWO_PROVISIONERS = ("rbd.csi.ceph.com", "ebs.csi.aws.com", "kubernetes.io/aws-ebs", "pd.csi.storage.gke.io",
                    "kubernetes.io/gce-pd", "disk.csi.azure.com", "kubernetes.io/azure-disk",
                    "kubernetes.io/no-provisioner", "topolvm.io", "rancher.io/local-path", "cinder.csi.openstack.org",
                    "kubernetes.io/cinder", "local.csi.openebs.io", "lvm.csi.metal-stack.io")
"""Provisioners whose volumes are ReadWriteOnce only."""
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_DOMAIN = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
                     r"(?::[0-9]+)?")
_TAG = re.compile(r"\w[\w.-]{0,127}")
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}")


def _known(provisioner: str, names: Sequence[str]) -> bool:
    return any(provisioner == name or provisioner.endswith(("." + name, "/" + name)) for name in names)


def rwx_support(provisioner: str) -> bool | None:
    """Whether a provisioner's volumes can be ReadWriteMany; None when mlenv does not know it."""
    if _known(provisioner, RWX_PROVISIONERS):
        return True
    return False if _known(provisioner, RWO_PROVISIONERS) else None


def is_default_class(storage_class: Mapping[str, Any]) -> bool:
    """Whether a StorageClass is the cluster's default (the annotation ``kubectl get storageclass`` marks)."""
    annotations = (storage_class.get("metadata") or {}).get("annotations") or {}
    return annotations.get(DEFAULT_CLASS) == "true"


def before_deploy(client: Client, target: KubeHandle, plan: JobPlan) -> list[Check]:
    """Every check; the cluster is asked only once logged in."""
    _, checks = preflight(client, target, [*target.kinds, DATA_KIND.lower()])
    checks.append(image_check(plan.image))
    if not any(c.name == "login" and c.status == "PASS" for c in checks):
        return [*checks, Check("cluster facts", "WARN", "nodes, storage, networks and security not checked: "
                                                        "not logged in")]
    checks += node_checks(client, plan)
    checks += storage_checks(client, plan)
    checks += check_networks(client, target.namespace, plan.rdma_networks)
    checks += admission_checks(client, target.namespace, plan.cluster.scheduling)
    if plan.ipc_lock:
        checks.append(scc_check(client, target) if target.openshift else pod_security_check(client, target))
    if target.openshift:
        checks += image_stream_checks(client, target, plan.image)
    return checks


def _allocatable(node: Mapping[str, Any], resource: str) -> Decimal:
    try:
        return parse_quantity(str(((node.get("status") or {}).get("allocatable") or {}).get(resource, 0)))
    except QuantityError:
        return Decimal(0)


def _node_problems(node: Mapping[str, Any], wanted: Mapping[str, int], cli: str) -> list[tuple[str, str]]:
    """(problem, fix) for everything that keeps a pod of ``wanted`` resources off ``node``."""
    name = node["metadata"]["name"]
    problems = []
    conditions = (node.get("status") or {}).get("conditions") or []
    ready: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
    if ready.get("status") != "True":
        why = ": ".join(str(ready[k]) for k in ("reason", "message") if ready.get(k)) or "no Ready condition"
        problems.append((f"not Ready ({why})", f"{cli} describe node {name} says why (ask the cluster admin), or "
                                               "leave it out of nodes.gpu_nodes"))
    if (node.get("spec") or {}).get("unschedulable"):
        uncordon = f"oc adm uncordon {name}" if cli == "oc" else f"kubectl uncordon {name}"
        problems.append(("cordoned (spec.unschedulable)", f"a cluster admin uncordons it: {uncordon}; or leave it out "
                                                          "of nodes.gpu_nodes"))
    for resource, amount in wanted.items():
        have = _allocatable(node, resource)
        if have < amount:
            fix = ("pin nodes that have GPUs in nodes.gpu_nodes (kubectl get nodes -l nvidia.com/gpu.present=true), "
                   "or lower gpus.per_node") if resource == GPU else \
                f"ask the cluster admin for {resource} on {name}, or fix network.rdma.resources"
            problems.append((f"{have.normalize():f} {resource} allocatable, {amount} needed per pod", fix))
    return problems


def _describe(node: Mapping[str, Any], wanted: Mapping[str, int]) -> str:
    amounts = ", ".join(f"{_allocatable(node, r).normalize():f} {r}" for r in wanted)
    return "Ready, schedulable" + (f", allocatable {amounts} ({', '.join(f'{n} {r}' for r, n in wanted.items())} "
                                   "per pod)" if wanted else "")


def node_checks(client: Client, plan: JobPlan) -> list[Check]:
    """Each pinned node (or every node the node selector admits) can take a pod, and enough of them for one pod per
    node; one list call."""
    wanted = {**({GPU: plan.gpus_per_node} if plan.gpus_per_node else {}), **plan.rdma_resources}
    try:
        listed = {n["metadata"]["name"]: n for n in client.nodes()}
    except KubeError as exc:
        return [Check("nodes", "WARN", f"cannot list nodes ({exc.detail}): nodes.gpu_nodes, GPUs and "
                                       "network.rdma.resources not checked")]
    cli = client.flavour
    pinned = list(dict.fromkeys(plan.cluster.gpu_nodes))
    checks, usable, reasons = [], [], []
    for name in pinned or sorted(listed):
        node = listed.get(name)
        if node is None:
            checks.append(Check(f"node {name}", "FAIL", f"node {name} does not exist",
                                f"remove it from nodes.gpu_nodes ({cli} get nodes -l nvidia.com/gpu.present=true "
                                "lists the GPU nodes)"))
            continue
        labels = node["metadata"].get("labels") or {}
        if not pinned and any(labels.get(k) != v for k, v in plan.cluster.scheduling.node_selector.items()):
            continue
        problems = _node_problems(node, wanted, cli)
        if problems:
            reasons.append(f"{name}: {problems[0][0]}")
        else:
            usable.append(name)
        if pinned:
            checks.append(Check(f"node {name}", "FAIL" if problems else "PASS",
                                "; ".join(p for p, _ in problems) or _describe(node, wanted),
                                "; ".join(dict.fromkeys(f for _, f in problems)) or None))
    enough = len(usable) >= plan.nodes
    shown = ", ".join(usable[:8]) + (" ..." if len(usable) > 8 else "")
    evidence = (f"{len(usable)} nodes can take a pod ({shown}); {plan.nodes} needed, one pod per node" if enough else
                f"{len(usable)} {'pinned ' if pinned else ''}nodes can take a pod ({shown or 'none'}), {plan.nodes} "
                f"needed (one pod per node){': ' + '; '.join(reasons[:4]) if reasons else ''}")
    checks.append(Check(f"nodes for {plan.nodes} pods", "PASS" if enough else "FAIL", evidence, None if enough else
                        f"deploy fewer nodes (--nodes {len(usable)} or gpus.default_nodes) or pin more nodes in "
                        "nodes.gpu_nodes"))
    return checks


def storage_checks(client: Client, plan: JobPlan) -> list[Check]:
    """The storage class the mode uses exists; for ``rwx`` its provisioner must support ReadWriteMany."""
    field = "storage.class_rwx" if plan.storage.shared else "storage.class_rwo"
    name = str(plan.storage.storage_class)
    try:
        classes = {c["metadata"]["name"]: c for c in client.select("storageclasses")}
    except KubeError as exc:
        return [Check(f"storage class {name}", "WARN", f"cannot list storage classes: {exc.detail}")]
    listing = ", ".join(f"{n} ({c.get('provisioner')}{', default' if is_default_class(c) else ''})"
                        for n, c in sorted(classes.items())) or "none"
    if name not in classes:
        return [Check(f"storage class {name}", "FAIL", f"storage class {name} does not exist (the cluster has: "
                                                       f"{listing})", f"set {field} to one of them")]
    provisioner = str(classes[name].get("provisioner"))
    checks = [Check(f"storage class {name}", "PASS", f"exists, provisioner {provisioner}")]
    if plan.storage.shared:
        rwx = rwx_support(provisioner)
        others = [n for n, c in sorted(classes.items()) if rwx_support(str(c.get("provisioner"))) and n != name]
        fix = (f"set storage.class_rwx to a class that supports it ({', '.join(others) or 'none found'}), or "
               "storage.mode: volumeClaimTemplates (one ReadWriteOnce volume per pod)")
        if rwx:
            checks.append(Check(f"ReadWriteMany {name}", "PASS", f"{provisioner} provisions ReadWriteMany volumes"))
        elif rwx is None:
            checks.append(Check(f"ReadWriteMany {name}", "WARN", f"mlenv does not know whether {provisioner} "
                                                                 "provisions ReadWriteMany volumes", fix))
        else:
            checks.append(Check(f"ReadWriteMany {name}", "FAIL", f"{name} ({provisioner}) provisions ReadWriteOnce "
                                                                 "volumes only; storage.mode rwx needs ReadWriteMany",
                                fix))
    return checks


def _can_use_as(client: Client, resource: str, namespace: str, user: str) -> bool | None:
    """``auth can-i use RESOURCE --as USER``; None when the question cannot be asked (impersonation forbidden)."""
    try:
        return client.run("auth", ["can-i", "use", resource, "-n", namespace, "--as", user],
                          namespaced=False).strip() == "yes"
    except KubeError as exc:
        return None if exc.reason == "Forbidden" else False


def scc_check(client: Client, target: KubeHandle) -> Check:
    """OpenShift: mlenv's IPC_LOCK SCC exists, allows IPC_LOCK, and the ServiceAccount may use it."""
    scc = str(target.ipc_lock_scc)
    name = "IPC_LOCK SCC"
    fix = f"a cluster admin applies the SCC and RBAC once: mlenv render {target.cluster_file} --admin | oc apply -f -"
    try:
        found = json.loads(client.run("get", ["securitycontextconstraints.security.openshift.io", scc, "-o", "json"],
                                      namespaced=False))
    except (KubeError, ValueError) as exc:
        if isinstance(exc, KubeError) and exc.reason == "NotFound":
            return Check(name, "FAIL", f"SCC {scc} does not exist", fix)
        found = None  # may not be readable by project members: the access review still answers
    capabilities = (found or {}).get("allowedCapabilities") or []
    if found is not None and not {"IPC_LOCK", "*"} & set(capabilities):
        return Check(name, "FAIL", f"SCC {scc} does not allow IPC_LOCK (allowedCapabilities: "
                                   f"{', '.join(capabilities) or 'none'})", fix)
    account = f"system:serviceaccount:{target.namespace}:{target.service_account}"
    allowed = _can_use_as(client, f"securitycontextconstraints.security.openshift.io/{scc}", target.namespace,
                          account)
    if allowed is None:
        return Check(name, "WARN", f"cannot ask whether {account} may use SCC {scc} (impersonation not allowed)",
                     f"ask a cluster admin: oc adm policy who-can use scc/{scc} -n {target.namespace}")
    if not allowed:
        return Check(name, "FAIL", f"ServiceAccount {target.service_account} may not use SCC {scc} "
                                   f"(auth can-i use scc/{scc} --as {account}: no)", fix)
    return Check(name, "PASS", f"ServiceAccount {target.service_account} may use SCC {scc}, which allows IPC_LOCK")


def pod_security_check(client: Client, target: KubeHandle) -> Check:
    """Kubernetes: IPC_LOCK needs the namespace's Pod Security level to be privileged."""
    namespace = target.namespace
    fix = (f"a namespace admin: kubectl label namespace {namespace} {ENFORCE}=privileged --overwrite; or "
           "security.ipc_lock: false")
    try:
        labels = json.loads(client.run("get", ["namespace", namespace, "-o", "json"], namespaced=False)
                            )["metadata"].get("labels") or {}
    except (KubeError, ValueError, KeyError) as exc:
        return Check("IPC_LOCK pod security", "WARN", f"cannot read namespace {namespace}'s labels: {exc}")
    level = labels.get(ENFORCE)
    if level == "privileged":
        return Check("IPC_LOCK pod security", "PASS", f"namespace {namespace}: {ENFORCE}=privileged allows IPC_LOCK")
    if level is None:
        return Check("IPC_LOCK pod security", "WARN", f"namespace {namespace} has no {ENFORCE} label: the cluster's "
                                                      "default level applies (privileged unless configured)", fix)
    return Check("IPC_LOCK pod security", "FAIL", f"namespace {namespace}: {ENFORCE}={level} forbids IPC_LOCK", fix)


def image_problem(reference: str) -> str | None:
    """Why ``reference`` is not a valid image reference ([registry/]path[:tag][@digest]), or None."""
    name, _, digest = reference.partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        return f"digest {digest!r} is not ALGORITHM:HEX"
    head, _, last = name.rpartition("/")
    last, _, tag = last.partition(":")
    if tag and not _TAG.fullmatch(tag):
        return f"tag {tag!r} is not letters, digits, '_', '.' and '-' (at most 128)"
    parts = [*(head.split("/") if head else []), last]
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        registry = parts.pop(0)
        if not _DOMAIN.fullmatch(registry):
            return f"registry {registry!r} is not a host name with an optional port"
    for part in parts:
        if not _COMPONENT.fullmatch(part):
            return f"path component {part!r} must be lowercase letters and digits separated by '.', '_', '__' or '-'"
    return "longer than 255 characters" if len(name) > 255 else None


def image_check(image: str) -> Check:
    """The image reference is well-formed (what the kubelet will pull)."""
    problem = image_problem(image)
    if problem:
        return Check("image", "FAIL", f"{image} is not a valid image reference: {problem}",
                     "fix image: in the cluster file (or --image)")
    return Check("image", "PASS", f"{image} is a well-formed reference")


def image_stream_checks(client: Client, target: KubeHandle, image: str) -> list[Check]:
    """An image from OpenShift's internal registry names an ImageStream tag: it must exist."""
    registry, _, rest = image.partition("/")
    if not INTERNAL_REGISTRY.fullmatch(registry) or "@" in rest:
        return []
    namespace, _, stream = rest.partition("/")
    stream, _, tag = stream.partition(":")
    tag = tag or "latest"
    name = f"ImageStreamTag {namespace}/{stream}:{tag}"
    try:
        client.run("get", ["imagestreamtags.image.openshift.io", f"{stream}:{tag}", "-n", namespace, "-o", "name"],
                   namespaced=False)
    except KubeError as exc:
        if exc.reason == "NotFound":
            return [Check("image stream", "FAIL", f"{name} does not exist",
                          f"oc get imagestreamtags -n {namespace} lists the tags: push or import it (oc import-image "
                          f"{stream}:{tag} --from=IMAGE --confirm -n {namespace}), or fix image: in the cluster file")]
        return [Check("image stream", "WARN", f"{name} cannot be read: {exc.detail}")]
    return [Check("image stream", "PASS", f"{name} exists")]
