"""The OpenShift/Kubernetes backend through the real kubectl against fakekube.

Each test starts its own fake cluster (nodes gpu-0 and gpu-1, 8 GPUs each, namespace ``ml``), writes a cluster
file for it and runs the ``mlenv`` CLI in-process; ``.mlenv/state.json`` goes to the test's MLENV_HOME.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from mlenv.backends.kubeapi import explain, waiting
from mlenv.backends.kubeapi.pods import rdma_devices
from mlenv.backends.kubeapi.preflight import same_server
from mlenv.backends.kubernetes.backend import KubernetesBackend
from mlenv.core.capabilities import Handle, Node
from mlenv.core.clusters import load_plan
from mlenv.core.remote import script
from mlenv.errors import OperationError
from mlenv.state import RECORDS

from tests.fakekube.fixtures import FakeCluster, fake_kube_factory  # noqa: F401 - the fixture, re-exported
from tests.helpers import MLENV
from tests.helpers import invoke as mlenv

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "ml"
APP = "ml-dev-env"
SELECTOR = f"app.kubernetes.io/instance={APP}"
IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"


@pytest.fixture(autouse=True)
def fast_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Poll the fake API server often: its pods change state in fractions of a second."""
    monkeypatch.setattr(waiting, "POLL_SECONDS", 0.2)


