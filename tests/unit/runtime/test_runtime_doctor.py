"""``python -m mlenv.runtime doctor``: what a node sees, from fixture sysfs/procfs trees, as checks with evidence and
fix; the rendezvous port between two nodes over loopback; the one JSON line mlenv doctor reads."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from mlenv.backends.slurm.backend import SlurmBackend
from mlenv.runtime.doctor import KIND, examine
from mlenv.runtime.fabric.nccl import Concern, detect_nccl_env
from runtime_support import Runner

from tests.helpers import free_port

VERSIONS = {"torch": "2.5.1", "cuda": "12.4", "nccl": "2.21.5", "gpus": 4}
ONE_NODE = {"MLENV_NODE_RANK": "0", "MLENV_NUM_NODES": "1"}


@pytest.fixture
def python(tmp_path: Path) -> str:
    """A stand-in for the image's python3 that answers the torch probe as a 4-GPU PyTorch image would."""
    path = tmp_path / "python3"
    path.write_text(f"#!/bin/sh\necho '{json.dumps(VERSIONS)}'\n")
    path.chmod(0o755)
    return str(path)


def checks(report: dict[str, Any]) -> dict[str, tuple[str, str, str | None]]:
    return {c["name"]: (c["status"], c["evidence"], c["fix"]) for c in report["checks"]}


def node(fixtures: Path, sysfs: str, proc: str, python: str, **env: str) -> dict[str, Any]:
    return examine({**ONE_NODE, **env}, sysfs_root=fixtures / "sysfs" / sysfs, proc_root=fixtures / "proc" / proc,
                   python=python).to_json()


def test_infiniband_node_facts_and_checks(fixtures: Path, python: str) -> None:
    report = node(fixtures, "infiniband", "pod_rdma", python, MLENV_NETWORK_MODE="rdma")
    facts = report["facts"]
    assert (report["kind"], report["node_rank"]) == (KIND, 0)
    assert facts["hcas"] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]  # the Ethernet mlx5_4 is left out by nccl-env
    assert (facts["hca_count"], facts["link_layers"], facts["rates_gbps"], facts["link_gbps"]) == (
        4, ["InfiniBand"], [200.0], 800.0)
    assert facts["gid_type"] is None  # InfiniBand needs no GID index
    assert (facts["torch"], facts["cuda"], facts["nccl"], facts["gpus"]) == ("2.5.1", "12.4", "2.21.5", 4)
    found = checks(report)
    assert found["RDMA ports"][:2] == ("PASS", "4 ACTIVE (800 Gb/s in all): mlx5_0:1 InfiniBand 200 Gb/s, "
                                               "mlx5_1:1 InfiniBand 200 Gb/s, mlx5_2:1 InfiniBand 200 Gb/s, "
                                               "mlx5_3:1 InfiniBand 200 Gb/s")
    assert found["memlock"][0] == "PASS" and "unlimited" in found["memlock"][1]
    assert found["/dev/shm"][:2] == ("PASS", f"16.00 GiB ({fixtures}/proc/pod_rdma/mounts: size=16777216k)")
    assert found["torch"] == ("PASS", "torch 2.5.1, CUDA 12.4, NCCL 2.21.5, 4 GPUs visible", None)
    assert found["master address"][0] == "PASS" and "GID index" not in found


def test_roce_node_reports_the_gid_type_and_what_breaks_rdma(fixtures: Path, python: str) -> None:
    report = node(fixtures, "sriov_vfs", "pod_defaults", python, MLENV_NETWORK_MODE="rdma")
    assert report["facts"]["gid_type"] == "RoCE v2 IPv4"
    assert report["facts"]["hcas"] == ["mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_10", "mlx5_11"]
    found = checks(report)
    assert found["GID index"][:2] == ("PASS", "NCCL_IB_GID_INDEX=3: RoCE v2 IPv4 on mlx5_6:1, mlx5_7:1, mlx5_8:1, "
                                              "mlx5_9:1, mlx5_10:1, mlx5_11:1")
    status, evidence, fix = found["memlock"]
    assert (status, evidence) == ("FAIL", f"RLIMIT_MEMLOCK 8388608 bytes ({fixtures}/proc/pod_defaults/self/limits)")
    assert fix is not None and fix.startswith("security.ipc_lock: true in the cluster file")
    assert found["/dev/shm"][0] == "WARN" and found["/dev/shm"][2].startswith("storage.shm_size")
    assert found["GPUDirect RDMA"][:2] == ("PASS", f"peer memory: {fixtures}/sysfs/sriov_vfs/module/nvidia_peermem")
    # the memlock and /dev/shm warnings of nccl-env are reported once, by their own checks
    assert found["NCCL settings"][0] == "WARN" and "RLIMIT_MEMLOCK" not in found["NCCL settings"][1]
    assert "DOWN" in found["NCCL settings"][1]


def test_the_host_limit_warnings_are_known_by_what_they_are_about_not_by_their_words(fixtures: Path) -> None:
    found = detect_nccl_env({}, sysfs_root=fixtures / "sysfs" / "sriov_vfs",
                            proc_root=fixtures / "proc" / "pod_defaults")
    assert [w.concern for w in found.warned] == [Concern.SETTINGS, Concern.MEMLOCK, Concern.SHM]
    assert found.warnings == [w.text for w in found.warned]  # nccl-env --json and the launcher show every one


def test_no_rdma_port_in_rdma_mode_fails_with_the_fix(fixtures: Path, python: str) -> None:
    found = checks(node(fixtures, "no_rdma", "pod_rdma", python, MLENV_NETWORK_MODE="rdma"))
    status, evidence, fix = found["RDMA ports"]
    assert (status, evidence) == ("FAIL", f"no ACTIVE RDMA port NCCL may use under {fixtures}/sysfs/no_rdma/class/"
                                          "infiniband (found: none)")
    assert fix is not None and "network.rdma.networks and network.rdma.resources" in fix


