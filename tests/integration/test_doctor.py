"""``mlenv doctor``: the Kubernetes/OpenShift checks before deploy against fakekube through the real kubectl (one
fixture per failing check, asserting the FAIL and its fix), the comparison across nodes from what the runtime reads
in fixture sysfs trees, and the checks on the nodes of a live local cluster (network namespaces)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlenv.core.capabilities import Node
from mlenv.ops.doctor import NodeReport, clock_check, compare_nodes, node_checks
from mlenv.runtime.doctor import examine

from tests.fakekube import Deny, NodeSpec
from tests.fakekube.fixtures import FakeCluster, fake_kube_factory  # noqa: F401 - the fixture, re-exported
from tests.fakekube.seeds import image_stream, network_attachment_definition, security_context_constraints
from tests.helpers import invoke as mlenv
from tests.integration.local_cluster import make_project, require_local

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
NAMESPACE = "ml"
RDMA_NODES = [NodeSpec("gpu-0", allocatable={"rdma/rdma": "1"}), NodeSpec("gpu-1", allocatable={"rdma/rdma": "1"})]
ADMIN_FIX = "a cluster admin applies the SCC and RBAC once: mlenv render {file} --admin | oc apply -f -"


@pytest.fixture
def cluster(fake_kube_factory: Callable[..., FakeCluster],  # noqa: F811 - pytest fixture injection
            monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeCluster]:
    """Start a fake cluster (nodes gpu-0 and gpu-1 with 8 GPUs and one rdma/rdma each, the NAD ml/roce) that the
    CLI's kubectl uses."""

    def start(nodes: list[NodeSpec] = RDMA_NODES, openshift: bool = True) -> FakeCluster:
        fake = fake_kube_factory(nodes=nodes, namespaces=[NAMESPACE], openshift=openshift)
        fake.server.add(network_attachment_definition(NAMESPACE, "roce", resource_name="rdma/rdma"))
        fake.use_in(monkeypatch)
        return fake

    return start


def cluster_file(home: Path, fake: FakeCluster, **changes: Any) -> str:
    """A cluster file for ``fake`` asking for RDMA (NAD roce, rdma/rdma: 1), RWX storage on nfs-csi, 2 pods of 4
    GPUs on gpu-0 and gpu-1; ``changes`` replace top-level sections or, dotted, single fields."""
    document: dict[str, Any] = {
        "backend": "kubernetes",
        "cluster": {"name": "fake", "api": f"127.0.0.1:{fake.server.port}", "namespace": NAMESPACE},
        "nodes": {"gpu_nodes": ["gpu-0", "gpu-1"]},
        "storage": {"mode": "rwx", "class_rwx": "nfs-csi", "class_rwo": "ceph-rbd", "workspace_size": "1Gi",
                    "datasets_size": "1Gi"},
        "network": {"rdma": {"enabled": True, "networks": ["roce"], "resources": {"rdma/rdma": 1}}},
        "security": {"ipc_lock": False},
        "gpus": {"per_node": 4, "default_nodes": 2},
    }
    for key, value in changes.items():
        *parents, last = key.split("__")
        section = document
        for parent in parents:
            section = section[parent]
        section[last] = value
    path = home / "clusters" / "fake.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


