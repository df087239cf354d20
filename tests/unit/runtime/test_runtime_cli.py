"""``python -m mlenv.runtime``: help, JSON shapes, exit statuses, and one-line errors for bad input."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_support import Runner

from tests._prereq import clean_environ


@pytest.mark.parametrize("command", [[], ["topology"], ["nccl-env"], ["launch"], ["nccl-log-check"], ["jobs"],
                                     ["stop"], ["logs"], ["doctor"], ["launchable"]])
def test_every_command_has_help(command: list[str], run_runtime: Runner) -> None:
    result = run_runtime(*command, "--help")
    assert (result.returncode, result.stderr) == (0, "")
    assert result.stdout.startswith("usage: python3 -m mlenv.runtime")


BAD_INPUT = {
    "unknown command": (["bogus"], {}),
    "rank not a number": (["topology"], {"MLENV_NODE_RANK": "x", "MLENV_NUM_NODES": "2"}),
    "rank outside the job": (["topology", "--json"], {"MLENV_NODE_RANK": "3", "MLENV_NUM_NODES": "2"}),
    "missing sysfs root": (["nccl-env", "--sysfs-root", "/no/such/sys"], {}),
    "two output formats": (["nccl-env", "--json", "--shell"], {}),
    "launch without a job": (["launch", "--nproc", "2", "--"], {}),
    "zero processes": (["launch", "--nproc", "0", "--", "train.py"], {}),
    "unknown launcher": (["launch", "--launcher", "mpirun", "--", "train.py"], {}),
    "unknown launcher from the environment": (["launch", "--", "train.py"], {"MLENV_LAUNCHER": "mpirun"}),
    "launch a script that is not there": (["launch", "--", "no_such_train.py"], {}),
    "launch on a node that does not know its rank": (["launch", "--", __file__], {"MLENV_NUM_NODES": "2"}),
    "missing log file": (["nccl-log-check", "/no/such/nccl.log"], {}),
    "no log file": (["nccl-log-check"], {}),
    "unknown expectation": (["nccl-log-check", "-", "--expect", "ib"], {}),
    "unknown transport to expect": (["launch", "--expect-transport", "fast", "--", __file__], {}),
    "a directory as a log": (["nccl-log-check", "/"], {}),
    "detach without a run directory": (["launch", "--detach", "--", __file__], {}),
    "detach and dry run": (["launch", "--detach", "--dry-run", "--run-dir", "/tmp", "--", __file__], {}),
    "negative grace": (["stop", "--grace", "-1"], {}),
    "grace not a number": (["stop", "--grace", "soon"], {}),
    "run id that is a path": (["stop", "--run", "../other"], {}),
    "logs of a run that is not there": (["logs", "--run", "no-such-run", "--runs-root", "/no/such/root"], {}),
}


@pytest.mark.parametrize(("args", "env"), BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_is_one_line_and_exit_2(args: list[str], env: dict[str, str], run_runtime: Runner) -> None:
    result = run_runtime(*args, env=env)
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "error" in result.stderr and "Traceback" not in result.stderr


def test_topology_json(run_runtime: Runner) -> None:
    env = {"MLENV_NODE_RANK": "1", "MLENV_NUM_NODES": "2", "MLENV_PROCS_PER_NODE": "4",
           "MASTER_ADDR": "ml-dev-env-0.ml-dev-env-headless", "MASTER_PORT": "29500"}
    result = run_runtime("topology", "--json", env=env)
    assert json.loads(result.stdout) == {"node_rank": 1, "num_nodes": 2, "procs_per_node": 4,
                                         "master_addr": "ml-dev-env-0.ml-dev-env-headless", "master_port": 29500,
                                         "source": "mlenv"}


def test_nccl_env_json(run_runtime: Runner, fixtures: Path) -> None:
    result = run_runtime("nccl-env", "--json", "--sysfs-root", str(fixtures / "sysfs/sriov_vfs"),
                         "--proc-root", str(fixtures / "proc/pod_defaults"), "--master-addr", "192.168.20.7")
    found = json.loads(result.stdout)
    assert (result.returncode, result.stderr) == (0, "")
    assert set(found) == {"env", "unset", "warnings"}
    assert found["env"]["NCCL_SOCKET_IFNAME"] == "net1"
    assert [w.split(" ")[0] for w in found["warnings"]] == ["RDMA", "RLIMIT_MEMLOCK", "/dev/shm"]


def test_nccl_env_shell_output_evaluates_in_bash(run_runtime: Runner, fixtures: Path) -> None:
    command = [sys.executable, "-m", "mlenv.runtime", "nccl-env", "--shell",
               "--sysfs-root", str(fixtures / "sysfs/roce_bond"), "--proc-root", str(fixtures / "proc/pod_rdma")]
    script = f'eval "$({shlex.join(command)} 2>/dev/null)"; echo "$NCCL_IB_HCA $NCCL_IB_GID_INDEX $GLOO_SOCKET_IFNAME"'
    env = clean_environ({"MASTER_ADDR": "10.128.3.22", "MLENV_NODE_RANK": "1", "MLENV_NUM_NODES": "2"})
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True)
    assert result.stdout == "=mlx5_bond_0 7 eth0\n"


def test_gdr_level_auto_is_detected_or_removed(run_runtime: Runner, fixtures: Path) -> None:
    """The cluster file's ``gdr_level: auto`` arrives as NCCL_NET_GDR_LEVEL=auto, which NCCL must never see."""
    def shell(sysfs: str) -> list[str]:
        result = run_runtime("nccl-env", "--shell", "--sysfs-root", str(fixtures / "sysfs" / sysfs),
                             "--proc-root", str(fixtures / "proc/pod_rdma"), "--master-addr", "127.0.0.1",
                             env={"NCCL_NET_GDR_LEVEL": "auto"})
        assert result.returncode == 0, result.stderr
        return [line for line in result.stdout.splitlines() if "GDR" in line]

    assert shell("gdr_pxb") == ["export NCCL_NET_GDR_LEVEL=PXB"]
    assert shell("gdr_no_peermem") == ["unset NCCL_NET_GDR_LEVEL"]