@pytest.fixture
def fake(fake_kube_factory: Callable[..., FakeCluster], home: Path,  # noqa: F811 - pytest fixture injection
         monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    """A started fake cluster whose kubeconfig the CLI (and the kubectl it runs) uses."""
    cluster = fake_kube_factory(nodes=["gpu-0", "gpu-1"], namespaces=[NAMESPACE])
    cluster.use_in(monkeypatch)
    return cluster


def cluster_file(home: Path, fake: FakeCluster, *, name: str = "fake", backend: str = "kubernetes",
                 storage: str = "volumeClaimTemplates", api: str | None = None, namespace: str = NAMESPACE,
                 ipc_lock: bool = False) -> str:
    """Write a small valid cluster file for ``fake`` and return its path."""
    document = {
        "cluster": {"name": name, "api": api or f"127.0.0.1:{fake.server.port}", "namespace": namespace},
        "backend": backend,
        "nodes": {"gpu_nodes": ["gpu-0", "gpu-1"]},
        "storage": {"mode": storage, "class_rwo": "standard", "class_rwx": "nfs", "workspace_size": "1Gi",
                    "datasets_size": "1Gi"},
        "security": {"service_account": "ml-dev-sa", "ipc_lock": ipc_lock},
        "gpus": {"per_node": 4, "default_nodes": 2},
    }
    path = home / "clusters" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


def on_terminal(args: list[str], answer: str) -> tuple[int, str]:
    """Run the real `mlenv` on a pseudo-terminal of its own and type ``answer`` at its question."""
    import os
    import pty

    pid, terminal = pty.fork()
    if pid == 0:  # the child: its controlling terminal is the pty
        os.execv(str(MLENV), [str(MLENV), *args])  # noqa: S606 - the real mlenv, no shell
    seen, answered = b"", False
    while True:
        try:
            chunk = os.read(terminal, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
        if b"[y/N]" in seen and not answered:
            os.write(terminal, answer.encode() + b"\n")
            answered = True
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), seen.decode(errors="replace")


def names(fake: FakeCluster, resource: str) -> list[str]:
    """Names of the stored objects of ``resource`` in the test namespace."""
    return sorted(o["metadata"]["name"] for o in fake.server.objects(resource, NAMESPACE))


def test_deploy_status_redeploy_clean(fake: FakeCluster, home: Path) -> None:
    path = cluster_file(home, fake)
    deployed = mlenv("deploy", path)
    assert deployed.exit_code == 0, deployed.output
    assert "2/2 pods ready" in deployed.stderr
    applies = fake.server.requests.records(method="PATCH")
    assert applies and all(r.query.get("fieldManager") == "mlenv" and r.query.get("force") == "true"
                           for r in applies)
    recorded = json.loads((home / ".mlenv" / "state.json").read_text())
    assert recorded["current"] == "fake"
    assert recorded["deployments"]["fake"]["handle"]["data"]["namespace"] == NAMESPACE
    waits = [r for r in fake.server.requests.api_calls()
             if r.method == "GET" and r.resource in ("pods", "statefulsets", "events")]
    assert {r.verb for r in waits} == {"list"}  # one list call per kind per tick, never one GET per pod

    fake.server.requests.clear()
    status = mlenv("status", "--json")
    assert status.exit_code == 0, status.output
    pods = json.loads(status.stdout)["pods"]
    assert [(p["pod"], p["host"], p["ready"], p["gpus"], p["phase"]) for p in pods] == [
        (f"{APP}-0", "gpu-0", True, 4, "Running"), (f"{APP}-1", "gpu-1", True, 4, "Running")]
    calls = fake.server.requests.api_calls()
    assert [(r.verb, r.resource, r.query.get("labelSelector")) for r in calls] == [("list", "pods", SELECTOR)]

    network_status = [{"name": "ovn-kubernetes", "interface": "eth0", "default": True},
                      {"name": "ml/roce", "interface": "net1", "device-info": {"pci": {"rdma-device": "mlx5_6"}}}]
    annotated = fake.kubectl("annotate", "pod", f"{APP}-0", "-n", NAMESPACE,
                             f"k8s.v1.cni.cncf.io/network-status={json.dumps(network_status)}")
    assert annotated.returncode == 0, annotated.stderr
    table = mlenv("status")
    assert table.exit_code == 0, table.output
    assert "net1=mlx5_6" in table.stdout

    statefulset = fake.server.objects("statefulsets", NAMESPACE)[0]
    pod_uids = sorted(p["metadata"]["uid"] for p in fake.server.objects("pods", NAMESPACE))
    again = mlenv("deploy", path)
    assert again.exit_code == 0, again.output
    converged = fake.server.objects("statefulsets", NAMESPACE)[0]
    assert converged["metadata"]["generation"] == statefulset["metadata"]["generation"]
    assert sorted(p["metadata"]["uid"] for p in fake.server.objects("pods", NAMESPACE)) == pod_uids

    backend = KubernetesBackend("kubectl", RECORDS)
    handle = backend.prepare(load_plan(path)).handle
    pods_seen = backend.nodes(handle)
    assert [(p.ordinal, p.name, p.workspace, p.ready) for p in pods_seen] == [
        (0, f"{APP}-0", "/workspace", True), (1, f"{APP}-1", "/workspace", True)]

    cleaned = mlenv("clean", "--yes")
    assert cleaned.exit_code == 0, cleaned.output
    volumes = [f"{claim}-{APP}-{i}" for claim in ("ml-datasets", "ml-dev-workspace") for i in (0, 1)]
    assert names(fake, "persistentvolumeclaims") == volumes
    assert not any(names(fake, kind) for kind in ("pods", "statefulsets", "services", "serviceaccounts"))
    assert "kept 4 data volumes" in cleaned.stderr
    assert json.loads((home / ".mlenv" / "state.json").read_text())["deployments"] == {}
    with pytest.raises(OperationError, match="no running pods"):
        backend.nodes(handle)

    twice = mlenv("clean", "--cluster", path)
    assert twice.exit_code == 0, twice.output
    assert "nothing to clean" in twice.stderr

    piped = subprocess.run([str(MLENV), "clean", "--cluster", path, "--delete-data"], input="y\n", text=True,
                           capture_output=True, start_new_session=True, timeout=120, check=False)  # no terminal
    assert piped.returncode == 2, piped.stderr
    assert "asks for confirmation on a terminal" in piped.stderr and "--yes" in piped.stderr
    assert all(volume in piped.stderr for volume in volumes)
    assert names(fake, "persistentvolumeclaims") == volumes

    code, seen = on_terminal(["clean", "--cluster", path, "--delete-data"], "n")
    assert code == 1 and "Delete them? [y/N]" in seen and "nothing deleted" in seen, seen
    assert names(fake, "persistentvolumeclaims") == volumes

    wiped = mlenv("clean", "--cluster", path, "--delete-data", "--yes")
    assert wiped.exit_code == 0, wiped.output
    assert names(fake, "persistentvolumeclaims") == []


def test_shared_volumes_are_kept_then_deleted(fake: FakeCluster, home: Path) -> None:
    path = cluster_file(home, fake, storage="rwx")
    assert mlenv("deploy", path).exit_code == 0
    assert mlenv("clean", "--yes").exit_code == 0
    assert names(fake, "persistentvolumeclaims") == ["ml-datasets", "ml-dev-workspace"]
    assert mlenv("clean", "--cluster", path, "--delete-data", "--yes").exit_code == 0
    assert names(fake, "persistentvolumeclaims") == []


@pytest.mark.parametrize(("fault", "backend", "expected"), [
    ("unschedulable", "kubernetes",
     ["no node has 4 free nvidia.com/gpu", "0/2 nodes are available: 2 Insufficient nvidia.com/gpu"]),
    ("image_pull_backoff", "kubernetes", [f'cannot pull image "{IMAGE}"', "manifest unknown"]),
    ("forbid_capabilities", "openshift",
     ["forbids the IPC_LOCK capability", "--admin | oc apply -f -", "capability may not be added"]),
])
def test_fault_reasons_fail_fast(fake: FakeCluster, home: Path, monkeypatch: pytest.MonkeyPatch, fault: str,
                                 backend: str, expected: list[str]) -> None:
    for reason in explain.GRACE_SECONDS:
        monkeypatch.setitem(explain.GRACE_SECONDS, reason, 0.5)
    setattr(fake.server.faults, fault, True)
    path = cluster_file(home, fake, backend=backend, ipc_lock=fault == "forbid_capabilities")
    result = mlenv("deploy", path)
    assert result.exit_code == 1
    assert "cannot become ready (0/2 pods ready)" in result.stderr
    for words in expected:
        assert words in result.stderr
    assert "Traceback" not in result.output
    assert "no deployment recorded" in mlenv("status").stderr  # a failed first deploy is never made current
    status = mlenv("status", "--cluster", "fake", "--json")  # but recorded: status finds it by name
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout)["deploy"]["state"] == "failed"
    pods = json.loads(status.stdout)["pods"]
    if fault == "forbid_capabilities":  # the StatefulSet could not create any pod
        assert pods == []
    else:
        assert len(pods) == 2 and all(expected[0] in pod["detail"] for pod in pods)


