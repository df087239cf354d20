"""The fake API server, exercised by the real kubectl binary (and a few pure unit tests of its parts)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from . import fixtures
from .fixtures import FakeCluster
from .patches import server_side_apply, strategic_merge_patch
from .selectors import labels_match, parse_field_selector, parse_label_selector

INSTANCE = "demo"
SELECTOR = f"app.kubernetes.io/instance={INSTANCE}"
IMAGE = "quay.io/example/pytorch:2.5"


def manifests(replicas: int = 2, node_names: list[str] | None = None, capabilities: bool = False) -> str:
    """What a deploy tool applies: ServiceAccount, headless Service, shared PVC, StatefulSet with a VCT."""
    labels = {"app.kubernetes.io/instance": INSTANCE, "app.kubernetes.io/managed-by": "mlenv"}
    meta = {"labels": labels}
    container: dict[str, Any] = {"name": "pytorch", "image": IMAGE, "resources": {"limits": {"nvidia.com/gpu": 4}}}
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
                 "network-attachment-definitions.k8s.cni.cncf.io", "rolebindings.rbac.authorization.k8s.io"):
        assert name in resources.split()


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
    cluster = fake_kube_factory(ready_delay=0.3)
    apply(cluster, manifests())
    assert get_json(cluster, "pod", "ml-dev-env-0")["status"]["phase"] == "Pending"  # ContainerCreating
    ok(cluster.kubectl("wait", "--for=condition=Ready", "pod", "-l", SELECTOR, "--timeout=10s"))
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