def test_nccl_env_explain_goes_to_stderr(run_runtime: Runner, fixtures: Path) -> None:
    result = run_runtime("nccl-env", "--explain", "--sysfs-root", str(fixtures / "sysfs/no_rdma"),
                         "--master-addr", "127.0.0.1")
    assert result.stdout == "NCCL_IB_DISABLE=1\nNCCL_SOCKET_IFNAME=lo\nGLOO_SOCKET_IFNAME=lo\n"
    assert "NCCL_SOCKET_IFNAME=lo: master 127.0.0.1 is a loopback address" in result.stderr


@pytest.mark.parametrize(("log", "expect", "status", "verdict"), [
    ("roce_gdrdma", "rdma", 0, "RDMA+GDR"),
    ("ib_no_gdr", "rdma", 0, "RDMA (no GDR)"),
    ("socket_fallback", "rdma", 1, "SOCKETS"),
    ("socket_fallback", "sockets", 0, "SOCKETS"),
    ("roce_gdrdma", "sockets", 1, "RDMA+GDR"),
    ("socket_fallback", "any", 0, "SOCKETS"),
])
def test_nccl_log_check(log: str, expect: str, status: int, verdict: str, run_runtime: Runner,
                        fixtures: Path) -> None:
    result = run_runtime("nccl-log-check", str(fixtures / "nccl_logs" / f"{log}.log"), "--expect", expect)
    assert result.returncode == status
    assert result.stdout.splitlines()[-1] == f"verdict: {verdict}"
    assert ("error: expected" in result.stderr) is bool(status)


@pytest.mark.parametrize(("name", "expect", "status", "message"), [
    ("awsofi889_efa_timestamps_2.21.5.log", "rdma", 1, "error: could not prove rdma: NCCL named no network"),
    ("awsofi889_efa_timestamps_2.21.5.log", "sockets", 1, "error: could not prove sockets: NCCL named no network"),
    ("nccltests213_single_node_nnodes1_2.19.log", "rdma", 0,
     "mlenv: INTRA-NODE: a single node, no network was used, nothing to prove"),
    ("nccltests213_single_node_nnodes1_2.19.log", "sockets", 0, "mlenv: INTRA-NODE"),
    ("nccl226_socket_many_hosts_2.4.log", "rdma", 1, "error: expected rdma, the log shows SOCKETS"),
    ("awsofi24_efa_ring_2.4.log", "sockets", 1, "error: expected sockets, the log shows RDMA (no GDR)"),
])
def test_nccl_log_check_never_passes_what_it_cannot_prove(name: str, expect: str, status: int, message: str,
                                                          run_runtime: Runner, fixtures: Path) -> None:
    result = run_runtime("nccl-log-check", str(fixtures / "nccl_logs" / "corpus" / name), "--expect", expect)
    assert result.returncode == status
    assert message in result.stderr


def test_nccl_log_check_names_every_node(run_runtime: Runner, fixtures: Path) -> None:
    result = run_runtime("nccl-log-check", str(fixtures / "nccl_logs" / "corpus" / "nccl687_ib_2.11.4.log"))
    assert result.returncode == 0
    assert "cosmos-hpc-100a45: RDMA+GDR via mlx5_10..13 (NET/IB, NCCL 2.11.4)" in result.stdout.splitlines()


