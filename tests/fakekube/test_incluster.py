"""fakekube serves its API to its pods as a real cluster does: a pod finds it at ``KUBERNETES_SERVICE_HOST:PORT``
(inside its own network namespace), authenticates with its ServiceAccount token over TLS verified by ``ca.crt``,
and is authorized by RBAC (Roles and RoleBindings); a deleted pod's token stops working."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.fakekube.access import Request, rule_allows
from tests.fakekube.fixtures import FakeCluster
from tests.fakekube.incluster import CA, MOUNT_PATH, automount
from tests.fakekube.test_kubelet import running, until

AWAY = {"nodeSelectorTerms": [{"matchExpressions": [
    {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-1"]}]}]}
PATCH = json.dumps({"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
    "requiredDuringSchedulingIgnoredDuringExecution": AWAY}}}}}})
"""What node 0 sends to move its StatefulSet's pods off node-1 (a merge patch)."""
CALLER = f"""
import os, ssl, sys, time, urllib.error, urllib.request
D = "{MOUNT_PATH}"
token, ns = open(D + "/token").read(), open(D + "/namespace").read()
context = ssl.create_default_context(cafile=D + "/ca.crt")
base = "https://" + os.environ["KUBERNETES_SERVICE_HOST"] + ":" + os.environ["KUBERNETES_SERVICE_PORT"]
affinity = {PATCH!r}.encode()

def call(method, path, body=None):
    request = urllib.request.Request(base + path, data=body, method=method, headers={{
        "Authorization": "Bearer " + token, "Content-Type": "application/merge-patch+json"}})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        return error.code

last = None
while True:
    seen = (call("GET", f"/api/v1/namespaces/{{ns}}/pods/" + os.environ["HOSTNAME"]),
            call("GET", f"/api/v1/namespaces/{{ns}}/pods/other"),
            call("PATCH", f"/apis/apps/v1/namespaces/{{ns}}/statefulsets/train", affinity))
    if seen != last:
        print(*seen, flush=True)
        last = seen
    time.sleep(0.05)
"""


def caller_pod(name: str, account: str, script: str, automount: bool | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"serviceAccountName": account, "containers": [
        {"name": "main", "image": "python", "command": ["python3", "-c", script]}]}
    if automount is not None:
        spec["automountServiceAccountToken"] = automount
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def apply(cluster: FakeCluster, *objects: dict[str, Any]) -> None:
    result = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    assert result.returncode == 0, result.stderr


def log(cluster: FakeCluster, pod: str) -> str:
    return str(cluster.kubectl("logs", pod).stdout)


ACCOUNT = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "trainer"}}
STATEFULSET = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "train"}, "spec": {
    "replicas": 0, "serviceName": "train", "selector": {"matchLabels": {"app": "train"}},
    "template": {"metadata": {"labels": {"app": "train"}},
                 "spec": {"containers": [{"name": "main", "image": "python", "command": ["true"]}]}}}}
ROLE = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "move-self"}, "rules": [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["p"]},
    {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["get", "patch"], "resourceNames": ["train"]}]}
BINDING = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "move-self"},
           "subjects": [{"kind": "ServiceAccount", "name": "trainer", "namespace": "ml"}],
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "move-self"}}


@pytest.fixture
def cluster(fake_kube_factory: Callable[..., FakeCluster]) -> FakeCluster:
    return fake_kube_factory(run_pods=True)


