"""The fake API server, exercised by the real kubectl binary (and a few pure unit tests of its parts)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from . import fixtures
from .access import Deny, Request
from .fixtures import FakeCluster
from .patches import server_side_apply, strategic_merge_patch
from .scheduler import schedule
from .seeds import NodeSpec, image_stream, network_attachment_definition, node, storage_class
from .selectors import labels_match, parse_field_selector, parse_label_selector

INSTANCE = "demo"
SELECTOR = f"app.kubernetes.io/instance={INSTANCE}"
IMAGE = "quay.io/example/pytorch:2.5"


def manifests(replicas: int = 2, node_names: list[str] | None = None, capabilities: bool = False,
              limits: dict[str, int] | None = None) -> str:
    """What a deploy tool applies: ServiceAccount, headless Service, shared PVC, StatefulSet with a VCT."""
    labels = {"app.kubernetes.io/instance": INSTANCE, "app.kubernetes.io/managed-by": "mlenv"}
    meta = {"labels": labels}
    container: dict[str, Any] = {"name": "pytorch", "image": IMAGE,
                                 "resources": {"limits": limits or {"nvidia.com/gpu": 4}}}
    if capabilities:
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    affinity: dict[str, Any] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app.kubernetes.io/instance": INSTANCE}},
         "topologyKey": "kubernetes.io/hostname"}]}}
    if node_names:
        affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": node_names}]}]}}
    objects = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ml-dev-env", **meta}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ml-dev-env-headless", **meta},
         "spec": {"clusterIP": "None", "selector": {"app.kubernetes.io/instance": INSTANCE},
                  "ports": [{"name": "master", "port": 29500}]}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "ml-dev-env-workspace", **meta},
         "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "100Gi"}}}},
        {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "ml-dev-env", **meta},
         "spec": {
             "replicas": replicas, "serviceName": "ml-dev-env-headless", "podManagementPolicy": "Parallel",
             "selector": {"matchLabels": {"app.kubernetes.io/instance": INSTANCE}},
             "template": {"metadata": {"labels": {**labels, "app": "ml-dev-env-multi"}},
                          "spec": {"serviceAccountName": "ml-dev-env", "affinity": affinity,
                                   "containers": [container]}},
             "volumeClaimTemplates": [{"metadata": {"name": "scratch", "labels": {"mlenv/volume": "scratch"}},
                                       "spec": {"accessModes": ["ReadWriteOnce"],
                                                "resources": {"requests": {"storage": "10Gi"}}}}],
         }},
    ]
    return yaml.safe_dump_all(objects)


def ok(result: Any) -> str:
    """stdout of a kubectl run that must have succeeded."""
    assert result.returncode == 0, f"kubectl failed ({result.returncode}): {result.stderr}"
    return str(result.stdout)


def apply(cluster: FakeCluster, text: str) -> str:
    """``kubectl apply --server-side --field-manager mlenv -f -``."""
    return ok(cluster.kubectl("apply", "--server-side", "--field-manager", "mlenv", "-f", "-", input=text))


def get_json(cluster: FakeCluster, *args: str) -> Any:
    """``kubectl get ARGS -o json``, parsed."""
    return json.loads(ok(cluster.kubectl("get", *args, "-o", "json")))


def versions(cluster: FakeCluster) -> dict[str, str]:
    """kind/name → resourceVersion of everything the deploy created."""
    items = get_json(cluster, "serviceaccount,service,pvc,statefulset", "-l", SELECTOR)["items"]
    return {f"{i['kind']}/{i['metadata']['name']}": i["metadata"]["resourceVersion"] for i in items}


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    """One status condition of an object."""
    return next(c for c in obj["status"]["conditions"] if c["type"] == kind)


def node_states(cluster: FakeCluster) -> dict[str, str]:
    """Node name → the STATUS column of plain ``kubectl get nodes``."""
    rows = ok(cluster.kubectl("get", "nodes")).splitlines()[1:]
    return {row.split()[0]: row.split()[1] for row in rows}


def events_of(cluster: FakeCluster, name: str) -> list[dict[str, Any]]:
    """The events about an object, via ``kubectl get events --field-selector involvedObject.name=NAME``."""
    items: list[dict[str, Any]] = get_json(cluster, "events", "--field-selector", f"involvedObject.name={name}")[
        "items"
    ]
    return items


# --- auth, discovery, errors --------------------------------------------------------------------------------


def test_whoami_and_discovery(fake_kube: FakeCluster) -> None:
    review = json.loads(ok(fake_kube.kubectl("auth", "whoami", "-o", "json")))
    assert review["status"]["userInfo"]["username"] == "developer"
    assert ok(fake_kube.kubectl("version")).count("v1.32") == 2
    names = [n["metadata"]["name"] for n in get_json(fake_kube, "namespaces")["items"]]
    assert names == ["default", "ml"]
    namespaces = json.loads(ok(fake_kube.kubectl("get", "--raw", "/api/v1/namespaces")))
    assert (namespaces["kind"], namespaces["apiVersion"]) == ("NamespaceList", "v1")
    assert namespaces["metadata"]["resourceVersion"]
    assert json.loads(ok(fake_kube.kubectl("get", "--raw", "/api/v1")))["groupVersion"] == "v1"
    resources = ok(fake_kube.kubectl("api-resources", "-o", "name"))
    for name in ("statefulsets.apps", "securitycontextconstraints.security.openshift.io", "routes.route.openshift.io",
                 "network-attachment-definitions.k8s.cni.cncf.io", "rolebindings.rbac.authorization.k8s.io",
                 "storageclasses.storage.k8s.io", "networkpolicies.networking.k8s.io",
                 "subjectaccessreviews.authorization.k8s.io", "imagestreamtags.image.openshift.io"):
        assert name in resources.split()
    version = json.loads(ok(fake_kube.kubectl("version", "-o", "json")))
    assert version["serverVersion"]["gitVersion"] == "v1.32.4"


def test_wrong_token_is_unauthorized(fake_kube: FakeCluster) -> None:
    fake_kube.server.token = "rotated"  # noqa: S105 - the kubeconfig's token no longer matches
    result = fake_kube.kubectl("get", "pods")
    assert result.returncode == 1
    # "(Unauthorized)" once discovery is cached; before, kubectl words the same 401 this way (as with a real server)
    assert "error: You must be logged in to the server (the server has asked for the client to provide " in (
        result.stderr
    )


def test_missing_namespace(fake_kube: FakeCluster) -> None:
    result = fake_kube.kubectl("get", "namespace", "nope")
    assert 'Error from server (NotFound): namespaces "nope" not found' in result.stderr
    result = fake_kube.kubectl("apply", "--server-side", "--field-manager", "mlenv", "-n", "nope", "-f", "-",
                               input=manifests())
    assert result.returncode == 1
    assert 'Error from server (NotFound): namespaces "nope" not found' in result.stderr
    assert fake_kube.server.objects("serviceaccounts") == []


def test_forbidden_namespace(fake_kube: FakeCluster) -> None:
    fake_kube.server.forbidden_namespaces.add("ml")
    result = fake_kube.kubectl("get", "pods")
    assert result.returncode == 1
    assert ('Error from server (Forbidden): pods is forbidden: User "developer" cannot list resource "pods" '
            'in API group "" in the namespace "ml"') in result.stderr
    assert fake_kube.kubectl("auth", "can-i", "create", "statefulsets").stdout.strip() == "no"
    assert ok(fake_kube.kubectl("auth", "can-i", "create", "pods", "-n", "default")).strip() == "yes"


# --- deploy, converge, scale, clean ------------------------------------------------------------------------


def test_deploy_reapply_scale_and_clean(fake_kube: FakeCluster) -> None:
    cluster, server = fake_kube, fake_kube.server
    dry = ok(cluster.kubectl("apply", "--server-side", "--field-manager", "mlenv", "--dry-run=server", "-f", "-",
                             input=manifests()))
    assert dry.count("serverside-applied (server dry run)") == 4
    assert server.objects("statefulsets") == []
    assert apply(cluster, manifests()).count("serverside-applied") == 4

    server.requests.clear()
    pods = get_json(cluster, "pods", "-l", SELECTOR)["items"]
    assert server.requests.count(verb="list", resource="pods") == 1
    assert [p["metadata"]["name"] for p in pods] == ["ml-dev-env-0", "ml-dev-env-1"]
    for index, pod in enumerate(pods):
        assert pod["status"]["phase"] == "Running"
        assert condition(pod, "Ready")["status"] == "True"
        assert pod["status"]["containerStatuses"][0]["ready"] is True
        assert pod["status"]["podIP"].startswith("10.128.")
        labels = pod["metadata"]["labels"]
        assert labels["statefulset.kubernetes.io/pod-name"] == f"ml-dev-env-{index}"
        assert labels["apps.kubernetes.io/pod-index"] == str(index)
        assert labels["app"] == "ml-dev-env-multi"
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "StatefulSet"
        assert pod["spec"]["subdomain"] == "ml-dev-env-headless"
    assert {p["spec"]["nodeName"] for p in pods} == {"node-0", "node-1"}  # one per node (anti-affinity)
    claim = get_json(cluster, "pvc", "scratch-ml-dev-env-1")
    assert claim["status"]["phase"] == "Bound"
    assert claim["metadata"]["labels"] == {"mlenv/volume": "scratch", "app.kubernetes.io/instance": INSTANCE}
    sts = get_json(cluster, "statefulset", "ml-dev-env")
    assert sts["status"]["readyReplicas"] == 2
    assert sts["status"]["observedGeneration"] == 1

    before = versions(cluster)
    assert apply(cluster, manifests()).count("serverside-applied") == 4
    assert versions(cluster) == before  # re-applying the same objects writes nothing

    apply(cluster, manifests(replicas=1))
    assert [p["metadata"]["name"] for p in get_json(cluster, "pods", "-l", SELECTOR)["items"]] == ["ml-dev-env-0"]
    sts = get_json(cluster, "statefulset", "ml-dev-env")
    assert (sts["metadata"]["generation"], sts["status"]["replicas"]) == (2, 1)
    ok(cluster.kubectl("scale", "statefulset", "ml-dev-env", "--replicas=2"))
    ok(cluster.kubectl("rollout", "status", "statefulset/ml-dev-env", "--timeout=10s"))
    assert len(get_json(cluster, "pods", "-l", SELECTOR)["items"]) == 2

    deleted = ok(cluster.kubectl("delete", "statefulset,service,serviceaccount", "-l", SELECTOR, "--wait=false"))
    assert 'statefulset.apps "ml-dev-env" deleted' in deleted
    assert get_json(cluster, "pods", "-l", SELECTOR)["items"] == []  # garbage-collected with the StatefulSet
    claims = [c["metadata"]["name"] for c in get_json(cluster, "pvc")["items"]]
    assert claims == ["ml-dev-env-workspace", "scratch-ml-dev-env-0", "scratch-ml-dev-env-1"]
    ok(cluster.kubectl("delete", "pvc", "-l", SELECTOR))
    ok(cluster.kubectl("delete", "pvc", "-l", "mlenv/volume=scratch"))
    assert "No resources found" in cluster.kubectl("get", "pvc").stderr


def test_template_change_replaces_pods_and_wait_watches(fake_kube_factory: Callable[..., FakeCluster]) -> None:
    # ready 3 s after creation: time enough for kubectl apply and get on a busy machine (0.3 s was not, under 4
    # workers on 2 cores: the pod read Running)
    cluster = fake_kube_factory(ready_delay=3)
    apply(cluster, manifests())
    assert get_json(cluster, "pod", "ml-dev-env-0")["status"]["phase"] == "Pending"  # ContainerCreating
    ok(cluster.kubectl("wait", "--for=condition=Ready", "pod", "-l", SELECTOR, "--timeout=30s"))
    assert cluster.server.requests.count(verb="watch", resource="pods") >= 1
    first = get_json(cluster, "pod", "ml-dev-env-0")["metadata"]["uid"]
    apply(cluster, manifests().replace(IMAGE, "quay.io/example/pytorch:2.6"))
    pod = get_json(cluster, "pod", "ml-dev-env-0")
    assert pod["metadata"]["uid"] != first
    assert pod["spec"]["containers"][0]["image"] == "quay.io/example/pytorch:2.6"


def test_logs_and_namespace_deletion(fake_kube: FakeCluster) -> None:
    apply(fake_kube, manifests())
    fake_kube.server.pod_logs[("ml", "ml-dev-env-1")] = "epoch 1 loss 0.5\n"
    assert ok(fake_kube.kubectl("logs", "ml-dev-env-1")) == "epoch 1 loss 0.5\n"
    ok(fake_kube.kubectl("delete", "namespace", "ml"))
    assert fake_kube.server.objects("pods") == []
    assert fake_kube.server.objects("pvc") == []


# --- faults -------------------------------------------------------------------------------------------------


def test_unschedulable(fake_kube: FakeCluster) -> None:
    fake_kube.server.faults.unschedulable = True
    apply(fake_kube, manifests())
    pod = get_json(fake_kube, "pod", "ml-dev-env-0")
    assert pod["status"]["phase"] == "Pending"
    scheduled = condition(pod, "PodScheduled")
    message = ("0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available: "
               "2 No preemption victims found for incoming pod.")
    assert (scheduled["status"], scheduled["reason"], scheduled["message"]) == ("False", "Unschedulable", message)
    [event] = events_of(fake_kube, "ml-dev-env-0")
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "FailedScheduling", message)

    fake_kube.server.faults.unschedulable = False
    fake_kube.server.reconcile()
    assert get_json(fake_kube, "pod", "ml-dev-env-0")["status"]["phase"] == "Running"


def test_scheduling_gates_hold_a_pod_until_lifted_and_cannot_be_added(fake_kube: FakeCluster) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gated", "namespace": "ml"},
           "spec": {"schedulingGates": [{"name": "example.com/wait"}],
                    "containers": [{"name": "c", "image": "busybox"}]}}
    ok(fake_kube.kubectl("create", "-f", "-", input=json.dumps(pod)))
    fake_kube.server.reconcile()
    gated = get_json(fake_kube, "pod", "gated")
    scheduled = condition(gated, "PodScheduled")
    assert (scheduled["status"], scheduled["reason"], scheduled["message"]) == (
        "False", "SchedulingGated", "Scheduling is blocked due to non-empty scheduling gates")
    assert "nodeName" not in gated["spec"]
    added = fake_kube.kubectl("patch", "pod", "gated", "--type=json", "-p",
                              '[{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "more"}}]')
    assert added.returncode == 1
    assert ("spec.schedulingGates: Forbidden: only deletion is allowed, but found new scheduling gate 'more'"
            in added.stderr)
    ok(fake_kube.kubectl("patch", "pod", "gated", "--type=json", "-p",
                         '[{"op": "remove", "path": "/spec/schedulingGates"}]'))
    fake_kube.server.reconcile()
    assert get_json(fake_kube, "pod", "gated")["spec"]["nodeName"] in ("node-0", "node-1")


def test_pods_of_another_scheduler_wait_for_it(fake_kube_factory: Callable[..., FakeCluster]) -> None:
    cluster = fake_kube_factory(addons=("volcano",))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gang", "namespace": "ml"},
           "spec": {"schedulerName": "volcano", "containers": [{"name": "c", "image": "busybox"}]}}
    ok(cluster.kubectl("create", "-f", "-", input=json.dumps(pod)))
    cluster.server.reconcile()
    assert "nodeName" not in get_json(cluster, "pod", "gang")["spec"]
    assert get_json(cluster, "podgroups")["items"] == []  # served: Volcano is installed
    cluster.server.schedulers.add("volcano")
    cluster.server.reconcile()
    assert get_json(cluster, "pod", "gang")["spec"]["nodeName"]
    assert fake_kube_factory().kubectl("get", "podgroups").returncode == 1  # not installed by default


def test_too_few_matching_nodes(fake_kube_factory: Callable[..., FakeCluster]) -> None:
    cluster = fake_kube_factory(nodes=["gpu-a", "gpu-b", "gpu-c"])
    apply(cluster, manifests(replicas=3, node_names=["gpu-a", "gpu-b"]))
    pods = get_json(cluster, "pods", "-l", SELECTOR)["items"]
    assert [p["status"]["phase"] for p in pods] == ["Running", "Running", "Pending"]
    assert condition(pods[2], "PodScheduled")["message"] == (
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 node(s) didn't match pod "
        "anti-affinity rules. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
    )


def test_image_pull_backoff(fake_kube: FakeCluster) -> None:
    fake_kube.server.faults.image_pull_backoff = True
    apply(fake_kube, manifests())
    pod = get_json(fake_kube, "pod", "ml-dev-env-0")
    assert pod["status"]["phase"] == "Pending"
    assert pod["spec"]["nodeName"]
    waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
    assert waiting == {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{IMAGE}"'}
    failed = [e["message"] for e in events_of(fake_kube, "ml-dev-env-0") if e["reason"] == "Failed"]
    assert any(m.startswith(f'Failed to pull image "{IMAGE}": ') for m in failed)
    assert "ImagePullBackOff" in ok(fake_kube.kubectl("get", "pods"))


def test_forbidden_capability(fake_kube: FakeCluster) -> None:
    fake_kube.server.faults.forbid_capabilities = True
    apply(fake_kube, manifests(capabilities=True))
    assert get_json(fake_kube, "pods")["items"] == []
    [event] = [e for e in events_of(fake_kube, "ml-dev-env") if e["reason"] == "FailedCreate"]
    assert event["type"] == "Warning"
    assert event["involvedObject"]["kind"] == "StatefulSet"
    assert event["message"] == (
        'create Pod ml-dev-env-0 in StatefulSet ml-dev-env failed error: pods "ml-dev-env-0" is forbidden: '
        'unable to validate against any security context constraint: [provider "anyuid": Forbidden: not usable '
        'by user or serviceaccount, spec.containers[0].securityContext.capabilities.add: Invalid value: '
        '"IPC_LOCK": capability may not be added, provider "restricted-v2": Forbidden: not usable by user or '
        'serviceaccount]'
    )
    fake_kube.server.faults.forbid_capabilities = False
    fake_kube.server.reconcile()
    assert len(get_json(fake_kube, "pods")["items"]) == 2


# --- what doctor and discover read: storage, networks, nodes, permissions, platform -------------------------


def test_storage_classes(fake_kube: FakeCluster) -> None:
    classes = {c["metadata"]["name"]: c for c in get_json(fake_kube, "storageclass")["items"]}
    assert {name: c["provisioner"] for name, c in classes.items()} == {
        "ceph-rbd": "rbd.csi.ceph.com", "cephfs": "cephfs.csi.ceph.com",
        "local-storage": "kubernetes.io/no-provisioner", "nfs-csi": "nfs.csi.k8s.io"}
    assert classes["nfs-csi"]["metadata"]["annotations"] == {"storageclass.kubernetes.io/is-default-class": "true"}
    assert classes["local-storage"]["volumeBindingMode"] == "WaitForFirstConsumer"
    assert "nfs-csi (default)" in ok(fake_kube.kubectl("get", "sc"))

    fake_kube.server.add(storage_class("fast", "rbd.csi.ceph.com", parameters={"pool": "ssd"}))
    fake_kube.server.remove("storageclass", "cephfs")
    names = [c["metadata"]["name"] for c in get_json(fake_kube, "storageclass")["items"]]
    assert names == ["ceph-rbd", "fast", "local-storage", "nfs-csi"]
    assert get_json(fake_kube, "sc", "fast")["parameters"] == {"pool": "ssd"}


def test_network_policies(fake_kube: FakeCluster) -> None:
    policy: dict[str, Any] = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": {"name": "ml-dev-env-rendezvous", "labels": {"app.kubernetes.io/instance": INSTANCE}},
              "spec": {"podSelector": {"matchLabels": {"app": "ml-dev-env-multi"}}, "policyTypes": ["Ingress"],
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "ml-dev-env-multi"}}}]}]}}
    assert "serverside-applied" in apply(fake_kube, yaml.safe_dump(policy))
    stored = get_json(fake_kube, "networkpolicy", "ml-dev-env-rendezvous")
    assert stored["spec"]["ingress"] == policy["spec"]["ingress"]
    apply(fake_kube, yaml.safe_dump(policy))
    assert get_json(fake_kube, "netpol", "-l", SELECTOR)["items"][0]["metadata"]["resourceVersion"] == (
        stored["metadata"]["resourceVersion"])
    assert "app=ml-dev-env-multi" in ok(fake_kube.kubectl("get", "netpol"))
    assert "deleted" in ok(fake_kube.kubectl("delete", "netpol", "-l", SELECTOR))
    assert fake_kube.server.objects("networkpolicies") == []


def test_network_attachment_definitions(fake_kube: FakeCluster) -> None:
    fake_kube.server.add_namespace("kube-system")
    fake_kube.server.add(network_attachment_definition("kube-system", "roce", resource_name="rdma/rdma"))
    fake_kube.server.add(network_attachment_definition("ml", "sriov-a"))
    roce = get_json(fake_kube, "network-attachment-definitions", "roce", "-n", "kube-system")
    assert roce["metadata"]["annotations"] == {"k8s.v1.cni.cncf.io/resourceName": "rdma/rdma"}
    assert json.loads(roce["spec"]["config"])["type"] == "macvlan"
    assert [n["metadata"]["name"] for n in get_json(fake_kube, "net-attach-def")["items"]] == ["sriov-a"]
    everywhere = get_json(fake_kube, "net-attach-def", "-A")["items"]
    assert [(n["metadata"]["namespace"], n["metadata"]["name"]) for n in everywhere] == [
        ("kube-system", "roce"), ("ml", "sriov-a")]


def test_nodes_labels_resources_readiness_and_cordon(fake_kube_factory: Callable[..., FakeCluster]) -> None:
    cluster = fake_kube_factory(nodes=[NodeSpec("gpu-0", allocatable={"rdma/rdma": "1"}),
                                       NodeSpec("gpu-1", allocatable={"rdma/rdma": "1"}, ready=False),
                                       NodeSpec("cpu-0", gpus=0, labels={"role": "login"})])
    nodes = {n["metadata"]["name"]: n for n in get_json(cluster, "nodes")["items"]}
    labels = nodes["gpu-0"]["metadata"]["labels"]
    assert (labels["nvidia.com/gpu.present"], labels["nvidia.com/gpu.product"]) == ("true", "NVIDIA-H100-80GB-HBM3")
    assert "nvidia.com/gpu.present" not in nodes["cpu-0"]["metadata"]["labels"]
    assert nodes["gpu-0"]["status"]["allocatable"]["rdma/rdma"] == "1"
    assert condition(nodes["gpu-0"], "Ready")["status"] == "True"
    assert condition(nodes["gpu-1"], "Ready")["status"] == "Unknown"
    gpu_nodes = get_json(cluster, "nodes", "-l", "nvidia.com/gpu.present=true")["items"]
    assert [n["metadata"]["name"] for n in gpu_nodes] == ["gpu-0", "gpu-1"]

    apply(cluster, manifests(limits={"nvidia.com/gpu": 4, "rdma/rdma": 1}))
    waiting = get_json(cluster, "pod", "ml-dev-env-1")
    assert condition(waiting, "PodScheduled")["message"] == (
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 Insufficient rdma/rdma, 1 node(s) had "
        "untolerated taint {node.kubernetes.io/not-ready: }. preemption: 0/3 nodes are available: "
        "2 No preemption victims found for incoming pod, 1 Preemption is not helpful for scheduling.")
    cluster.server.set_node("gpu-1", ready=True)
    cluster.server.reconcile()
    assert get_json(cluster, "pod", "ml-dev-env-1")["spec"]["nodeName"] == "gpu-1"

    ok(cluster.kubectl("cordon", "gpu-0"))
    cluster.server.set_node("gpu-1", unschedulable=True)
    assert get_json(cluster, "node", "gpu-0")["spec"]["unschedulable"] is True
    assert node_states(cluster) == {"cpu-0": "Ready", "gpu-0": "Ready,SchedulingDisabled",
                                    "gpu-1": "Ready,SchedulingDisabled"}
    ok(cluster.kubectl("uncordon", "gpu-0"))
    cluster.server.set_node("gpu-0", ready=False)
    cluster.server.set_node("gpu-1", unschedulable=False)
    assert node_states(cluster) == {"cpu-0": "Ready", "gpu-0": "NotReady", "gpu-1": "Ready"}
    assert get_json(cluster, "node", "gpu-0")["spec"]["taints"] == [
        {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]


def test_drain_cordons_and_evicts_through_the_eviction_subresource(
        fake_kube_factory: Callable[..., FakeCluster]) -> None:
    cluster = fake_kube_factory(nodes=["gpu-0", "gpu-1", "gpu-2"])
    apply(cluster, manifests(replicas=2, node_names=["gpu-0", "gpu-1", "gpu-2"]))
    placed = {pod["metadata"]["name"]: pod["spec"]["nodeName"] for pod in get_json(cluster, "pods")["items"]}
    drained = placed["ml-dev-env-1"]
    before = get_json(cluster, "pod", "ml-dev-env-1")["metadata"]["uid"]

    out = ok(cluster.kubectl("drain", drained, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=60s"))
    assert f"node/{drained} cordoned" in out and "pod/ml-dev-env-1 evicted" in out, out
    assert f"node/{drained} drained" in out, out
    evictions = [r.status for r in cluster.server.requests.records(method="POST") if r.path.endswith("/eviction")]
    assert evictions == [201]
    assert get_json(cluster, "node", drained)["spec"]["unschedulable"] is True
    again = get_json(cluster, "pod", "ml-dev-env-1")  # the StatefulSet's new pod, kept off the cordoned node
    assert again["metadata"]["uid"] != before and again["spec"]["nodeName"] not in (drained, placed["ml-dev-env-0"])
    refused = cluster.kubectl("drain", "gpu-9", "--ignore-daemonsets")
    assert refused.returncode == 1 and 'nodes "gpu-9" not found' in refused.stderr, refused.stderr


def test_namespace_labels(fake_kube: FakeCluster) -> None:
    fake_kube.server.add_namespace("locked", {"pod-security.kubernetes.io/enforce": "restricted"})
    fake_kube.server.set_namespace_labels("ml", {"pod-security.kubernetes.io/enforce": "baseline"})
    ml = get_json(fake_kube, "namespace", "ml")["metadata"]["labels"]
    assert ml == {"kubernetes.io/metadata.name": "ml", "pod-security.kubernetes.io/enforce": "baseline"}
    restricted = get_json(fake_kube, "ns", "-l", "pod-security.kubernetes.io/enforce=restricted")["items"]
    assert [n["metadata"]["name"] for n in restricted] == ["locked"]
    fake_kube.server.set_namespace_labels("ml", {"pod-security.kubernetes.io/enforce": None})
    ok(fake_kube.kubectl("label", "namespace", "locked", "pod-security.kubernetes.io/enforce=privileged",
                         "--overwrite"))
    levels = {n["metadata"]["name"]: n["metadata"]["labels"].get("pod-security.kubernetes.io/enforce")
              for n in get_json(fake_kube, "namespaces")["items"]}
    assert levels == {"default": None, "locked": "privileged", "ml": None}


def test_access_reviews_and_denied_requests(fake_kube: FakeCluster) -> None:
    def can_i(*args: str) -> str:
        return str(fake_kube.kubectl("auth", "can-i", *args).stdout.strip())

    server, account = fake_kube.server, "system:serviceaccount:ml:ml-dev-env"
    assert can_i("create", "statefulsets.apps", "-n", "ml") == "yes"
    assert can_i("use", "securitycontextconstraints/mlenv-ipc-lock") == "yes"
    server.denied.add(Deny("create", "statefulsets.apps", "ml"))
    server.denied.add(Deny("use", "securitycontextconstraints/mlenv-ipc-lock", user=account))
    assert can_i("create", "statefulsets.apps", "-n", "ml") == "no"
    assert can_i("create", "statefulsets", "-n", "default") == "yes"
    assert can_i("use", "scc/mlenv-ipc-lock") == "yes"  # the developer still may; the ServiceAccount may not
    assert can_i("use", "scc/mlenv-ipc-lock", "--as", account) == "no"
    assert can_i("use", "scc/restricted-v2", "--as", account) == "yes"

    review: dict[str, Any] = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
              "spec": {"user": account, "resourceAttributes": {
                  "verb": "use", "group": "security.openshift.io", "resource": "securitycontextconstraints",
                  "name": "mlenv-ipc-lock", "namespace": "ml"}}}
    answer = json.loads(ok(fake_kube.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review))))
    assert (answer["kind"], answer["status"]) == ("SubjectAccessReview", {"allowed": False})
    review["spec"]["user"] = "someone-else"
    answer = json.loads(ok(fake_kube.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review))))
    assert answer["status"]["allowed"] is True

    sts = yaml.safe_load_all(manifests())
    result = fake_kube.kubectl("create", "-f", "-", input=yaml.safe_dump([*sts][-1]))
    assert result.returncode == 1
    assert ('Error from server (Forbidden): error when creating "STDIN": statefulsets.apps is forbidden: '
            'User "developer" cannot create resource "statefulsets" in API group "apps" in the namespace "ml"'
            ) in result.stderr
    server.denied.add(("list", "nodes"))  # a plain tuple works too
    assert ('User "developer" cannot list resource "nodes" in API group "" at the cluster scope'
            in fake_kube.kubectl("get", "nodes").stderr)


def test_openshift_groups_switch(fake_kube_factory: Callable[..., FakeCluster]) -> None:
    cluster = fake_kube_factory(openshift=False)
    result = cluster.kubectl("get", "securitycontextconstraints")
    assert result.returncode == 1
    assert 'the server doesn\'t have a resource type "securitycontextconstraints"' in result.stderr
    groups = [g["name"] for g in json.loads(ok(cluster.kubectl("get", "--raw", "/apis")))["groups"]]
    assert not [g for g in groups if g.endswith(".openshift.io")] and "storage.k8s.io" in groups
    assert "routes.route.openshift.io" not in ok(cluster.kubectl("api-resources", "-o", "name")).split()

    cluster.server.hidden_groups.clear()
    cluster.forget_discovery()
    assert "No resources found" in cluster.kubectl("get", "scc").stderr  # SCCs are seeded only on OpenShift
    scc = {c["metadata"]["name"] for c in get_json(fake_kube_factory(), "scc")["items"]}
    assert scc == {"anyuid", "privileged", "restricted-v2"}


def test_image_stream_tags(fake_kube: FakeCluster) -> None:
    for obj in image_stream("ml", "pytorch", {"2.5": IMAGE}):
        fake_kube.server.add(obj)
    tag = get_json(fake_kube, "imagestreamtag", "pytorch:2.5")
    assert tag["image"]["dockerImageReference"] == IMAGE
    stream = get_json(fake_kube, "is", "pytorch")
    assert stream["status"]["dockerImageRepository"].endswith("/ml/pytorch")


# --- the parts, without kubectl -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("a=b", {"a": "b"}, True),
        ("a==b,c", {"a": "b"}, False),
        ("a!=b", {}, True),
        ("a in (x, y),!z", {"a": "y"}, True),
        ("a notin (x,y)", {"a": "x"}, False),
        ("!a", {"a": ""}, False),
    ],
)
def test_label_selectors(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert labels_match(parse_label_selector(selector), labels) is expected


def test_field_selector() -> None:
    event = {"metadata": {"name": "e"}, "involvedObject": {"name": "pod-0", "kind": "Pod"}}
    assert parse_field_selector("involvedObject.name=pod-0,involvedObject.kind==Pod")(event)
    assert not parse_field_selector("involvedObject.name!=pod-0")(event)


def test_server_side_apply_drops_fields_the_manager_stopped_setting() -> None:
    first = server_side_apply(None, {"metadata": {"name": "x", "labels": {"a": "1", "b": "2"}}}, "mlenv")
    first["spec"] = {"volumeName": "set-by-a-controller"}
    second = server_side_apply(first, {"metadata": {"name": "x", "labels": {"a": "1"}}}, "mlenv")
    assert second["metadata"]["labels"] == {"a": "1"}
    assert second["spec"] == {"volumeName": "set-by-a-controller"}


def test_strategic_merge_merges_containers_by_name() -> None:
    spec = {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "1"}]}
    patched = strategic_merge_patch(spec, {"containers": [{"name": "b", "image": "2"}]})
    assert patched == {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "2"}]}


def test_missing_kubectl_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fixtures, "find_kubectl", lambda: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        fixtures.require_kubectl()
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception):
        fixtures.require_kubectl()


def test_scheduler_taints_tolerations_and_extended_resources() -> None:
    tainted = node(NodeSpec("n", ready=False, allocatable={"rdma/rdma": "2"}), "10.0.0.1")
    pod: dict[str, Any] = {"metadata": {"name": "p", "namespace": "ml"}, "spec": {"containers": [
        {"resources": {"limits": {"rdma/rdma": "2"}, "requests": {"cpu": "1"}}}]}}
    assert schedule(pod, [tainted], [])[0] is None
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]
    assert schedule(pod, [tainted], [])[0] is tainted
    assert schedule(pod, [tainted], [(pod, tainted)]) == (None, (
        "0/1 nodes are available: 1 Insufficient rdma/rdma. "
        "preemption: 0/1 nodes are available: 1 No preemption victims found for incoming pod."))


def test_deny_rules_match_like_kubectl_auth_can_i() -> None:
    request = Request("dev", "use", "security.openshift.io", "securitycontextconstraints", "ml", "ipc")
    assert request.matches(Deny("use", "securitycontextconstraints.security.openshift.io/ipc", "ml"))
    assert request.matches(Deny("*", "securitycontextconstraints"))
    assert not request.matches(Deny("use", "securitycontextconstraints/other"))
    assert not request.matches(Deny("use", "securitycontextconstraints", user="someone-else"))