def test_nccl_log_check_json_from_stdin(run_runtime: Runner, fixtures: Path) -> None:
    log = (fixtures / "nccl_logs" / "ib_no_gdr.log").read_text()
    found = json.loads(run_runtime("nccl-log-check", "-", "--json", stdin=log).stdout)
    assert set(found) == {"verdict", "reason", "plugin", "devices", "nccl_version", "evidence", "nodes", "ranks"}
    assert (found["verdict"], found["plugin"], found["nccl_version"]) == ("RDMA (no GDR)", "NET/IB", "2.19.3+cuda12.2")
    assert found["devices"] == ["mlx5_0:1/IB", "mlx5_1:1/IB"]
    assert found["evidence"][0].startswith("-:")
    assert found["nodes"]["gpu-a17"]["verdict"] == "RDMA (no GDR)"
    assert [r["rank"] for r in found["ranks"]] == [0, 1]


NODE1 = {"MLENV_NODE_RANK": "1", "MLENV_NUM_NODES": "2", "MLENV_PROCS_PER_NODE": "2", "MASTER_ADDR": "127.0.0.1",
         "MASTER_PORT": "29555", "MLENV_RUN_ID": "run-7"}


def test_launchable_says_whether_the_script_is_there_and_what_this_python_lacks(tmp_path: Path) -> None:
    """Run by a Python without site-packages (so without torch and DeepSpeed), from the workspace."""
    (tmp_path / "train.py").write_text("")
    env = clean_environ({"PYTHONPATH": str(Path(__file__).resolve().parents[3] / "tools"),
                         "MLENV_TORCH_FIX": "make install-train"})
    said = {}
    for script in ("train.py", "nowhere.py"):
        done = subprocess.run([sys.executable, "-S", "-m", "mlenv.runtime", "launchable", "--launcher", "deepspeed",
                               "--", script], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
        said[script] = json.loads(done.stdout)
    assert said["train.py"] == {"kind": "mlenv-launchable", "python": sys.executable, "script": True,
                                "missing": ["torch", "deepspeed"], "fix": "make install-train"}
    assert said["nowhere.py"]["script"] is False


def test_launch_dry_run_torchrun(run_runtime: Runner) -> None:
    result = run_runtime("launch", "--dry-run", "--", __file__, "--steps", "3", env=NODE1)
    assert result.returncode == 0
    *variables, command = result.stdout.splitlines()
    assert variables == ["GLOO_SOCKET_IFNAME=lo", "NCCL_IB_DISABLE=1", "NCCL_SOCKET_IFNAME=lo", "PYTHONUNBUFFERED=1",
                         "TORCH_FR_BUFFER_SIZE=2000", "TORCH_NCCL_DUMP_ON_TIMEOUT=1"]
    assert shlex.split(command)[1:] == [
        "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "static",
        "--rdzv-endpoint", "127.0.0.1:29555", "--rdzv-id", "run-7", "--node-rank", "1",
        "--max-restarts", "0", "--local-addr", "127.0.0.1", "-m", "mlenv.runtime.rank", __file__, "--steps", "3",
    ]
    assert "mlenv: node 1/2 (mlenv), 2 processes, master 127.0.0.1:29555" in result.stderr


def test_launch_dry_run_deepspeed_in_rdma_mode(run_runtime: Runner, tmp_path: Path) -> None:
    env = {**NODE1, "MLENV_NETWORK_MODE": "rdma", "MLENV_RUN_DIR": str(tmp_path)}
    result = run_runtime("launch", "--launcher", "deepspeed", "--nproc", "3", "--dry-run", "--", __file__, env=env)
    *variables, command = result.stdout.splitlines()
    assert "NCCL_DEBUG=INFO" in variables  # the transport check needs NCCL's INFO lines
    assert shlex.split(command)[1:] == [
        "-m", "deepspeed.launcher.runner", "--no_ssh", "--node_rank", "1", "--num_nodes", "2", "--num_gpus", "3",
        "--master_addr", "127.0.0.1", "--master_port", "29555",
        "--hostfile", str(tmp_path / "attempt-0" / "node1" / "hostfile.node1"), "--module", "mlenv.runtime.rank",
        __file__,
    ]
    assert list(tmp_path.iterdir()) == []  # a dry run writes nothing


def test_launch_into_an_unwritable_run_directory_fails_in_one_line(run_runtime: Runner, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_runtime("launch", "--run-dir", str(blocker / "run"), "--", __file__, env=NODE1)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith("mlenv.runtime launch: failed: ")
    assert "Traceback" not in result.stderr