def doctor(path: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """Exit code and the checks by name of ``mlenv doctor PATH --mode rdma --json``."""
    result = mlenv("doctor", path, "--mode", "rdma", "--json")
    report = json.loads(result.stdout)
    assert report["deployment"] is None  # nothing recorded: only the checks before deploy
    return result.exit_code, {c["name"]: c for c in report["checks"]}


def test_a_ready_cluster_passes_every_check(cluster: Callable[..., FakeCluster], home: Path) -> None:
    fake = cluster(openshift=False)
    fake.server.set_namespace_labels(NAMESPACE, {"pod-security.kubernetes.io/enforce": "privileged"})
    code, checks = doctor(cluster_file(home, fake, security={"ipc_lock": True}))
    assert code == 0, checks
    assert {c["status"] for c in checks.values()} == {"PASS"}
    assert checks["node gpu-0"]["evidence"] == ("Ready, schedulable, allocatable 8 nvidia.com/gpu, 1 rdma/rdma "
                                                "(4 nvidia.com/gpu, 1 rdma/rdma per pod)")
    assert checks["nodes for 2 pods"]["evidence"] == "2 nodes can take a pod (gpu-0, gpu-1); 2 needed, one pod per node"
    assert checks["ReadWriteMany nfs-csi"]["evidence"] == "nfs.csi.k8s.io provisions ReadWriteMany volumes"
    assert checks["network roce"]["evidence"] == "NetworkAttachmentDefinition ml/roce exists"
    assert checks["IPC_LOCK pod security"]["evidence"] == (
        "namespace ml: pod-security.kubernetes.io/enforce=privileged allows IPC_LOCK")
    assert {"login", "namespace", "may create statefulsets.apps", "image", "storage class nfs-csi"} <= set(checks)


def no_gpus_on_gpu_1(cluster: Callable[..., FakeCluster]) -> FakeCluster:
    return cluster(nodes=[RDMA_NODES[0], NodeSpec("gpu-1", gpus=0, allocatable={"rdma/rdma": "1"})])


def gpu_1_not_ready(cluster: Callable[..., FakeCluster]) -> FakeCluster:
    fake = cluster()
    fake.server.set_node("gpu-1", ready=False)
    return fake


def gpu_1_cordoned(cluster: Callable[..., FakeCluster]) -> FakeCluster:
    fake = cluster()
    fake.server.set_node("gpu-1", unschedulable=True)
    return fake


def scc_forbidden(cluster: Callable[..., FakeCluster]) -> FakeCluster:
    fake = cluster()
    fake.server.add(security_context_constraints("mlenv-ipc-lock", capabilities=("IPC_LOCK",)))
    fake.server.denied.add(Deny("use", "securitycontextconstraints/mlenv-ipc-lock",
                                user="system:serviceaccount:ml:ml-dev-sa"))
    return fake


FAILING = {
    "missing NAD": (lambda c: c(), {"network__rdma__networks": ["roce", "missing-net"]}, "network missing-net",
                    "NetworkAttachmentDefinition ml/missing-net does not exist",
                    "kubectl get network-attachment-definitions -A lists them; fix network.rdma.networks"),
    "missing storage class": (lambda c: c(), {"storage__class_rwx": "nfs"}, "storage class nfs",
                              "storage class nfs does not exist (the cluster has: ceph-rbd (rbd.csi.ceph.com), cephfs "
                              "(cephfs.csi.ceph.com), local-storage (kubernetes.io/no-provisioner), nfs-csi "
                              "(nfs.csi.k8s.io, default))", "set storage.class_rwx to one of them"),
    "node not Ready": (gpu_1_not_ready, {}, "node gpu-1",
                       "not Ready (NodeStatusUnknown: Kubelet stopped posting node status.)",
                       "kubectl describe node gpu-1 says why (ask the cluster admin), or leave it out of "
                       "nodes.gpu_nodes"),
    "no GPUs": (no_gpus_on_gpu_1, {}, "node gpu-1", "0 nvidia.com/gpu allocatable, 4 needed per pod",
                "pin nodes that have GPUs in nodes.gpu_nodes (kubectl get nodes -l nvidia.com/gpu.present=true), or "
                "lower gpus.per_node"),
    "node cordoned": (gpu_1_cordoned, {}, "node gpu-1", "cordoned (spec.unschedulable)",
                      "a cluster admin uncordons it: kubectl uncordon gpu-1; or leave it out of nodes.gpu_nodes"),
    "no RDMA resource": (lambda c: c(nodes=[RDMA_NODES[0], NodeSpec("gpu-1")]), {}, "node gpu-1",
                         "0 rdma/rdma allocatable, 1 needed per pod",
                         "ask the cluster admin for rdma/rdma on gpu-1, or fix network.rdma.resources"),
    "SCC forbidden": (scc_forbidden, {"backend": "openshift", "security__ipc_lock": True}, "IPC_LOCK SCC",
                      "ServiceAccount ml-dev-sa may not use SCC mlenv-ipc-lock (auth can-i use scc/mlenv-ipc-lock "
                      "--as system:serviceaccount:ml:ml-dev-sa: no)", ADMIN_FIX),
    "RWX class that is not RWX": (lambda c: c(), {"storage__class_rwx": "ceph-rbd"}, "ReadWriteMany ceph-rbd",
                                  "ceph-rbd (rbd.csi.ceph.com) provisions ReadWriteOnce volumes only; storage.mode "
                                  "rwx needs ReadWriteMany",
                                  "set storage.class_rwx to a class that supports it (cephfs, nfs-csi), or "
                                  "storage.mode: volumeClaimTemplates (one ReadWriteOnce volume per pod)"),
    "SCC missing": (lambda c: c(), {"backend": "openshift", "security__ipc_lock": True}, "IPC_LOCK SCC",
                    "SCC mlenv-ipc-lock does not exist", ADMIN_FIX),
    "Pod Security forbids IPC_LOCK": (
        lambda c: c(openshift=False), {"security__ipc_lock": True}, "IPC_LOCK pod security",
        "namespace ml: pod-security.kubernetes.io/enforce=baseline forbids IPC_LOCK",
        "a namespace admin: kubectl label namespace ml pod-security.kubernetes.io/enforce=privileged --overwrite; "
        "or security.ipc_lock: false"),
    "image tag not in the ImageStream": (
        lambda c: c(), {"backend": "openshift",
                        "image": "image-registry.openshift-image-registry.svc:5000/ml/pytorch:2.6"},
        "image stream", "ImageStreamTag ml/pytorch:2.6 does not exist",
        "oc get imagestreamtags -n ml lists the tags: push or import it (oc import-image pytorch:2.6 --from=IMAGE "
        "--confirm -n ml), or fix image: in the cluster file"),
    "malformed image": (lambda c: c(), {"image": "registry.example.com/ML/pytorch:2.5"}, "image",
                        "registry.example.com/ML/pytorch:2.5 is not a valid image reference: path component 'ML' "
                        "must be lowercase letters and digits separated by '.', '_', '__' or '-'",
                        "fix image: in the cluster file (or --image)"),
}


@pytest.mark.parametrize(("make", "changes", "name", "evidence", "fix"), FAILING.values(), ids=FAILING.keys())
def test_each_failing_check_says_why_and_the_fix(cluster: Callable[..., FakeCluster], home: Path,
                                                 make: Callable[..., FakeCluster], changes: dict[str, Any], name: str,
                                                 evidence: str, fix: str) -> None:
    fake = make(cluster)
    if "baseline" in evidence:
        fake.server.set_namespace_labels(NAMESPACE, {"pod-security.kubernetes.io/enforce": "baseline"})
    for obj in image_stream(NAMESPACE, "pytorch", {"2.5": "quay.io/x/pytorch:2.5"}):
        fake.server.add(obj)
    path = cluster_file(home, fake, **changes)
    code, checks = doctor(path)
    assert code == 1
    assert checks[name]["status"] == "FAIL", checks[name]
    assert checks[name]["evidence"] == evidence
    assert checks[name]["fix"] == fix.format(file=path)
    failed = {n for n, c in checks.items() if c["status"] == "FAIL"}
    assert failed <= {name, "nodes for 2 pods"}, failed  # one cause, one FAIL (and the node count it costs)
    assert {"login", "storage class nfs-csi", "network roce"} & set(checks)  # every other check ran too


def test_node_count_and_existing_image_stream(cluster: Callable[..., FakeCluster], home: Path) -> None:
    fake = gpu_1_not_ready(cluster)
    for obj in image_stream(NAMESPACE, "pytorch", {"2.5": "quay.io/x/pytorch:2.5"}):
        fake.server.add(obj)
    code, checks = doctor(cluster_file(home, fake, backend="openshift", nodes={"gpu_nodes": ["gpu-0", "gpu-1",
                                                                                            "gpu-9"]},
                                       image="image-registry.openshift-image-registry.svc:5000/ml/pytorch:2.5"))
    assert code == 1
    assert checks["node gpu-9"]["evidence"] == "node gpu-9 does not exist"
    assert checks["nodes for 2 pods"] == {
        "name": "nodes for 2 pods", "status": "FAIL", "scope": "cluster",
        "evidence": "1 pinned nodes can take a pod (gpu-0), 2 needed (one pod per node): gpu-1: not Ready "
                    "(NodeStatusUnknown: Kubelet stopped posting node status.)",
        "fix": "deploy fewer nodes (--nodes 1 or gpus.default_nodes) or pin more nodes in nodes.gpu_nodes"}
    assert checks["image stream"]["status"] == "PASS"


def test_not_logged_in_fails_login_and_asks_nothing_else(cluster: Callable[..., FakeCluster], home: Path) -> None:
    fake = cluster()
    path = cluster_file(home, fake)
    fake.server.token = "expired"  # noqa: S105 - the fake's credential
    code, checks = doctor(path)
    assert code == 1
    assert checks["login"]["status"] == "FAIL"
    assert checks["login"]["fix"] == (f"get credentials for 127.0.0.1:{fake.server.port} into your kubeconfig "
                                      "(kubectl config get-contexts lists them)")
    assert checks["cluster facts"]["status"] == "WARN"
    assert not [n for n in checks if n.startswith(("node", "storage", "network"))]


def test_human_output_is_a_table_with_the_fixes(cluster: Callable[..., FakeCluster], home: Path) -> None:
    fake = cluster()
    result = mlenv("doctor", "--cluster", cluster_file(home, fake, storage__class_rwx="nfs"), "--mode", "rdma")
    assert result.exit_code == 1
    assert "mlenv doctor: fake (kubernetes, rdma)" in result.stdout
    row = next(line for line in result.stdout.splitlines() if line.startswith("storage class nfs"))
    assert "FAIL" in row and "set storage.class_rwx to one of them" in row


# --- across nodes: what the runtime reads in fixture sysfs trees, compared ---


@pytest.fixture
def facts(tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """The facts the runtime doctor finds on a node with ``sysfs`` (a fixture tree) and ``versions`` from torch."""

    def read(sysfs: str, mode: str = "rdma", **versions: Any) -> dict[str, Any]:
        python = tmp_path / f"python-{len(list(tmp_path.iterdir()))}"
        answer = {"torch": "2.5.1", "cuda": "12.4", "nccl": "2.21.5", "gpus": 4, **versions}
        python.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
        python.chmod(0o755)
        report = examine({"MLENV_NODE_RANK": "0", "MLENV_NUM_NODES": "1", "MLENV_NETWORK_MODE": mode},
                         sysfs_root=FIXTURES / "sysfs" / sysfs, proc_root=FIXTURES / "proc" / "pod_rdma",
                         python=str(python))
        return dict(report.facts)

    return read


def by_name(checks: list[Any]) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.evidence) for c in checks}


