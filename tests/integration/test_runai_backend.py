"""The Run:ai backend against the `runai` stand-in (tests/fixtures/runai/runai) and fakekube, with the real kubectl.

The stand-in records its argv, accepts only the flags of the CLI generation it plays, and makes the workload's pods
on the fake API server with the labels and environment the training operator gives a PyTorchJob master and its
workers (tests/fixtures/runai/REFERENCE.md); everything mlenv does after submitting goes through kubectl for real.
Here exec, logs and sync are covered by their command lines; test_kubernetes_pods runs them for real (with
fakekube's kubelet running the stand-in's pods): deploy, status, exec, sync, a torchrun job, clean.
"""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlenv.backends.kubeapi import explain, waiting
from mlenv.backends.runai import tool
from mlenv.backends.runai.backend import RunaiBackend
from mlenv.core.capabilities import Handle, Node
from mlenv.core.clusters import load_plan
from mlenv.core.remote import script
from mlenv.runtime.node.topology import detect_topology

from tests.fakekube import NodeSpec
from tests.fakekube.fixtures import FakeCluster, fake_kube_factory  # noqa: F401 - the fixture, re-exported
from tests.fakekube.seeds import network_attachment_definition
from tests.helpers import invoke as mlenv

ROOT = Path(__file__).resolve().parents[2]
STANDIN = ROOT / "tests" / "fixtures" / "runai"
PROJECT = "ml"
NAMESPACE = f"runai-{PROJECT}"
APP = "ml-dev-env"
MASTER, WORKER = f"{APP}-master-0", f"{APP}-worker-0"
IMAGE = "registry.example.com/ml/train:v1"