def test_timeout_names_the_reason(fake: FakeCluster, home: Path) -> None:
    fake.server.faults.unschedulable = True
    result = mlenv("deploy", cluster_file(home, fake), "--timeout", "1")
    assert result.exit_code == 1
    assert "not ready after 1s" in result.stderr
    assert "0/2 nodes are available" in result.stderr


def test_not_logged_in(fake: FakeCluster, home: Path) -> None:
    path = cluster_file(home, fake)
    fake.kubeconfig.write_text(fake.kubeconfig.read_text().replace(fake.server.token, "expired-token"))
    for args in (["deploy", path], ["status", "--cluster", path]):
        result = mlenv(*args)
        assert result.exit_code == 1
        assert f"not logged in to 127.0.0.1:{fake.server.port}" in result.stderr
        assert f"get credentials for 127.0.0.1:{fake.server.port} into your kubeconfig" in result.stderr
    assert not (home / ".mlenv" / "state.json").exists()  # nothing reached the cluster: nothing recorded


def test_unreachable_server(fake: FakeCluster, home: Path) -> None:
    path = cluster_file(home, fake, api="127.0.0.1")
    fake.kubeconfig.write_text(fake.kubeconfig.read_text().replace(fake.server.url, "https://127.0.0.1:1"))
    result = mlenv("status", "--cluster", path)
    assert result.exit_code == 1
    assert "cannot reach the API server of fake" in result.stderr


def test_namespace_missing_or_forbidden(fake: FakeCluster, home: Path) -> None:
    missing = mlenv("deploy", cluster_file(home, fake, namespace="nope"))
    assert missing.exit_code == 1
    assert "namespace nope does not exist: kubectl create namespace nope" in missing.stderr
    fake.server.forbidden_namespaces.add(NAMESPACE)
    forbidden = mlenv("deploy", cluster_file(home, fake, backend="openshift"))
    assert forbidden.exit_code == 1
    assert f"namespace {NAMESPACE} does not exist or developer may not use it" in forbidden.stderr
    assert "kubectl create namespace ml" in forbidden.stderr  # the CLI in use is kubectl: its commands


def test_api_mismatch_names_the_context_to_use(fake: FakeCluster, home: Path) -> None:
    path = cluster_file(home, fake, api="api.other.example.com")
    result = mlenv("deploy", path)
    assert result.exit_code == 1
    assert (f"is for api.other.example.com but context fakekube points at https://127.0.0.1:{fake.server.port}: "
            "get credentials for api.other.example.com into your kubeconfig") in result.stderr
    config = yaml.safe_load(fake.kubeconfig.read_text())
    config["clusters"].append({"name": "other", "cluster": {"server": "https://api.other.example.com:6443"}})
    config["contexts"].append({"name": "other", "context": {"cluster": "other", "user": "developer"}})
    fake.kubeconfig.write_text(yaml.safe_dump(config))
    result = mlenv("clean", "--cluster", path)
    assert result.exit_code == 1
    assert "kubectl config use-context other" in result.stderr
    assert fake.server.requests.count(verb="delete") == 0