def test_the_odd_node_is_named_when_hcas_differ(facts: Callable[..., dict[str, Any]]) -> None:
    infiniband, roce = facts("infiniband"), facts("sriov_vfs")
    found = by_name(compare_nodes({"pod-0": infiniband, "pod-1": infiniband, "pod-2": roce}, rdma=True))
    assert found["same HCA count"] == ("FAIL", "pod-2 has 6; the other 2 node(s) have 4")
    assert found["same link layer"] == ("FAIL", "pod-2 has Ethernet; the other 2 node(s) have InfiniBand")
    assert found["same GID type"] == ("FAIL", "pod-2 has RoCE v2 IPv4; the other 2 node(s) have unknown")
    assert found["same link rate"] == ("PASS", "all 3 nodes: 200")
    assert found["same NCCL version"] == ("PASS", "all 3 nodes: 2.21.5")


def test_versions_and_gpus_that_differ_fail(facts: Callable[..., dict[str, Any]]) -> None:
    nodes = {"pod-0": facts("infiniband"), "pod-1": facts("infiniband", torch="2.4.0", nccl="2.20.5", gpus=2)}
    found = compare_nodes(nodes, rdma=True)
    failed = {c.name: (c.evidence, c.fix) for c in found if c.status == "FAIL"}
    assert set(failed) == {"same torch version", "same NCCL version", "same GPU count"}
    assert failed["same torch version"] == ("pod-1 has 2.4.0; the other 1 node(s) have 2.5.1",
                                            "run the same image on every node (image: in the cluster file)")
    assert failed["same GPU count"][0] == "pod-1 has 2; the other 1 node(s) have 4"