def test_tcp_mode_checks_no_rdma(fixtures: Path, python: str) -> None:
    report = node(fixtures, "infiniband", "pod_defaults", python, MLENV_NETWORK_MODE="tcp", NCCL_IB_DISABLE="1")
    assert report["facts"]["hca_count"] == 0
    assert not {"RDMA ports", "GID index", "memlock", "GPUDirect RDMA"} & set(checks(report))


def test_torch_that_cannot_be_imported_warns(fixtures: Path, tmp_path: Path) -> None:
    broken = tmp_path / "python-without-torch"
    broken.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n")
    broken.chmod(0o755)
    found = checks(node(fixtures, "no_rdma", "pod_rdma", str(broken)))
    assert found["torch"] == ("WARN", "torch cannot be imported: ModuleNotFoundError: No module named 'torch'",
                              "use an image with PyTorch (image: in the cluster file)")
    slurm = SlurmBackend.torch_fix  # what mlenv doctor passes for Slurm: the fields that backend really uses
    found = checks(node(fixtures, "no_rdma", "pod_rdma", str(broken), MLENV_TORCH_FIX=slurm))
    assert found["torch"][2] == slurm and "slurm.setup" in slurm and "container:" in slurm and "image:" not in slurm


def test_a_master_name_that_does_not_resolve_fails(fixtures: Path, python: str) -> None:
    found = checks(node(fixtures, "no_rdma", "pod_rdma", python, MASTER_ADDR="no-such-master.invalid"))
    assert found["master address"] == ("FAIL", "no-such-master.invalid does not resolve here",
                                       "pod 0 must be running and published by the headless Service "
                                       "(publishNotReadyAddresses); check with: getent hosts no-such-master.invalid")


def test_rendezvous_port_between_two_nodes(fixtures: Path, python: str) -> None:
    port = free_port()
    world = {"MLENV_NUM_NODES": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    reports: dict[int, dict[str, Any]] = {}

    def run(rank: int) -> None:
        reports[rank] = examine({**world, "MLENV_NODE_RANK": str(rank)}, sysfs_root=fixtures / "sysfs" / "no_rdma",
                                proc_root=fixtures / "proc" / "pod_rdma", rendezvous_seconds=20,
                                python=python).to_json()

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert time.monotonic() - started < 15  # node 0 stops listening once node 1 connected
    assert checks(reports[0])["rendezvous port"] == (
        "PASS", f"listened on port {port}: 1 of 1 other nodes connected", None)
    assert checks(reports[1])["rendezvous port"] == ("PASS", f"connected to 127.0.0.1:{port}", None)


def test_rendezvous_port_nobody_listens_on_fails(fixtures: Path, python: str) -> None:
    port = free_port()
    report = examine({"MLENV_NODE_RANK": "1", "MLENV_NUM_NODES": "2", "MASTER_ADDR": "127.0.0.1",
                      "MASTER_PORT": str(port)}, sysfs_root=fixtures / "sysfs" / "no_rdma",
                     proc_root=fixtures / "proc" / "pod_rdma", rendezvous_seconds=1, python=python).to_json()
    status, evidence, fix = checks(report)["rendezvous port"]
    assert (status, evidence) == ("FAIL", f"no connection to 127.0.0.1:{port} within 1 s: Connection refused")
    assert fix == f"let the nodes reach TCP port {port} of node 0 (NetworkPolicy, firewall)"


def test_json_is_one_line_with_the_clock_and_exit_1_on_fail(fixtures: Path, run_runtime: Runner) -> None:
    before = time.time()
    result = run_runtime("doctor", "--json", "--sysfs-root", str(fixtures / "sysfs" / "no_rdma"),
                         "--proc-root", str(fixtures / "proc" / "pod_rdma"),
                         env={**ONE_NODE, "MLENV_NETWORK_MODE": "rdma"}, timeout=120)
    assert result.returncode == 1, result.stderr  # no RDMA port in RDMA mode
    (line,) = result.stdout.splitlines()
    report = json.loads(line)
    assert report["kind"] == KIND and before <= report["clock"] <= time.time()
    assert checks(report)["RDMA ports"][0] == "FAIL"


def test_text_output_lists_every_check_and_its_fix(fixtures: Path, run_runtime: Runner) -> None:
    result = run_runtime("doctor", "--sysfs-root", str(fixtures / "sysfs" / "infiniband"),
                         "--proc-root", str(fixtures / "proc" / "pod_defaults"),
                         env={**ONE_NODE, "MLENV_NETWORK_MODE": "rdma"}, timeout=120)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("PASS  RDMA ports: 4 ACTIVE (800 Gb/s in all)")
    memlock = lines.index(f"FAIL  memlock: RLIMIT_MEMLOCK 8388608 bytes ({fixtures}/proc/pod_defaults/self/limits)")
    assert lines[memlock + 1].startswith("      fix: security.ipc_lock: true")


@pytest.mark.parametrize("args", [["--sysfs-root", "/no/such/sys"], ["--rendezvous", "-1"], ["--bogus"]])
def test_bad_input_is_one_line_and_exit_2(args: list[str], run_runtime: Runner) -> None:
    result = run_runtime("doctor", *args)
    assert (result.returncode, result.stdout) == (2, "")
    assert len(result.stderr.splitlines()) == 1 and "error" in result.stderr


def test_help(run_runtime: Runner) -> None:
    result = run_runtime("doctor", "--help")
    assert result.returncode == 0 and "--rendezvous SECONDS" in result.stdout