@pytest.mark.parametrize(("cli", "variable", "hint"), [
    ("kubectl", "/nowhere/kubectl", "make install-system"),
    ("oc", "", "install oc from the OpenShift mirror"),
])
def test_missing_cli_says_how_to_install(home: Path, monkeypatch: pytest.MonkeyPatch, cli: str, variable: str,
                                         hint: str) -> None:
    monkeypatch.setenv("OPENSHIFT_CLIENT_PYTHON_DEFAULT_OC_PATH", variable)
    monkeypatch.setenv("PATH", str(home))
    path = home / "clusters" / "offline.yaml"
    path.write_text(yaml.safe_dump({"cluster": {"name": "offline", "namespace": "ml"},
                                    "backend": "kubernetes" if cli == "kubectl" else "openshift",
                                    "storage": {"class_rwo": "standard"}}))
    result = mlenv("status", "--cluster", str(path))
    assert result.exit_code == 2
    assert hint in result.stderr


# --- command lines and pod views (no server needed) ----------------------------------------------------------


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> KubernetesBackend:
    monkeypatch.setenv("OPENSHIFT_CLIENT_PYTHON_DEFAULT_OC_PATH", "/bin/echo")
    return KubernetesBackend("kubectl", RECORDS)


@pytest.fixture
def handle(home: Path, backend: KubernetesBackend) -> Handle:
    path = home / "clusters" / "argv.yaml"
    path.write_text(yaml.safe_dump({"cluster": {"name": "argv", "namespace": "ml"}, "backend": "kubernetes",
                                    "storage": {"class_rwo": "standard"}}))
    return backend.prepare(load_plan(str(path))).handle


def test_command_lines(backend: KubernetesBackend, handle: Handle) -> None:
    pod = Node(ordinal=1, name=f"{APP}-1", workspace="/workspace")
    argv = backend.exec_argv(handle, pod, ["python", "a b.py", "$HOME"], env={"K": "v w"}, interactive=True)
    assert argv == ["/bin/echo", "exec", "-i", "-t", "-n", "ml", f"{APP}-1", "-c", "ml-dev", "--", "env", "K=v w",
                    "sh", "-c", script(), "sh", "/workspace", "python", "a b.py", "$HOME"]
    follow = backend.logs_argv(handle, pod, follow=True)  # the run's log, ending with it: the runtime's, over exec
    assert follow[:2] == ["/bin/echo", "exec"] and follow[-5:] == ["python3", "-m", "mlenv.runtime", "logs", "--follow"]
    target = backend.copy_target(handle, pod)
    assert target.destination == f"{APP}-1:/workspace/"
    assert target.rsh is not None
    # rsync runs `RSH HOST rsync --server ...`: the wrapper turns it into `<cli> exec ... -- rsync --server ...`.
    shown = subprocess.run([*target.rsh, pod.name, "rsync", "--server", "-logDtpre.iLsfxC", "."],
                           capture_output=True, text=True, check=True, env={"PYTHONPATH": str(ROOT / "tools")})
    assert shown.stdout.split() == ["exec", "-i", "-n", "ml", f"{APP}-1", "-c", "ml-dev", "--", "rsync",
                                    "--server", "-logDtpre.iLsfxC", "."]
    assert target.rsh[0] == sys.executable


def test_rdma_devices_from_network_status() -> None:
    status = [{"name": "ovn-kubernetes", "interface": "eth0", "default": True},
              {"name": "ml/sriov-a", "interface": "net1", "device-info": {"pci": {"rdma-device": "mlx5_6"}}},
              {"name": "ml/sriov-b", "interface": "net2"}]
    pod = {"metadata": {"annotations": {"k8s.v1.cni.cncf.io/network-status": json.dumps(status)}}}
    assert rdma_devices(pod) == "net1=mlx5_6,net2"
    assert rdma_devices({"metadata": {}}) is None


@pytest.mark.parametrize(("api", "server", "same"), [
    ("api.example.com", "https://api.example.com:6443", True),
    ("example.com", "https://api.example.com:6443", True),
    ("https://api.example.com:6443", "https://API.example.com:6443", True),
    ("api.example.com:6443", "https://api.example.com:7443", False),
    ("api.example.com", "https://api.other.com:6443", False),
])
def test_same_server(api: str, server: str, same: bool) -> None:
    assert same_server(api, server) is same


