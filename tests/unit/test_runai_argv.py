"""The Run:ai backend's command lines: golden argv for v1 and v2 from several cluster files, the table of every flag
mlenv emits with its source (keys as in tests/fixtures/runai/REFERENCE.md, which has the full references), what
``render`` prints, and the cluster-file mistakes refused before anything runs."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from mlenv.backends.runai import argv as commands
from mlenv.backends.runai import flags
from mlenv.backends.runai.backend import RunaiBackend
from mlenv.backends.runai.workload import ordinal, pod_name
from mlenv.cli import main
from mlenv.core.clusters import load_plan

V1_COMMON = "V1-COMMON: run-ai/docs docs/snippets/common-submit-cli-commands.md @6c27d60a"
V1_DIST = "V1-DIST: run-ai/docs docs/Researcher/cli-reference/runai-submit-dist-pytorch.md @106c5007"
V1_PRACTICE = "REFERENCE.md 'existing PVC'/'node pools' rows: public EPFL scripts run with v1 2.16-2.18"
V2_SUBMIT = "V2-SUBMIT: run-ai/docs docs/Researcher/cli-reference/new-cli/runai_training_pytorch_submit.md @029bc119"
SEED = "SEED: /work/shared/seeds/000_4f4b371a9ee24e2e.txt (runai 2.18.94 on EPFL RCP)"

FLAG_SOURCES: dict[tuple[str, str], str] = {
    ("v1", "--name"): f"{V1_COMMON} '--name <string>'; {SEED}",
    ("v1", "-p"): f"{V1_COMMON} '--project | -p (string)'",
    ("v1", "--workers"): f"{V1_DIST} '--workers <int>'; {SEED} '--workers=1' for 2 pods",
    ("v1", "-g"): f"{V1_COMMON} '-g | --gpu <float>'; {SEED} '-g 4'",
    ("v1", "-i"): f"{V1_COMMON} '--image <string> | -i <string>'",
    ("v1", "--node-pools"): f"{V1_COMMON} '--node-pools <string>'",
    ("v1", "--node-pool"): f"{V1_PRACTICE} (only with runai.flag_spellings.node_pools)",
    ("v1", "--large-shm"): f"{V1_COMMON} '--large-shm'",
    ("v1", "--annotation"): f"{V1_COMMON} '-a | --annotation <stringArray>'; {SEED}",
    ("v1", "--extended-resource"): f"{V1_COMMON} '--extended-resource <stringArray>'; {SEED}",
    ("v1", "--add-capability"): f"{V1_COMMON} '--add-capability <stringArray>'",
    ("v1", "--pvc-new"): f"{V1_COMMON} '--pvc-new <string>'",
    ("v1", "--pvc-exists"): f"{V1_COMMON} '--pvc-exists <string>'",
    ("v1", "--existing-pvc"): f"{V1_PRACTICE} (only with runai.flag_spellings.existing_pvc)",
    ("v1", "-e"): f"{V1_COMMON} '-e <stringArray> | --environment <stringArray>'",
    ("v1", "--working-dir"): f"{V1_COMMON} '--working-dir <string>'",
    ("v1", "--command"): f"{V1_COMMON} '--command' (overrides the entry point with what follows --)",
    ("v2", "-p"): f"{V2_SUBMIT} '-p, --project string'",
    ("v2", "--workers"): f"{V2_SUBMIT} '--workers int32'",
    ("v2", "--gpu-devices-request"): f"{V2_SUBMIT} '-g, --gpu-devices-request int32'",
    ("v2", "-i"): f"{V2_SUBMIT} '-i, --image string'",
    ("v2", "--node-pools"): f"{V2_SUBMIT} '--node-pools stringArray'",
    ("v2", "--large-shm"): f"{V2_SUBMIT} '--large-shm'",
    ("v2", "--annotation"): f"{V2_SUBMIT} '--annotation stringArray'",
    ("v2", "--extended-resource"): f"{V2_SUBMIT} '--extended-resource stringArray'",
    ("v2", "--capability"): f"{V2_SUBMIT} '--capability stringArray'",
    ("v2", "--new-pvc"): f"{V2_SUBMIT} '--new-pvc stringArray'",
    ("v2", "--existing-pvc"): f"{V2_SUBMIT} '--existing-pvc stringArray'",
    ("v2", "-e"): f"{V2_SUBMIT} '-e, --environment stringArray' (newest v2: --environment-variable, same -e)",
    ("v2", "--working-dir"): f"{V2_SUBMIT} '--working-dir string'",
    ("v2", "--command"): f"{V2_SUBMIT} '-c, --command' (override the entrypoint with what follows --)",
}
"""Every flag mlenv emits, per CLI generation, with where Run:ai documents it. (The v2 name is the first argument:
V2-SUBMIT's examples, `runai training pytorch submit <name> -p <project>`.)"""

COMMAND_SOURCES = {
    ("v1", "delete"): "V1-CMDS runai-delete.md: runai delete job <job-name> -p",
    ("v2", "delete"): "V2-CMDS runai_training_pytorch_delete.md @73d9d266: runai training pytorch delete NAME -p",
    ("v1", "describe"): "V1-CMDS runai-describe.md @365ffaed: runai describe job NAME -p P",
    ("v2", "describe"): "V2-CMDS runai_training_pytorch_describe.md @090b17d7: runai training pytorch describe NAME",
}

RCP = """\
backend: runai
cluster: {name: rcp, namespace: runai-mlo-me}
runai:
  project: mlo-me
  cli: CLI
  node_pools: [h100]
  large_shm: true
  existing_pvcs: [{claim: mlo-scratch, path: /mloscratch}]
image: ic-registry.epfl.ch/mlo/mlo:v1
gpus: {per_node: 4, default_nodes: 2}
network:
  rdma: {enabled: true, networks: [kube-system/roce], resources: {rdma/rdma: 1}, gid_index: auto}
security: {ipc_lock: true}
"""
TCP_STORAGE = """\
backend: runai
cluster: {name: tcp-cluster}
app: {name: llm}
runai:
  project: team-a
  extra_args: [--toleration, "operator=Exists,key=gpu", --label, team=mlo]
image: nvcr.io/nvidia/pytorch:25.01-py3
gpus: {per_node: 8, default_nodes: 3}
storage: {mode: rwx, class_rwx: cephfs, workspace_size: 50Gi}
env: {OMP_NUM_THREADS: 8, HF_HOME: /workspace/.cache/hf}
nccl: {debug: INFO}
network:
  tcp: {interface_exclude: "^lo,docker"}
"""
ONE_NODE = """\
backend: runai
cluster: {name: single, namespace: ml-ns}
runai: {project: solo, cli: v1, node_pools: [a100]}
gpus: {per_node: 2, default_nodes: 1}
storage: {class_rwo: local-path, workspace_size: 20Gi}
network:
  rdma: {enabled: true, resources: {rdma/rdma: 1}}
security: {ipc_lock: true}
"""
OLD_BUILD = """\
backend: runai
cluster: {name: old-build}
runai:
  project: mlo
  cli: v1
  node_pools: [h100]
  existing_pvcs: [{claim: scratch, path: /scratch}, {claim: home, path: /home/me}]
  flag_spellings: {existing_pvc: --existing-pvc, node_pools: --node-pool}
gpus: {per_node: 8, default_nodes: 2}
"""
DEFAULT_IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"
CONTAINER_LOG = ["-e", "MLENV_CONTAINER_LOG=/proc/1/fd/1"]
TAIL = ["--working-dir", "/workspace", "--command", "--", "sleep", "infinity"]


def env(*pairs: str) -> list[str]:
    return [item for pair in pairs for item in ("-e", pair)]


RDMA_ENV = env("MLENV_NUM_NODES=2", "MLENV_PROCS_PER_NODE=4", "MLENV_APP_NAME=ml-dev-env", "MLENV_NETWORK_MODE=rdma",
               "NCCL_IB_DISABLE=0")
GOLDEN = {
    "rcp-v2": (RCP.replace("CLI", "v2"), [
        "runai", "training", "pytorch", "submit", "ml-dev-env", "-p", "mlo-me", "--workers", "1",
        "--gpu-devices-request", "4", "-i", "ic-registry.epfl.ch/mlo/mlo:v1", "--node-pools", "h100", "--large-shm",
        "--annotation", "k8s.v1.cni.cncf.io/networks=kube-system/roce", "--extended-resource", "rdma/rdma=1",
        "--capability", "IPC_LOCK", "--existing-pvc", "claimname=mlo-scratch,path=/mloscratch", *RDMA_ENV,
        *CONTAINER_LOG, *TAIL]),
    "rcp-v1": (RCP.replace("CLI", "v1"), [
        "runai", "submit-dist", "pytorch", "--name", "ml-dev-env", "-p", "mlo-me", "--workers", "1", "-g", "4",
        "-i", "ic-registry.epfl.ch/mlo/mlo:v1", "--node-pools", "h100", "--large-shm",
        "--annotation", "k8s.v1.cni.cncf.io/networks=kube-system/roce", "--extended-resource", "rdma/rdma=1",
        "--add-capability", "IPC_LOCK", "--pvc-exists", "claimname=mlo-scratch,path=/mloscratch", *RDMA_ENV,
        *CONTAINER_LOG, *TAIL]),
    "tcp-storage-v2": (TCP_STORAGE, [
        "runai", "training", "pytorch", "submit", "llm", "-p", "team-a", "--workers", "2",
        "--gpu-devices-request", "8", "-i", DEFAULT_IMAGE,
        "--new-pvc", "claimname=llm-workspace,storageclass=cephfs,size=50Gi,path=/workspace,accessmode-rwm",
        *env("MLENV_NUM_NODES=3", "MLENV_PROCS_PER_NODE=8", "MLENV_APP_NAME=llm", "MLENV_NETWORK_MODE=tcp",
             "OMP_NUM_THREADS=8", "HF_HOME=/workspace/.cache/hf", "NCCL_DEBUG=INFO", "NCCL_IB_DISABLE=1",
             "NCCL_SOCKET_IFNAME=^lo,docker"), *CONTAINER_LOG,
        "--working-dir", "/workspace", "--toleration", "operator=Exists,key=gpu", "--label", "team=mlo",
        "--command", "--", "sleep", "infinity"]),
    "one-node-v1": (ONE_NODE, [
        "runai", "submit-dist", "pytorch", "--name", "ml-dev-env", "-p", "solo", "--workers", "0", "-g", "2",
        "-i", DEFAULT_IMAGE, "--node-pools", "a100", "--extended-resource", "rdma/rdma=1",
        "--add-capability", "IPC_LOCK",
        "--pvc-new", "claimname=ml-dev-env-workspace,storageclass=local-path,size=20Gi,path=/workspace,accessmode-rwo",
        *env("MLENV_NUM_NODES=1", "MLENV_PROCS_PER_NODE=2", "MLENV_APP_NAME=ml-dev-env", "MLENV_NETWORK_MODE=rdma",
             "NCCL_IB_DISABLE=0"), *CONTAINER_LOG, *TAIL]),
    "old-build-v1": (OLD_BUILD, [
        "runai", "submit-dist", "pytorch", "--name", "ml-dev-env", "-p", "mlo", "--workers", "1", "-g", "8",
        "-i", DEFAULT_IMAGE, "--node-pool", "h100", "--existing-pvc", "claimname=scratch,path=/scratch",
        "--existing-pvc", "claimname=home,path=/home/me",
        *env("MLENV_NUM_NODES=2", "MLENV_PROCS_PER_NODE=8", "MLENV_APP_NAME=ml-dev-env", "MLENV_NETWORK_MODE=tcp",
             "NCCL_IB_DISABLE=1"), *CONTAINER_LOG, *TAIL]),
}
"""Cluster file -> the exact submit argv: with and without RDMA, IPC_LOCK, PVCs (new RWX/RWO, existing), node
pools, extra_args, one node (a master alone: --workers 0), and a v1 build's other spellings."""


@pytest.fixture(autouse=True)
def no_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """prepare is pure: no runai, no kubectl, no cluster needed (PATH holds nothing)."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("MLENV_HOME", str(tmp_path))


def write(tmp_path: Path, text: str, name: str = "cluster.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("case", GOLDEN)
def test_golden_argv(tmp_path: Path, case: str) -> None:
    text, expected = GOLDEN[case]
    request = RunaiBackend().prepare(load_plan(write(tmp_path, text)))
    assert list(request.payload.argv) == expected
    assert request.text == shlex.join(expected) + "\n"
    assert shlex.split(request.text) == expected  # copy-pastable: the shell gives back the same argv


@pytest.mark.parametrize("case", GOLDEN)
def test_every_flag_emitted_has_a_source(case: str) -> None:
    argv = GOLDEN[case][1]
    cli = "v1" if argv[1] == "submit-dist" else "v2"
    extra = {"--toleration", "--label"} if case == "tcp-storage-v2" else set()  # runai.extra_args: the user's own
    flags = {arg for arg in argv[:argv.index("--")] if arg.startswith("-")} - extra
    assert flags <= {flag for c, flag in FLAG_SOURCES if c == cli}, flags - {f for c, f in FLAG_SOURCES if c == cli}


def test_the_flag_table_has_no_row_mlenv_never_emits() -> None:
    emitted = {("v1" if argv[1] == "submit-dist" else "v2", arg) for _, argv in GOLDEN.values() for arg in argv}
    assert set(FLAG_SOURCES) <= emitted
    spelled = {(cli, flag) for cli, spellings in flags.FLAGS.items() for flag in spellings.values()}
    spelled |= {(cli, flag) for cli, flag in flags.NAME_FLAG.items() if flag}
    spelled |= {(cli, flag) for (cli, _), known in flags.VARIANTS.items() for flag in known
                if (cli, flag) in FLAG_SOURCES}
    assert spelled == set(FLAG_SOURCES)  # the code's table and this one agree


@pytest.mark.parametrize(("cli", "verb", "expected"), [
    ("v1", "delete", ["runai", "delete", "job", "ml-dev-env", "-p", "mlo"]),
    ("v2", "delete", ["runai", "training", "pytorch", "delete", "ml-dev-env", "-p", "mlo"]),
    ("v1", "describe", ["runai", "describe", "job", "ml-dev-env", "-p", "mlo"]),
    ("v2", "describe", ["runai", "training", "pytorch", "describe", "ml-dev-env", "-p", "mlo"]),
])
def test_clean_and_describe_argv(cli: str, verb: str, expected: list[str]) -> None:
    assert (cli, verb) in COMMAND_SOURCES
    assert getattr(commands, verb)(cli, "ml-dev-env", "mlo") == expected
    assert commands.submit_help(cli) == ["runai", *(["submit-dist", "pytorch"] if cli == "v1"
                                                    else ["training", "pytorch", "submit"]), "--help"]


def test_render_and_dry_run_print_the_command_line(tmp_path: Path) -> None:
    text, expected = GOLDEN["rcp-v2"]
    path = write(tmp_path, text)
    for args in (["render", path], ["deploy", path, "--dry-run"]):
        result = CliRunner().invoke(main, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert result.stdout == shlex.join(expected) + "\n"
    written = CliRunner().invoke(main, ["render", path, "-o", str(tmp_path / "out")], catch_exceptions=False)
    assert written.exit_code == 0, written.output
    assert (tmp_path / "out" / "runai-submit.sh").read_text() == f"#!/bin/sh\n{shlex.join(expected)}\n"


def test_the_handle_and_the_workspace(tmp_path: Path) -> None:
    backend = RunaiBackend()
    rcp = backend.prepare(load_plan(write(tmp_path, GOLDEN["rcp-v2"][0]))).handle
    assert (rcp.backend, rcp.nodes, rcp.mode, rcp.shared_workspace, rcp.env) == ("runai", 2, "rdma", False, {})
    assert {k: rcp.data[k] for k in ("name", "project", "namespace", "cli", "workspace_claim")} == {
        "name": "ml-dev-env", "project": "mlo-me", "namespace": "runai-mlo-me", "cli": "v2", "workspace_claim": None}
    shared = backend.prepare(load_plan(write(tmp_path, TCP_STORAGE))).handle
    assert (shared.shared_workspace, shared.data["namespace"], shared.data["workspace_claim"]) == (
        True, "runai-team-a", "llm-workspace")


def test_warnings(tmp_path: Path) -> None:
    rwo = ONE_NODE.replace("default_nodes: 1", "default_nodes: 2")
    warnings = RunaiBackend().prepare(load_plan(write(tmp_path, rwo))).warnings
    assert warnings == ("the workspace PVC ml-dev-env-workspace is ReadWriteOnce (storage.mode is not rwx) and "
                        "mounted by all 2 pods: pods on different machines cannot attach it; use storage.mode: rwx",)
    bare = RCP.replace("CLI", "v2").replace("networks: [kube-system/roce], resources: {rdma/rdma: 1}, ", "")
    assert RunaiBackend().prepare(load_plan(write(tmp_path, bare))).warnings[0].startswith(
        "RDMA mode without network.rdma.networks or network.rdma.resources")
    tcp = RunaiBackend().prepare(load_plan(write(tmp_path, RCP.replace("CLI", "v2")), mode="tcp"))
    assert "--annotation" not in tcp.payload.argv and "--extended-resource" not in tcp.payload.argv


BAD = """\
backend: runai
cluster: {name: bad}
runai:
  project: mlo
  cli: v1
  node_pools: [a, b]
  existing_pvcs: [{claim: ws, path: /workspace}]
  flag_spellings: {existing_pvc: --pvc-exsts}
  extra_args: [--workers, "3", --name=x, -pother, --, --annotation, "k8s.v1.cni.cncf.io/networks=x", --host-ipc]
storage: {class_rwx: nfs}
"""


def test_bad_combinations_exit_2_naming_the_field(tmp_path: Path) -> None:
    path = write(tmp_path, BAD)
    result = CliRunner().invoke(main, ["validate", path], catch_exceptions=False)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: {path}:6:3: runai.node_pools: the v1 CLI documents --node-pools as one string, not a list: give "
        "one pool (got 2), or use cli: v2",
        f"error: {path}:7:31: runai.existing_pvcs[0].path: /workspace is where the workspace PVC of storage: is "
        "mounted; mount this claim elsewhere, or remove storage: to use this claim as the workspace",
        f"error: {path}:8:20: runai.flag_spellings.existing_pvc: expected one of --pvc-exists, --pvc-exist, "
        '--existing-pvc (how v1 builds spell it), got "--pvc-exsts"',
        f"error: {path}:9:16: runai.extra_args[0]: --workers is set by mlenv (N nodes (gpus.default_nodes or "
        "--nodes) make --workers N-1); remove it",
        f"error: {path}:9:32: runai.extra_args[2]: --name is set by mlenv (the workload is named after app.name); "
        "remove it",
        f"error: {path}:9:42: runai.extra_args[3]: -p is set by mlenv (from runai.project); remove it",
        f"error: {path}:9:51: runai.extra_args[4]: -- ends runai's flags: mlenv puts the pods' command (sleep "
        "infinity) after it; remove it",
        f"error: {path}:9:55: runai.extra_args[5]: the k8s.v1.cni.cncf.io/networks annotation is set by mlenv (from "
        "network.rdma.networks); remove it",
    ]


@pytest.mark.parametrize(("text", "expected"), [
    ("backend: runai\ncluster: {name: x}\n", "runai.project: missing required field 'project' (your Run:ai "
                                             "project: runai project list, or runai list projects with the v1 CLI)"),
    ("backend: runai\ncluster: {name: x}\nrunai: {cli: v2}\n", "runai: missing required field 'project'"),
    ("backend: runai\ncluster: {name: x}\nrunai: {project: p, flag_spellings: {existing_pvc: --existing-pvc}}\n",
     "runai.flag_spellings.existing_pvc: every v2 build spells it --existing-pvc; remove this entry"),
    ("backend: runai\ncluster: {name: x, namespace: kube-system}\nrunai: {project: p}\n",
     "cluster.namespace: kube-system is a system namespace"),
    ("backend: runai\ncluster: {name: x}\nrunai: {project: p, cli: v3}\n",
     'runai.cli: expected v1 (runai submit-dist pytorch) or v2 (runai training pytorch submit), got "v3"'),
    ("backend: runai\ncluster: {name: x}\nrunai: {project: p, existing_pvcs: [{claim: c, path: 'a,b'}]}\n",
     "runai.existing_pvcs[0].path: expected an absolute path in the pods, without commas, '=' or spaces"),
], ids=["no-section", "no-project", "v2-spelling", "system-namespace", "cli-v3", "path-with-comma"])
def test_bad_input(tmp_path: Path, text: str, expected: str) -> None:
    result = CliRunner().invoke(main, ["validate", write(tmp_path, text)], catch_exceptions=False)
    assert result.exit_code == 2
    assert expected in result.stderr
    assert "Traceback" not in result.output


def test_pod_order_from_labels_or_names() -> None:
    def pod(name: str, **labels: str) -> dict[str, object]:
        return {"metadata": {"name": name, "labels": {f"training.kubeflow.org/{k.replace('_', '-')}": v
                                                      for k, v in labels.items()}}}

    assert ordinal(pod("job-master-0", replica_type="master", replica_index="0"), "job") == 0
    assert ordinal(pod("job-worker-2", replica_type="worker", replica_index="2"), "job") == 3
    assert ordinal(pod("job-worker-1", replica_type="Worker", replica_index="1"), "job") == 2
    assert ordinal(pod("job-worker-4"), "job") == 5  # labels missing: the operator's name
    assert ordinal(pod("other-worker-4"), "job") is None
    assert ordinal(pod("job-launcher-0", replica_type="launcher", replica_index="0"), "job") is None
    assert [pod_name("job", i) for i in range(3)] == ["job-master-0", "job-worker-0", "job-worker-1"]
