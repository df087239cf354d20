"""A node judged faulty is left out on Kubernetes, end to end against pods that really run (fakekube
``--run-pods`` on nodes node-0..node-3, the real kubectl and ``mlenv``): a rank on one Kubernetes node prints one of
NCCL's network failures (a node-fault sign) and fails; the restart policy excludes that node, ``launch`` keeps the
StatefulSet's pods off it (a required node affinity: the pods move), and the run completes on its next attempt.
``mlenv nodes`` names the Kubernetes node; ``--forget-excluded`` lets the pods back on the next launch. A detached run
with ``scheduling.move_faulty_pods`` moves its pods itself, through the in-cluster API and the Role deploy made."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import pytest
from mlenv import state

from tests.helpers import assert_shaped, documented_shape
from tests.integration.kube_pods import (  # noqa: F401 - kube_project is a fixture
    APP,
    NAMESPACE,
    KubeProject,
    kube_project,
    pod_processes,
)

NET_ERROR = ("n1:88:102 [0] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from peer 10.0.0.1<33092> "
             "with error 12, opcode 0, len 0, vendor err 129 (Recv)")
"""NCCL's own words for a failed InfiniBand completion (src/transport/net_ib.cc): the ``nccl-net`` sign."""
FAILS_ON_BAD = f"""\
import os, sys
machine = os.environ["MLENV_MACHINE"]
if machine == open("bad").read().strip() and os.environ["LOCAL_RANK"] == "0":
    print({NET_ERROR!r}, flush=True)
    sys.exit(1)
print(f"rank {{os.environ['RANK']}} ok on {{machine}} in attempt {{os.environ['MLENV_RESTART_COUNT']}}", flush=True)
"""


HOSTILE = f"""\
import json, os, ssl, time, urllib.error, urllib.request
found = {{"automounted": os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount"),
         "token_files": [os.path.join(d, f) for top in ("/var/run/secrets", "/run/secrets") for d, _, fs in os.walk(top)
                         for f in fs]}}
url = ("https://" + os.environ["KUBERNETES_SERVICE_HOST"] + ":" + os.environ["KUBERNETES_SERVICE_PORT"]
       + "/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/{APP}")
takeover = {{"spec": {{"template": {{"spec": {{"serviceAccountName": "default", "containers": [
    {{"name": "ml-dev", "securityContext": {{"privileged": True, "runAsUser": 0}}}}]}}}}}}}}
try:  # no token to send: anonymous
    urllib.request.urlopen(urllib.request.Request(url, data=json.dumps(takeover).encode(), method="PATCH", headers={{
        "Content-Type": "application/merge-patch+json"}}), context=ssl._create_unverified_context(), timeout=10)
    found["patched"] = 200
except urllib.error.HTTPError as error:
    found["patched"] = error.code
moves = os.environ["MLENV_MOVE_DIR"]
def ask(request):
    if os.path.exists(moves + "/answer.json"):
        os.unlink(moves + "/answer.json")
    with open(moves + "/.forged", "w") as out:
        json.dump(request, out)
    os.replace(moves + "/.forged", moves + "/request.json")
    while not os.path.exists(moves + "/answer.json"):
        time.sleep(0.1)
    return json.load(open(moves + "/answer.json"))["error"].split(":")[0]
verdict = {{"id": "x", "run": "r", "attempt": 0, "env": {{}}, "nodes": [{{"node": 0, "reason": "x", "saved": False}}]}}
found["forged"] = [ask({{**verdict, "patch": takeover}}),
                   ask({{**verdict, "env": {{"LD_PRELOAD": "/workspace/x.so"}}}})]
print(json.dumps(found))
"""
"""What a package imported by the user's code in pod 0's training container tries (docs/security.md): find a
token, patch the StatefulSet without one, have the mover patch what a move does not."""


def _pod_code_cannot_change_the_statefulset(project: KubeProject) -> None:
    """HOSTILE finds no token, its patch is refused (401: no identity at all), the mover refuses its forged
    requests, and the StatefulSet is unchanged. The one binding to a Role that may patch names the deployment's own
    ServiceAccount alone (not the namespace's default, nor another deployment's), and the mover's token is in no
    pod process's argv or environment."""
    version = "jsonpath={.metadata.resourceVersion}"
    before = project.kubectl("get", "statefulset", APP, "-o", version).stdout
    probed = project.kubectl("exec", f"{APP}-0", "-c", "ml-dev", "--", "python3", "-c", HOSTILE, timeout=120)
    assert json.loads(probed.stdout) == {"automounted": False, "token_files": [], "patched": 401,
                                         "forged": ["refused", "refused"]}, probed.stdout + probed.stderr
    assert project.kubectl("get", "statefulset", APP, "-o", version).stdout == before
    roles, bindings = (json.loads(project.kubectl("get", kind, "-o", "json").stdout)["items"]
                       for kind in ("roles", "rolebindings"))
    rules = {role["metadata"]["name"]: role["rules"] for role in roles}
    writers = [binding["subjects"] for binding in bindings
               if any("patch" in rule["verbs"] for rule in rules[binding["roleRef"]["name"]])]
    assert writers == [[{"kind": "ServiceAccount", "name": f"{APP}-move-pods", "namespace": NAMESPACE}]], writers
    token = project.kubectl("exec", f"{APP}-0", "-c", "mover", "--", "cat", "/var/run/secrets/mlenv-mover/token")
    assert token.returncode == 0 and token.stdout.strip(), token.stderr
    for pid in pod_processes(project.pods_root):
        for shown in ("cmdline", "environ"):
            with contextlib.suppress(OSError):  # a process that ended meanwhile
                assert token.stdout.strip().encode() not in (Path("/proc") / str(pid) / shown).read_bytes()