def test_different_interface_names_alone_are_fine_and_listed(facts: Callable[..., dict[str, Any]]) -> None:
    first, second = facts("infiniband"), facts("infiniband")
    first["interface"], second["interface"] = "ens1f1", "ens1f0np0"
    found = compare_nodes({"pod-0": first, "pod-1": second}, rdma=True)
    assert {c.status for c in found} == {"PASS"}
    assert by_name(found)["socket interfaces"] == (
        "PASS", "pod-0: ens1f1, pod-1: ens1f0np0 (different names are fine: each node uses its own)")


def test_tcp_mode_compares_no_rdma_facts(facts: Callable[..., dict[str, Any]]) -> None:
    found = by_name(compare_nodes({"pod-0": facts("infiniband", "tcp"), "pod-1": facts("sriov_vfs", "tcp")},
                                  rdma=False))
    assert not [name for name in found if "HCA" in name or "link" in name or "GID" in name]
    assert {status for status, _ in found.values()} == {"PASS"}


def test_clocks_more_than_a_second_apart_fail_naming_the_node() -> None:
    assert clock_check({"pod-0": 0.02, "pod-1": -0.3}).status == "PASS"
    late = clock_check({"pod-0": 0.0, "pod-1": 0.1, "pod-2": 2.5})
    assert (late.status, late.evidence) == ("FAIL", "pod-2's clock is +2.4 s off the others' (spread 2.5 s, more "
                                                    "than 1 s)")
    assert late.fix == "synchronise the clock of pod-2's host (chrony or NTP)"