def test_a_pod_reaches_the_api_with_its_token_and_rbac_decides(cluster: FakeCluster) -> None:
    apply(cluster, ACCOUNT, STATEFULSET, caller_pod("p", "trainer", CALLER))
    env = {e["name"]: e.get("value") for e in running(cluster, "p")["spec"]["containers"][0].get("env") or []}
    assert "KUBERNETES_SERVICE_HOST" not in env  # the kubelet's, not the pod spec's
    until(lambda: "403 403 403" in log(cluster, "p"), "every call refused without a Role")
    apply(cluster, ROLE, BINDING)
    until(lambda: "200 403 200" in log(cluster, "p"), "its own pod and the StatefulSet's patch allowed")
    template = cluster.server.objects("statefulsets", "ml")[0]["spec"]["template"]["spec"]
    assert template["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == AWAY
    patches = cluster.server.requests.count(verb="patch", resource="statefulsets", status=200)
    assert patches >= 1
    shown = cluster.kubectl("exec", "p", "--", "sh", "-c",
                            f"echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT:$KUBERNETES_SERVICE_PORT_HTTPS; "
                            f"cat {MOUNT_PATH}/namespace; echo; id -u; touch {MOUNT_PATH}/x 2>&1 || echo read-only")
    lines = shown.stdout.splitlines()
    assert cluster.server.kubelet is not None
    port = cluster.server.port
    assert lines[0] == ("10.96.0.1:443:443" if cluster.server.kubelet.network else f"127.0.0.1:{port}:{port}")
    assert lines[1] == "ml"
    assert lines[2] != "0"  # OpenShift's SCC: the token is readable by the namespace's non-root user
    assert lines[-1] == "read-only"


def test_without_automount_there_is_no_token_but_the_address(cluster: FakeCluster) -> None:
    script = (f"import os; print(os.path.exists('{MOUNT_PATH}'), os.environ['KUBERNETES_SERVICE_PORT'], flush=True);"
              " import time; time.sleep(3600)")
    apply(cluster, {**ACCOUNT, "automountServiceAccountToken": True}, caller_pod("quiet", "trainer", script, False))
    running(cluster, "quiet")
    assert until(lambda: log(cluster, "quiet"), "the pod's line").split()[0] == "False"


def test_the_token_of_a_deleted_pod_is_refused(fake_kube_factory: Callable[..., FakeCluster]) -> None:
    cluster = fake_kube_factory(run_pods=True, pod_network=False)
    apply(cluster, caller_pod("p", "default", CALLER))
    until(lambda: "403 403 403" in log(cluster, "p"), "the pod's calls on this machine's network")
    token = str(cluster.kubectl("exec", "p", "--", "cat", f"{MOUNT_PATH}/token").stdout)
    assert token.startswith("fakekube-sa-")
    status = get(cluster.server.url, token, "/api/v1/namespaces/ml/pods/p")
    assert status == (403, 'pods "p" is forbidden: User "system:serviceaccount:ml:default" cannot get resource '
                           '"pods" in API group "" in the namespace "ml"')
    listed = get(cluster.server.url, token, "/api/v1/namespaces/ml/pods?fieldSelector=metadata.name%3Dp")
    assert listed == (403, 'pods "p" is forbidden: User "system:serviceaccount:ml:default" cannot list resource '
                           '"pods" in API group "" in the namespace "ml"')  # a list of one object names it
    assert cluster.kubectl("delete", "pod", "p", "--grace-period=1").returncode == 0
    assert get(cluster.server.url, token, "/api/v1/namespaces/ml/pods/p") == (401, "Unauthorized")
    assert get(cluster.server.url, None, "/api/v1/namespaces/ml/pods/p") == (401, "Unauthorized")


def get(url: str, token: str | None, path: str) -> tuple[int, str]:
    """GET ``path`` with ``token`` (None: no Authorization), verifying the server by the CA: (status, the Status's
    message)."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(url + path, headers=headers)  # noqa: S310 - https
    context = ssl.create_default_context(cafile=CA)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:  # noqa: S310 - the fake's https
            return answer.status, ""
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())["message"]


@pytest.mark.parametrize(("rule", "request_", "allowed"), [
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"]},
     Request("u", "get", "", "pods", "ml", "a"), True),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"]},
     Request("u", "get", "", "pods", "ml", "b"), False),
    ({"verbs": ["create", "list"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"]},
     Request("u", "create", "", "pods", "ml"), False),  # resourceNames cannot restrict what names nothing
    ({"verbs": ["list"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"]},
     Request("u", "list", "", "pods", "ml"), False),
    ({"verbs": ["watch"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["a"]},
     Request("u", "watch", "", "pods", "ml", "a"), True),  # a watch with the field selector metadata.name=a
    ({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}, Request("u", "patch", "apps", "statefulsets"), True),
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]},
     Request("u", "get", "", "pods", "ml", "a", "log"), False),  # a subresource needs its own rule
    ({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]},
     Request("u", "get", "", "pods", "ml", "a", "log"), True),
    ({"verbs": ["update"], "apiGroups": ["apps"], "resources": ["*/scale"]},
     Request("u", "update", "apps", "statefulsets", "ml", "s", "scale"), True),
    ({"verbs": ["patch"], "apiGroups": [""], "resources": ["statefulsets"]},
     Request("u", "patch", "apps", "statefulsets", "ml", "s"), False),  # another API group
])
def test_rbac_rules_match_as_rbac_does(rule: dict[str, Any], request_: Request, allowed: bool) -> None:
    assert rule_allows(rule, request_) is allowed


@pytest.mark.parametrize(("pod_field", "account_field", "mounted"), [
    (None, None, True), (None, False, False), (True, False, True), (False, True, False)])
def test_the_pods_automount_field_wins_over_its_accounts(pod_field: bool | None, account_field: bool | None,
                                                         mounted: bool) -> None:
    account = None if account_field is None else {"automountServiceAccountToken": account_field}
    assert automount(caller_pod("p", "a", "", pod_field), account) is mounted



SIDE_TOKEN = "/var/run/secrets/side"  # noqa: S105 - a directory
PROJECTED = {"name": "side-token", "projected": {"defaultMode": 0o444, "sources": [
    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
    {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
    {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}}
"""What Kubernetes itself mounts for automount (``kube-api-access-*``), as a volume of its own."""


def test_a_projected_token_is_only_in_the_container_that_mounts_it(
        fake_kube_factory: Callable[..., FakeCluster]) -> None:
    """automountServiceAccountToken false and a projected token mounted in the sidecar only: the first container has
    no token and cannot see the sidecar's processes; the sidecar runs as its own user (plain Kubernetes: OpenShift's
    SCC refuses a user outside the namespace's range) with its ServiceAccount's token, for RBAC."""
    cluster = fake_kube_factory(run_pods=True, openshift=False)
    main = "import time; time.sleep(3600)"
    pod = caller_pod("p", "trainer", main, automount=False)
    pod["spec"]["volumes"] = [PROJECTED]
    pod["spec"]["containers"].append({"name": "side", "image": "python",
                                      "command": ["python3", "-c", CALLER.replace(MOUNT_PATH, SIDE_TOKEN)],
                                      "securityContext": {"runAsUser": 65532, "runAsNonRoot": True},
                                      "volumeMounts": [{"name": "side-token", "mountPath": SIDE_TOKEN,
                                                        "readOnly": True}]})
    apply(cluster, ACCOUNT, STATEFULSET, ROLE, BINDING, pod)
    running(cluster, "p")
    until(lambda: "200 403 200" in str(cluster.kubectl("logs", "p", "-c", "side").stdout),
          "the sidecar's own pod and the StatefulSet's patch allowed")
    root_ca = json.loads(cluster.kubectl("get", "configmap", "kube-root-ca.crt", "-o", "json").stdout)
    assert root_ca["data"]["ca.crt"] == CA.read_text()  # the root CA publisher's, in every namespace
    assert cluster.server.kubelet is not None
    kubelet = cluster.server.kubelet.root  # every pod's volumes, the sidecar's token among them: hidden in a pod
    looked = cluster.kubectl("exec", "p", "-c", "main", "--", "sh", "-c", f"ls {MOUNT_PATH} {SIDE_TOKEN} 2>&1; "
                             f"ls -A {kubelet} | wc -l; "
                             "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done")
    assert looked.stdout.count("No such file") == 2 and "time.sleep(3600)" in looked.stdout, looked.stdout
    assert any(kubelet.iterdir()) and looked.stdout.splitlines()[2] == "0", looked.stdout
    assert "urlopen" not in looked.stdout  # the sidecar's command: not a process main can see
    side = cluster.kubectl("exec", "p", "-c", "side", "--", "sh", "-c", f"id -u; ls {SIDE_TOKEN}; cat /proc/1/cmdline")
    lines = side.stdout.splitlines()
    assert lines[:4] == ["65532", "ca.crt", "namespace", "token"] and "urlopen" in "".join(lines[4:]), side.stdout