@pytest.fixture(autouse=True)
def fast_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Poll the fake API server often: its pods change state in fractions of a second."""
    monkeypatch.setattr(waiting, "POLL_SECONDS", 0.2)


@pytest.fixture
def argv_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in first on PATH (playing the v2 CLI unless a test says otherwise), recording into this file."""
    log = tmp_path / "runai-argv.jsonl"
    monkeypatch.setenv("PATH", f"{STANDIN}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("RUNAI_STANDIN_LOG", str(log))
    monkeypatch.setenv("RUNAI_STANDIN_CLI", "v2")
    tool._help.cache_clear()  # "once per process": these tests share one process, with different stand-ins
    return log


@pytest.fixture
def fake(fake_kube_factory: Callable[..., FakeCluster], home: Path, argv_log: Path,  # noqa: F811 - fixture
         monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    """Two nodes (8 GPUs and one rdma/rdma each), project ml's namespace labelled as Run:ai labels it, and the
    kube-system/roce network."""
    nodes = [NodeSpec(name, allocatable={"rdma/rdma": "1"}) for name in ("gpu-0", "gpu-1")]
    cluster = fake_kube_factory(nodes=nodes, namespaces=[NAMESPACE])
    cluster.server.set_namespace_labels(NAMESPACE, {"runai/queue": PROJECT})
    cluster.server.add_namespace("kube-system")
    cluster.server.add(network_attachment_definition("kube-system", "roce", resource_name="rdma/rdma"))
    cluster.use_in(monkeypatch)
    return cluster


def cluster_file(home: Path, *, cli: str = "v2", name: str = "rcp", rdma: bool = True, storage: bool = True,
                 **runai: Any) -> str:
    """A runai cluster file like clusters/rcp.yaml (2 nodes x 4 GPUs, RoCE, IPC_LOCK, a workspace PVC)."""
    document: dict[str, Any] = {
        "backend": "runai",
        "cluster": {"name": name, "description": "fake Run:ai"},
        "runai": {"project": PROJECT, "cli": cli, "large_shm": True, **runai},
        "image": IMAGE,
        "gpus": {"per_node": 4, "default_nodes": 2},
        "network": {"rdma": {"enabled": True, "networks": ["kube-system/roce"], "resources": {"rdma/rdma": 1},
                             "gid_index": "auto"}} if rdma else {},
        "security": {"ipc_lock": True},
    }
    if storage:
        document["storage"] = {"mode": "rwx", "class_rwx": "nfs-csi", "workspace_size": "10Gi"}
    path = home / "clusters" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return str(path)


def calls(log: Path) -> list[list[str]]:
    """Every argv the stand-in was run with, in order."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def pods(fake: FakeCluster) -> dict[str, dict[str, Any]]:
    """The stored pods of the project's namespace by name."""
    return {p["metadata"]["name"]: p for p in fake.server.objects("pods", NAMESPACE)}


def claims(fake: FakeCluster) -> list[str]:
    return sorted(c["metadata"]["name"] for c in fake.server.objects("persistentvolumeclaims", NAMESPACE))


@pytest.mark.parametrize("cli", ["v1", "v2"])
def test_deploy_status_redeploy_clean(fake: FakeCluster, home: Path, argv_log: Path,
                                      monkeypatch: pytest.MonkeyPatch, cli: str) -> None:
    monkeypatch.setenv("RUNAI_STANDIN_CLI", cli)
    fake.kubectl("create", "-n", NAMESPACE, "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "scratch"},
         "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}}))
    path = cluster_file(home, cli=cli, existing_pvcs=[{"claim": "scratch", "path": "/scratch"}])
    rendered = mlenv("render", path)
    assert rendered.exit_code == 0, rendered.output

    deployed = mlenv("deploy", path)
    assert deployed.exit_code == 0, deployed.output
    assert "2/2 pods ready" in deployed.stderr
    submit = shlex.split(rendered.stdout)
    help_call = [["submit-dist", "pytorch", "--help"]] if cli == "v1" else []  # v1 spells --pvc-exists variously
    describe = ["describe", "job", APP, "-p", PROJECT] if cli == "v1" else ["training", "pytorch", "describe", APP,
                                                                            "-p", PROJECT]
    assert calls(argv_log) == [["whoami"], *help_call, describe, submit[1:]]  # exactly what render printed
    recorded = json.loads((home / ".mlenv" / "state.json").read_text())["deployments"]["rcp"]
    assert recorded["backend"] == "runai"
    assert recorded["handle"]["data"]["namespace"] == NAMESPACE
    assert recorded["handle"]["data"]["workspace_claim"] == f"{APP}-workspace"
    assert claims(fake) == [f"{APP}-workspace", "scratch"]

    fake.server.requests.clear()
    status = mlenv("status", "--json")
    assert status.exit_code == 0, status.output
    rows = json.loads(status.stdout)["pods"]
    assert [(p["pod"], p["node"], p["ready"], p["gpus"], p["phase"]) for p in rows] == [
        (MASTER, 0, True, 4, "Running"), (WORKER, 1, True, 4, "Running")]
    assert sorted(p["host"] for p in rows) == ["gpu-0", "gpu-1"]  # one rdma/rdma per node: one pod per node
    api = [(r.verb, r.resource, r.query.get("labelSelector")) for r in fake.server.requests.api_calls()]
    assert api == [("list", "pods", f"workloadName={APP}")]

    uids = sorted(p["metadata"]["uid"] for p in pods(fake).values())
    again = mlenv("deploy", path)
    assert again.exit_code == 0, again.output
    assert f"workload {APP} is already submitted in project {PROJECT}" in again.stderr
    assert sum(call[:len(submit) - 1] == submit[1:] for call in calls(argv_log)) == 1  # never submitted twice
    assert sorted(p["metadata"]["uid"] for p in pods(fake).values()) == uids

    backend = RunaiBackend()
    handle = backend.prepare(load_plan(path)).handle
    assert [(n.ordinal, n.name, n.workspace, n.ready) for n in backend.nodes(handle)] == [
        (0, MASTER, "/workspace", True), (1, WORKER, "/workspace", True)]

    cleaned = mlenv("clean", "--yes")
    assert cleaned.exit_code == 0, cleaned.output
    delete = ["delete", "job", APP, "-p", PROJECT] if cli == "v1" else ["training", "pytorch", "delete", APP, "-p",
                                                                        PROJECT]
    assert calls(argv_log)[-1] == delete
    assert pods(fake) == {}
    assert f"kept the workspace PVC {APP}-workspace" in cleaned.stderr
    assert claims(fake) == [f"{APP}-workspace", "scratch"]
    assert json.loads((home / ".mlenv" / "state.json").read_text())["deployments"] == {}

    twice = mlenv("clean", "--cluster", path)
    assert twice.exit_code == 0, twice.output
    assert f"nothing to clean: no workload {APP} in project {PROJECT}" in twice.stderr

    wiped = mlenv("clean", "--cluster", path, "--delete-data", "--yes")
    assert wiped.exit_code == 0, wiped.output
    assert claims(fake) == ["scratch"]  # existing_pvcs are never deleted


def test_pods_get_the_pytorchjob_env_and_the_runtime_reads_it(fake: FakeCluster, home: Path) -> None:
    """The environment a PyTorchJob master and worker get (plus mlenv's -e contract) gives the runtime's topology
    the node rank, the node count (from PET_NNODES/MLENV_NUM_NODES, never WORLD_SIZE), and the master."""
    assert mlenv("deploy", cluster_file(home)).exit_code == 0
    found = pods(fake)
    for name, rank in ((MASTER, 0), (WORKER, 1)):
        env = {e["name"]: e["value"] for e in found[name]["spec"]["containers"][0]["env"]}
        assert {k: env[k] for k in ("PET_NNODES", "PET_NODE_RANK", "RANK", "MASTER_ADDR", "MASTER_PORT",
                                    "RUNAI_NUM_OF_GPUS", "MLENV_NUM_NODES", "MLENV_PROCS_PER_NODE")} == {
            "PET_NNODES": "2", "PET_NODE_RANK": str(rank), "RANK": str(rank), "MASTER_ADDR": MASTER,
            "MASTER_PORT": "23456", "RUNAI_NUM_OF_GPUS": "4", "MLENV_NUM_NODES": "2", "MLENV_PROCS_PER_NODE": "4"}
        labels = found[name]["metadata"]["labels"]
        assert labels["workloadName"] == APP
        assert labels["training.kubeflow.org/replica-type"] == ("master" if rank == 0 else "worker")
        for world in (env, {**env, "MLENV_NODE_RANK": str(rank)}):  # the pod alone, and as mlenv exec runs it
            topology = detect_topology({**world, "WORLD_SIZE": "999"}, hostname=name)
            assert (topology.node_rank, topology.num_nodes, topology.procs_per_node, topology.master_addr,
                    topology.master_port) == (rank, 2, 4, MASTER, 23456)
        container = found[name]["spec"]["containers"][0]
        assert container["command"] == ["sleep", "infinity"]
        context = dict(container["securityContext"])  # what mlenv asked for, and what the SCC (restricted-v2) adds
        assert context.pop("runAsUser") >= 1_000_000_000 and context.pop("allowPrivilegeEscalation") is False
        assert context == {"capabilities": {"add": ["IPC_LOCK"], "drop": ["ALL"]}}
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "4", "rdma/rdma": "1"}
        annotations = dict(found[name]["metadata"]["annotations"])
        assert annotations.pop("openshift.io/scc") == "restricted-v2"
        assert annotations == {"k8s.v1.cni.cncf.io/networks": "kube-system/roce"}


def test_not_logged_in_or_not_installed(fake: FakeCluster, home: Path, argv_log: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = cluster_file(home)
    monkeypatch.setenv("RUNAI_STANDIN_LOGGED_OUT", "1")
    result = mlenv("deploy", path)
    assert result.exit_code == 1
    assert ("runai whoami failed: Error: you are not logged in; run 'runai login' (exit 1): runai login"
            in result.stderr)
    assert calls(argv_log) == [["whoami"]]
    assert not (home / ".mlenv" / "state.json").exists()  # nothing was sent: nothing recorded

    monkeypatch.setenv("PATH", os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != str(STANDIN)))
    missing = mlenv("deploy", path)
    assert missing.exit_code == 2
    assert "runai not found on PATH: install the Run:ai CLI" in missing.stderr


@pytest.mark.parametrize(("fault", "expected"), [
    ("unschedulable", "no node has 4 free nvidia.com/gpu"),
    ("no_rdma", "Insufficient rdma/rdma"),
    ("image_pull_backoff", f'cannot pull image "{IMAGE}"'),
])
def test_reasons_in_plain_words(fake: FakeCluster, home: Path, monkeypatch: pytest.MonkeyPatch, fault: str,
                                expected: str) -> None:
    for reason in explain.GRACE_SECONDS:
        monkeypatch.setitem(explain.GRACE_SECONDS, reason, 0.5)
    if fault == "no_rdma":
        for node in ("gpu-0", "gpu-1"):
            fake.server.remove("nodes", node)
            fake.server.add_node(node)  # without rdma/rdma
    else:
        setattr(fake.server.faults, fault, True)
    result = mlenv("deploy", cluster_file(home))
    assert result.exit_code == 1
    assert f"{APP} in {NAMESPACE} cannot become ready (0/2 pods ready)" in result.stderr
    assert expected in result.stderr
    assert "deploy again to follow it once fixed (it is not submitted twice)" in result.stderr
    status = mlenv("status", "--cluster", "rcp", "--json")  # recorded before the submit, though not current
    assert status.exit_code == 0, status.output
    assert [expected in (p["detail"] or "") for p in json.loads(status.stdout)["pods"]] == [True, True]
    assert mlenv("clean", "--cluster", "rcp", "--yes").exit_code == 0
    assert pods(fake) == {}


def test_a_workload_without_pods_says_why(fake: FakeCluster, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNAI_STANDIN_HELD", "NotEnoughQuota: project ml has 4 of the 8 GPUs it asks for")
    result = mlenv("deploy", cluster_file(home), "--timeout", "2")
    assert result.exit_code == 1
    assert result.stderr.splitlines()[-3:] == [
        f"error: {APP} in {NAMESPACE} not ready after 2s (0/2 pods ready)",
        f"error: runaijob {APP}: NotEnoughQuota: project ml has 4 of the 8 GPUs it asks for",
        f"error: deploy again to follow it once fixed (it is not submitted twice), or remove it: mlenv clean "
        f"--cluster {home / 'clusters' / 'rcp.yaml'}"]


def test_flag_spelled_otherwise_by_the_installed_build(fake: FakeCluster, home: Path, argv_log: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNAI_STANDIN_CLI", "v1")
    monkeypatch.setenv("RUNAI_STANDIN_RENAME", "--pvc-exists=--existing-pvc")
    pvcs = [{"claim": "scratch", "path": "/scratch"}]
    result = mlenv("deploy", cluster_file(home, cli="v1", existing_pvcs=pvcs))
    assert result.exit_code == 1
    assert (f"the installed runai ({STANDIN / 'runai'}) has no --pvc-exists (runai submit-dist pytorch --help does "
            "not list it); this build spells it --existing-pvc: set runai.flag_spellings.existing_pvc: "
            "--existing-pvc") in result.stderr
    assert calls(argv_log) == [["whoami"], ["submit-dist", "pytorch", "--help"]]
    assert not (home / ".mlenv" / "state.json").exists()

    path = cluster_file(home, cli="v1", existing_pvcs=pvcs, flag_spellings={"existing_pvc": "--existing-pvc"})
    assert "--existing-pvc claimname=scratch,path=/scratch" in mlenv("render", path).stdout
    deployed = mlenv("deploy", path)
    assert deployed.exit_code == 0, deployed.output
    assert [c for c in calls(argv_log) if "--help" in c] == [["submit-dist", "pytorch", "--help"]]  # asked once


def test_doctor(fake: FakeCluster, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = mlenv("doctor", cluster_file(home), "--json")
    assert good.exit_code == 0, good.output
    checks = {c["name"]: (c["status"], c["evidence"]) for c in json.loads(good.stdout)["checks"]}
    assert checks["runai cli"] == ("PASS", str(STANDIN / "runai"))
    assert checks["runai login"] == ("PASS", "logged in as alice@example.com")
    assert checks["runai flags"] == ("PASS", "runai training pytorch submit --help lists every flag mlenv sends")
    assert checks["project"] == ("PASS", f"namespace {NAMESPACE} is project {PROJECT}'s (runai/queue={PROJECT})")
    assert checks["network kube-system/roce"] == ("PASS", "NetworkAttachmentDefinition kube-system/roce exists")
    assert checks["resource rdma/rdma"] == ("PASS", "2 of 2 nodes have 1 rdma/rdma allocatable (gpu-0, gpu-1)")
    assert checks["resource nvidia.com/gpu"][0] == "PASS"
    assert checks["may exec into pods"][0] == "PASS"

    monkeypatch.setenv("RUNAI_STANDIN_CLI", "v1")  # the file says v2
    tool._help.cache_clear()  # another runai than the one this process asked
    fake.server.remove("network-attachment-definitions", "roce", "kube-system")
    fake.server.set_namespace_labels(NAMESPACE, {"runai/queue": "someone-else"})
    bad = mlenv("doctor", cluster_file(home), "--json")
    assert bad.exit_code == 1
    checks = {c["name"]: (c["status"], c["evidence"]) for c in json.loads(bad.stdout)["checks"]}
    assert checks["runai flags"][0] == "FAIL" and "this runai may be the v1 CLI (set runai.cli: v1)" in \
        checks["runai flags"][1]
    assert checks["network kube-system/roce"] == (
        "FAIL", "NetworkAttachmentDefinition kube-system/roce does not exist")
    assert checks["project"] == ("WARN", f"namespace {NAMESPACE} exists but no namespace is labelled "
                                         f"runai/queue={PROJECT}: is it project {PROJECT}'s?")


# --- exec, shell, logs and sync: their command lines (run for real in test_kubernetes_pods) -------------------


@pytest.fixture
def runai_pod(home: Path) -> tuple[RunaiBackend, Handle, Node]:
    """A backend, a runai handle, and node 1 (the worker) with the workspace."""
    backend = RunaiBackend()
    handle = backend.prepare(load_plan(cluster_file(home))).handle
    return backend, handle, Node(ordinal=1, name=WORKER, workspace="/workspace")


def test_exec_logs_and_copy_command_lines(runai_pod: tuple[RunaiBackend, Handle, Node]) -> None:
    backend, handle, node = runai_pod
    kubectl = backend.kubectl
    argv = backend.exec_argv(handle, node, ["python", "a b.py", "$HOME"], env={"K": "v w"}, interactive=True)
    assert argv == [kubectl, "exec", "-i", "-t", "-n", NAMESPACE, WORKER, "--", "env", "MLENV_NODE_RANK=1",
                    "K=v w", "sh", "-c", script(), "sh", node.workspace, "python", "a b.py", "$HOME"]
    stopping = backend.exec_argv(handle, node, ["true"], stop_on_stdin_eof=True, secrets=["TOKEN"])
    assert stopping[stopping.index("-c") + 1] == script(stop_on_stdin_eof=True, secrets=["TOKEN"])
    follow = backend.logs_argv(handle, node, follow=True)  # the run's log, ending with it: the runtime's, over exec
    assert follow[:2] == [kubectl, "exec"] and follow[-5:] == ["python3", "-m", "mlenv.runtime", "logs", "--follow"]
    target = backend.copy_target(handle, node)
    assert (target.destination, target.rsh) == (
        f"env:{node.workspace}/", [kubectl, "exec", "-i", "-n", NAMESPACE, WORKER, "--"])