def test_a_node_without_an_answer_fails_with_what_it_said(facts: Callable[..., dict[str, Any]]) -> None:
    answered = NodeReport(Node(0, "pod-0", "/workspace"), {"checks": [], "facts": facts("infiniband")}, 0.0)
    silent = NodeReport(Node(1, "pod-1", "/workspace"), None, None, ["/usr/bin/python3: No module named mlenv"])
    found = node_checks({0: answered, 1: silent}, "rdma", gpus_per_node=4)
    assert by_name(found)["pod-1: runtime doctor"] == ("FAIL", "/usr/bin/python3: No module named mlenv")
    assert by_name(found)["pod-0: GPUs"] == ("PASS", "4 GPUs visible, gpus.per_node is 4")


# --- on the nodes of a live local cluster ---


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Any]:
    require_local("namespaces")
    project = make_project(tmp_path, "ldoc", "10.77.64.0/24", "namespaces")
    yield project
    project.mlenv("clean", "--cluster", project.name, "--delete-data", "--yes")


def test_nodes_are_checked_only_once_deployed(local: Any) -> None:
    before = json.loads(local.ok("doctor", local.name, "--json").stdout)
    assert before["deployment"] is None and {c["scope"] for c in before["checks"]} == {"cluster"}
    local.ok("deploy", local.name)
    result = local.mlenv("doctor", "--json", timeout=180)  # the current deployment, never synced
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["deployment"] == local.name
    checks = {c["name"]: c for c in report["checks"] if c["scope"] == "nodes"}
    master = f"{local.app}-0.{local.app}-headless.{local.name}-ns.svc.cluster.local"
    assert checks[f"{local.app}-1: master address"]["evidence"] == (
        f"{master} is 10.77.64.2 (dev ens1f0np0), rendezvous port 29500")
    assert checks[f"{local.app}-0: rendezvous port"]["evidence"] == (
        "listened on port 29500: 1 of 1 other nodes connected")
    assert checks[f"{local.app}-1: rendezvous port"]["evidence"] == "connected to 10.77.64.2:29500"
    assert checks["clocks"]["status"] == "PASS"
    assert checks["socket interfaces"]["evidence"] == (
        f"{local.app}-0: ens1f1, {local.app}-1: ens1f0np0 (different names are fine: each node uses its own)")
    assert {c["status"] for c in checks.values()} == {"PASS"}