def kept_off(project: KubeProject) -> list[str]:
    """The nodes the StatefulSet keeps its pods off now."""
    sts = json.loads(project.kubectl("get", "statefulset", APP, "-o", "json").stdout)
    terms = (sts["spec"]["template"]["spec"]["affinity"].get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", {}).get("nodeSelectorTerms", [{}])
    return [value for e in terms[0].get("matchExpressions", []) if e["operator"] == "NotIn" for value in e["values"]]


def objects(project: KubeProject) -> str:
    """``Kind/name@resourceVersion`` of the deployment's kinds of objects in the namespace."""
    return project.kubectl("get", "pvc,service,serviceaccount,statefulset,pod", "-o", "jsonpath={range .items[*]}"
                           "{.kind}/{.metadata.name}@{.metadata.resourceVersion} {end}").stdout


def machines(project: KubeProject) -> list[str]:
    return [pod["host"] for pod in json.loads(project.ok("status", "--json").stdout)["pods"]]


def _moving(project: KubeProject) -> tuple[str, Path]:
    """:func:`_deployed_failing` with scheduling.move_faulty_pods."""
    project.cluster_file.write_text(project.cluster_file.read_text() + "scheduling:\n  move_faulty_pods: true\n")
    return _deployed_failing(project)


def _deployed_failing(project: KubeProject) -> tuple[str, Path]:
    """Deploy and sync FAILS_ON_BAD, failing on node 1's machine; that machine and the synced directory."""
    project.ok("deploy", str(project.cluster_file))
    bad = machines(project)[1]
    source = project.home / "workspace"
    source.mkdir()
    (source / "job.py").write_text(FAILS_ON_BAD)
    (source / "bad").write_text(bad)
    project.ok("sync", "--source", str(source))
    return bad, source


def _detached_until(project: KubeProject, ended: tuple[int, str]) -> tuple[str, str]:
    """Launch FAILS_ON_BAD detached with one restart and look (status) until its latest attempt is ``ended``
    (attempt, state); the run's id and what status said on stderr meanwhile."""
    launched = project.ok("launch", "--launcher", "torchrun", "--detach", "--max-restarts", "1", "--json", "job.py")
    run_id = json.loads(launched.stdout)["run_id"]
    deadline = time.monotonic() + 300
    run: dict[str, object] = {}
    said = ""
    while (run.get("attempt"), run.get("state")) != ended:
        assert time.monotonic() < deadline, (run, said)
        time.sleep(1)
        looked = project.ok("status", "--json")
        said += looked.stderr
        run = json.loads(looked.stdout)["latest_run"] or {}
    return run_id, said


def test_a_faulty_kubernetes_node_is_left_out_and_forgotten(kube_project: KubeProject) -> None:  # noqa: F811
    project = kube_project
    bad, source = _deployed_failing(project)
    launched = project.mlenv("launch", "--launcher", "torchrun", "--max-restarts", "1", "job.py", timeout=300)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    assert f"excluding {bad} (node-1) from the next attempts: NCCL network error" in launched.stderr, launched.stderr
    assert f"keeping the pods off {bad}" in launched.stderr
    finished = [line for line in launched.stdout.splitlines() if "in attempt 1" in line]
    assert len(finished) == 4 and not any(f"ok on {bad} " in line for line in finished), launched.stdout
    assert bad not in machines(project) and kept_off(project) == [bad]
    nodes = project.ok("nodes")
    assert bad in nodes.stdout and "NCCL network error" in nodes.stdout, nodes.stdout
    listed = json.loads(project.ok("nodes", "--json").stdout)  # where each pod runs now, and what is left out
    assert [node["host"] for node in listed["nodes"]] == machines(project) and bad not in machines(project)
    assert [entry["host"] for entry in listed["excluded"]] == [bad]

    dry = project.ok("launch", "--launcher", "torchrun", "--dry-run", "job.py")  # what launch would do first
    assert f"# first: the pods of {APP} are kept off {bad} (required node affinity" in dry.stdout, dry.stdout

    project.ok("nodes", "--forget-excluded")
    (source / "bad").write_text("none")  # the node was mended
    project.ok("sync", "--source", str(source))
    again = project.ok("launch", "--launcher", "torchrun", "job.py", timeout=300)
    assert f"letting the pods back on {bad}" in again.stderr, again.stderr
    assert kept_off(project) == []


def test_forgetting_after_the_statefulset_was_deleted_by_hand_touches_nothing_else(
    kube_project: KubeProject, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    project = kube_project
    project.ok("deploy", str(project.cluster_file))
    placed = machines(project)
    listed = json.loads(project.ok("nodes", "--json").stdout)
    assert_shaped(listed, documented_shape("nodes"))
    assert listed["nodes"] == [{"node": n, "pod": f"{APP}-{n}", "host": placed[n], "ready": True} for n in (0, 1)]
    assert all(machine in project.ok("nodes").stdout for machine in placed)
    monkeypatch.setenv("MLENV_HOME", str(project.home))
    state.exclude(project.cluster_file.stem, {1: (placed[1], "NCCL network error: NET/IB : Got completion")})
    assert project.kubectl("delete", "statefulset", APP, "--wait=true").returncode == 0  # by hand
    deadline = time.monotonic() + 60
    while "Pod/" in (left := objects(project)):  # the StatefulSet's pods go with it
        assert time.monotonic() < deadline, left
        time.sleep(0.2)

    forgot = project.ok("nodes", "--forget-excluded")
    assert "none of its nodes is on the cluster (deleted by hand?): nothing there to keep off or let back" in \
        forgot.stderr, forgot.stderr
    assert "1 excluded node forgotten (node-1)" in forgot.stderr
    assert objects(project) == left  # nothing else touched: no object made again, none changed
    assert json.loads(project.ok("nodes", "--json").stdout)["excluded"] == []
    launched = project.mlenv("launch", "--launcher", "torchrun", "job.py")
    assert launched.returncode == 1 and "Traceback" not in launched.stderr, launched.stderr
    assert f"the StatefulSet {APP} of {project.cluster_file.stem} is not in " in launched.stderr, launched.stderr


def test_a_detached_run_moves_its_pods_off_a_faulty_node_by_itself(kube_project: KubeProject) -> None:  # noqa: F811
    """``scheduling.move_faulty_pods``: no terminal waits. Code in the training container cannot change the
    StatefulSet (:func:`_pod_code_cannot_change_the_statefulset`); node 0's supervisor, through the pod's mover with
    its ServiceAccount token and the Role deploy made, keeps the StatefulSet's pods off the faulty Kubernetes node;
    the StatefulSet makes every pod again, each pod's PID 1 resumes its share as attempt 1, and the run completes
    there. mlenv records the node when it next looks (status), and a later launch keeps it out."""
    project = kube_project
    bad, source = _moving(project)
    _pod_code_cannot_change_the_statefulset(project)
    run_id, said = _detached_until(project, (1, "succeeded"))
    assert f"run {run_id} left {bad} (node-1) out and moved its pod: NCCL network error" in said, said
    assert kept_off(project) == [bad] and bad not in machines(project)
    shown = project.ok("logs", run_id).stdout
    finished = [line for line in shown.splitlines() if "in attempt 1" in line]
    assert len(finished) == 4 and not any(f"ok on {bad} " in line for line in finished), shown
    listed = json.loads(project.ok("nodes", "--json").stdout)
    assert [(entry["node"], entry["host"]) for entry in listed["excluded"]] == [(1, bad)], listed
    assert "NCCL network error" in listed["excluded"][0]["reason"]
    sts = json.loads(project.kubectl("get", "statefulset", APP, "-o", "json").stdout)
    assert "mlenv.io/left-out-unrecorded" not in sts["metadata"].get("annotations", {})  # recorded once

    (source / "bad").write_text("none")
    project.ok("sync", "--source", str(source))
    again = project.ok("launch", "--launcher", "torchrun", "job.py", timeout=300)  # keeps the node out
    assert "letting the pods back" not in again.stderr and kept_off(project) == [bad], again.stderr


def test_without_its_role_a_detached_run_says_the_pods_were_not_moved(kube_project: KubeProject) -> None:  # noqa: F811
    """The Role deleted by hand: node 0's call is refused (RBAC's 403), no pod is moved, no node restarts, and the
    run's output says why."""
    project = kube_project
    _moving(project)
    assert project.kubectl("delete", "role", f"{APP}-move-pods").returncode == 0
    run_id, _ = _detached_until(project, (0, "failed"))
    shown = project.ok("logs", run_id).stdout
    assert ("node-1 (NCCL network error: " in shown and "must be left out of the run: not restarting it: the pods "
            f"were not moved: GET /api/v1/namespaces/{NAMESPACE}/pods/{APP}-1: 403 ") in shown, shown
    assert kept_off(project) == [] and "in attempt 1" not in shown
