"""scheduling.move_faulty_pods in the rendered manifests and the mover's checks (docs/security.md): the training
container has no token, the deployment has a ServiceAccount of its own with the minimal Role, the mover container
alone mounts the token, runs mlenv's own code as another user without privileges, and carries out nothing but a
move; nothing from an annotation reaches a process environment but the variables a move hands, checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mlenv.backends.kubeapi.naming import kube_deployment
from mlenv.backends.kubernetes.render import MOVER_REQUESTS, MOVER_TOKEN, MOVER_UID, render
from mlenv.plan import plan
from mlenv.runtime.records import runlayout
from mlenv.runtime.supervise import podmover
from mlenv.runtime.supervise.kubemove import moved

from tests.unit.config.files import BARCELONA, loaded

MOVES = "scheduling:\n  move_faulty_pods: true\n"


def rendered(tmp_path: Path, text: str, openshift: bool) -> dict[str, list[dict[str, Any]]]:
    """The objects of ``text`` by kind."""
    objects = render(kube_deployment(plan(loaded(tmp_path / "c.yaml", text), "tcp"), openshift=openshift)).objects
    kinds: dict[str, list[dict[str, Any]]] = {}
    for obj in objects:
        kinds.setdefault(obj["kind"], []).append(obj)
    return kinds


@pytest.mark.parametrize("openshift", [True, False])
def test_only_the_mover_mounts_the_deployments_own_token(tmp_path: Path, openshift: bool) -> None:
    kinds = rendered(tmp_path, BARCELONA + MOVES, openshift)
    [sts] = kinds["StatefulSet"]
    app = sts["metadata"]["name"]
    pod = sts["spec"]["template"]["spec"]
    account = pod["serviceAccountName"]
    assert account == f"{app}-move-pods" and account != "default"  # the deployment's own, never a shared one
    assert account in [obj["metadata"]["name"] for obj in kinds["ServiceAccount"]]
    [binding] = kinds["RoleBinding"]
    namespace = sts["metadata"]["namespace"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]
    [role] = kinds["Role"]
    assert [(r["resources"], r["verbs"], r["resourceNames"]) for r in role["rules"]] == [
        (["pods"], ["get"], [f"{app}-{n}" for n in range(sts["spec"]["replicas"])]),
        (["statefulsets"], ["get", "patch"], [app])]
    assert pod["automountServiceAccountToken"] is False and pod["shareProcessNamespace"] is False
    training, mover = pod["containers"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    tokens = {name for name, volume in volumes.items()
              if any("serviceAccountToken" in source for source in (volume.get("projected") or {}).get("sources", []))}
    assert tokens == {"mover-token"}
    assert not tokens & {mount["name"] for mount in training["volumeMounts"]}
    assert {(m["name"], m["mountPath"], m.get("readOnly", False)) for m in mover["volumeMounts"]} == {
        ("mover", MOVER_REQUESTS, False), ("mover-token", MOVER_TOKEN, True)}
    assert ("mover", MOVER_REQUESTS) in {(m["name"], m["mountPath"]) for m in training["volumeMounts"]}
    assert {item["name"]: item.get("value") for item in training["env"]}[runlayout.MOVE_DIR] == MOVER_REQUESTS
    assert mover["command"][:2] == ["python3", "-c"] and mover["command"][2] == Path(podmover.__file__).read_text()
    assert mover["command"][3:] == [MOVER_REQUESTS, app, MOVER_TOKEN] and not {"env", "ports"} & set(mover)
    context = mover["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"]} and context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True and context["runAsNonRoot"] is True
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context.get("runAsUser") == (None if openshift else MOVER_UID)  # OpenShift assigns it from its range
    template = sts["spec"]["template"]["metadata"]["annotations"]
    assert template["kubectl.kubernetes.io/default-container"] == training["name"]


def test_the_mover_never_runs_as_the_pods_user(tmp_path: Path) -> None:
    text = BARCELONA.replace("security:\n", f"security:\n  run_as_user: {MOVER_UID}\n") + MOVES
    [sts] = rendered(tmp_path, text, openshift=False)["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == MOVER_UID
    assert pod["containers"][1]["securityContext"]["runAsUser"] == MOVER_UID + 1


def test_without_moves_no_pod_gets_a_token_and_the_shared_account_has_no_rights(tmp_path: Path) -> None:
    kinds = rendered(tmp_path, BARCELONA, openshift=True)
    [sts] = kinds["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and len(pod["containers"]) == 1
    assert not kinds.get("Role") and not kinds.get("RoleBinding")
    assert all(obj["automountServiceAccountToken"] is False for obj in kinds["ServiceAccount"])


def request(**changed: Any) -> dict[str, Any]:
    return {"id": "a1", "run": "20260101-000000", "attempt": 0, "env": {"MLENV_FAILED_FIRST": "node-1",
            "MLENV_LAST_ERROR": "NCCL network error"}, "nodes": [{"node": 1, "reason": "nccl-net", "saved": True}],
            **changed}


def test_the_mover_carries_out_a_verdict() -> None:
    assert podmover.parse_request(json.dumps(request())) == podmover.MoveRequest(
        "a1", "20260101-000000", 0, (podmover.RequestedNode(1, "nccl-net", True),),
        {"MLENV_FAILED_FIRST": "node-1", "MLENV_LAST_ERROR": "NCCL network error"})


@pytest.mark.parametrize("bad", [
    {"patch": {"spec": {"template": {"spec": {"serviceAccountName": "admin"}}}}},  # another field: refused
    {"env": {"LD_PRELOAD": "/workspace/evil.so"}},
    {"env": {"MLENV_LAST_ERROR": "two\nlines"}},
    {"env": {"MLENV_FAILED_FIRST": "a b"}},
    {"nodes": [{"node": -1, "reason": "x", "saved": True}]},
    {"nodes": [{"node": 1, "reason": "x", "saved": True, "host": "other-node"}]},  # it finds the host itself
    {"nodes": []},
    {"run": "../../x"},
    {"attempt": True},
])
def test_the_mover_refuses_anything_else(bad: dict[str, Any]) -> None:
    with pytest.raises(podmover.MoveRefused):
        podmover.parse_request(json.dumps(request(**bad)))
    said = podmover.answer(json.dumps(request(**bad)), "app", Path("/nonexistent"))
    assert said.id is None and said.away is None and str(said.error).startswith("refused: ")
    assert list(said.to_json()) == ["id", "error"]


def test_the_movers_names_are_the_runtimes() -> None:
    assert (podmover.LEFT_OUT_ANNOTATION, podmover.LEFT_OUT_UNRECORDED) == (
        runlayout.LEFT_OUT_ANNOTATION, runlayout.LEFT_OUT_UNRECORDED)


@pytest.mark.parametrize(("env", "handed"), [
    ({"MLENV_FAILED_FIRST": "node-1", "MLENV_LAST_ERROR": "it failed"},
     {"MLENV_FAILED_FIRST": "node-1", "MLENV_LAST_ERROR": "it failed"}),
    ({"MLENV_FAILED_FIRST": "node-1", "LD_PRELOAD": "/workspace/evil.so"}, {}),
    ({"PYTHONPATH": "/tmp"}, {}),
    ({"MLENV_LAST_ERROR": "x\n"}, {}),
    ({"MLENV_LAST_ERROR": 7}, {}),
    ("LD_PRELOAD=x", {}),
])
def test_an_annotation_hands_only_mlenvs_variables(env: object, handed: dict[str, str]) -> None:
    record = {"run": "r", "attempt": 0, "env": env, "nodes": []}
    assert moved({runlayout.LEFT_OUT: json.dumps(record)}, "r", 0) == handed