def test_a_half_failed_deploy_is_recorded_and_clean_removes_what_was_applied(fake: FakeCluster, home: Path) -> None:
    from tests.fakekube import Deny

    fake.server.denied.add(Deny("patch", "statefulsets", NAMESPACE))  # server-side apply of the StatefulSet: 403
    path = cluster_file(home, fake)
    failed = mlenv("deploy", path)
    assert failed.exit_code == 1 and "forbidden" in failed.stderr.lower(), failed.output
    assert names(fake, "serviceaccounts") == ["ml-dev-sa"] and names(fake, "services") == [f"{APP}-headless"]
    assert names(fake, "statefulsets") == []
    recorded = json.loads((home / ".mlenv" / "state.json").read_text())
    assert recorded["current"] is None and recorded["deployments"]["fake"]["deploy"]["state"] == "failed"
    cleaned = mlenv("clean", "--cluster", "fake")  # recorded before the first object was sent
    assert cleaned.exit_code == 0, cleaned.output
    assert not any(names(fake, kind) for kind in ("serviceaccounts", "services", "networkpolicies", "statefulsets"))


def test_a_hung_apply_that_completes_later_is_recorded_and_cleaned(fake: FakeCluster, home: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from mlenv.backends.kubeapi import client

    monkeypatch.setattr(client, "CALL_TIMEOUT", 3)
    release = fake.server.held[("patch", "statefulsets")] = threading.Event()
    try:
        hung = mlenv("deploy", cluster_file(home, fake))
    finally:
        release.set()  # the server now applies the StatefulSet the client gave up on
    assert fake.server.holding.is_set()
    assert hung.exit_code == 1 and "got no answer within 3s" in hung.stderr, hung.output
    deadline = time.monotonic() + 30
    while names(fake, "statefulsets") != [APP] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert names(fake, "statefulsets") == [APP]  # GPU pods come up with no client left to see them
    status = mlenv("status", "--cluster", "fake")
    assert status.exit_code == 0 and f"{APP}-0" in status.stdout, status.output
    assert "fake: deploy failed: " in status.stdout and "got no answer within 3s" in status.stdout
    cleaned = mlenv("clean", "--cluster", "fake")
    assert cleaned.exit_code == 0, cleaned.output
    assert not any(names(fake, kind) for kind in ("serviceaccounts", "services", "networkpolicies", "statefulsets"))


def test_detached_launch_logs_and_stop_on_kubernetes(fake: FakeCluster, home: Path) -> None:
    path = cluster_file(home, fake)
    assert mlenv("deploy", path).exit_code == 0
    dry = mlenv("launch", "--detach", "--dry-run", "--env", "HF_TOKEN", "train.py", "-c", "cfg.yaml")
    assert dry.exit_code == 0, dry.output
    lines = dry.stdout.splitlines()
    assert "HF_TOKEN=<forwarded from your environment>" in lines[2]
    run = lines[0].split()[4]  # "# mlenv launch: run <id> of ..."
    assert lines[3:] == [f"node-{n}: python3 -m mlenv.runtime launch --launcher torchrun --run-dir "
                         f".mlenv/runs/{run} --detach -- train.py -c cfg.yaml" for n in (0, 1)]

    backend = KubernetesBackend("kubectl", RECORDS)
    handle = Handle.from_json(json.loads((home / ".mlenv" / "state.json").read_text())
                              ["deployments"]["fake"]["handle"])
    pod = Node(0, f"{APP}-0", "/workspace")
    command = ["python3", "-m", "mlenv.runtime", "launch", "--detach", "--", "train.py"]
    assert backend.exec_argv(handle, pod, command, env={"MLENV_RUN_ID": run}, secrets=["HF_TOKEN"]) == [
        backend.binary, "exec", "-i", "-n", NAMESPACE, f"{APP}-0", "-c", "ml-dev", "--", "env", f"MLENV_RUN_ID={run}",
        "sh", "-c", script(secrets=["HF_TOKEN"]), "sh", "/workspace", *command]
    assert backend.exec_argv(handle, pod, backend.runtime(handle, "stop"))[-4:] == [
        "python3", "-m", "mlenv.runtime", "stop"]
    # logs, -f and stop of a detached run go through the runtime over exec: tests/integration/test_conformance.py
    # runs them against pods that really run
    follow = backend.logs_argv(handle, pod, follow=True)
    assert follow[:6] == [backend.binary, "exec", "-i", "-n", NAMESPACE, f"{APP}-0"]
    assert follow[-3:] == ["mlenv.runtime", "logs", "--follow"]
