"""The launcher's command lines, and running a job: output copy, node log, exit status, transport check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlenv.runtime.launcher import (
    Job,
    deepspeed_argv,
    default_nproc,
    hostfile_text,
    launch,
    local_address,
    rendezvous_id,
    run_job,
    torchrun_argv,
)
from mlenv.runtime.topology import Topology
from mlenv.runtime.transport import Expectation

NODE0 = Topology(0, 2, 4, "ml-dev-env-0.ml-dev-env-headless", 29500, "mlenv")
NODE1 = Topology(1, 2, 4, "ml-dev-env-0.ml-dev-env-headless", 29500, "mlenv")


def test_torchrun_node0_hosts_the_rendezvous() -> None:
    argv = torchrun_argv(NODE0, 4, ["train.py", "--steps", "5"], rdzv_id="ml-dev-env-1a2b", local_addr="10.128.2.15")
    assert argv == [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "4",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "ml-dev-env-0.ml-dev-env-headless:29500",
        "--rdzv-id", "ml-dev-env-1a2b", "--rdzv-conf", "is_host=true", "--max-restarts", "0",
        "--local-addr", "10.128.2.15", "train.py", "--steps", "5",
    ]


def test_torchrun_other_nodes_join_and_ipv6_endpoints_are_bracketed() -> None:
    topology = Topology(1, 2, None, "fd00::5", 29400, "mlenv")
    argv = torchrun_argv(topology, 2, ["t.py"], rdzv_id="r", local_addr=None)
    assert argv[argv.index("--rdzv-conf") + 1] == "is_host=false"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "[fd00::5]:29400"
    assert "--local-addr" not in argv


def test_deepspeed_without_ssh() -> None:
    argv = deepspeed_argv(NODE1, 4, ["train.py", "--steps", "5"], hostfile=Path("/run/hostfile.node1"))
    assert argv == [
        sys.executable, "-m", "deepspeed.launcher.runner", "--no_ssh", "--node_rank", "1", "--num_nodes", "2",
        "--num_gpus", "4", "--master_addr", "ml-dev-env-0.ml-dev-env-headless", "--master_port", "29500",
        "--hostfile", "/run/hostfile.node1", "train.py", "--steps", "5",
    ]


def test_hostfile_lists_every_node() -> None:
    assert hostfile_text(3, 8) == "node-0 slots=8\nnode-1 slots=8\nnode-2 slots=8\n"


def test_rendezvous_id_is_the_same_on_every_node() -> None:
    assert rendezvous_id({}, NODE0) == rendezvous_id({}, NODE1)
    assert rendezvous_id({}, NODE0).startswith("ml-dev-env-")
    assert rendezvous_id({"MLENV_APP_NAME": "llm"}, NODE0).startswith("llm-")
    other_port = Topology(0, 2, 4, NODE0.master_addr, 29501, "mlenv")
    assert rendezvous_id({}, other_port) != rendezvous_id({}, NODE0)
    assert rendezvous_id({"MLENV_RUN_ID": "run-42"}, NODE0) == "run-42"


def test_default_nproc(tmp_path: Path) -> None:
    cpu_only = Topology(0, 1, None, "127.0.0.1", 29500, "single")
    assert default_nproc(cpu_only, {}, tmp_path) == 1
    assert default_nproc(NODE0, {"CUDA_VISIBLE_DEVICES": "0,1"}, tmp_path) == 4  # the topology says 4
    assert default_nproc(cpu_only, {"CUDA_VISIBLE_DEVICES": "0,1,2"}, tmp_path) == 3
    for gpu in ("0000:18:00.0", "0000:2a:00.0"):
        (tmp_path / "driver" / "nvidia" / "gpus" / gpu).mkdir(parents=True)
    assert default_nproc(cpu_only, {}, tmp_path) == 2


def test_local_address_towards_the_master() -> None:
    assert local_address("127.0.0.1", 29500) == "127.0.0.1"
    assert local_address("no-such-host.invalid", 29500) is None


ANY = Expectation("any", explicit=False)


def python_job(code: str, expected: Expectation = ANY, env: dict[str, str] | None = None) -> Job:
    return Job([sys.executable, "-c", code], {"PYTHONUNBUFFERED": "1", **(env or {})}, {}, {}, expected)


def test_run_job_copies_output_to_the_node_log_and_returns_the_exit_status(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "node0.log"
    status = run_job(python_job("import sys; print('step 1/2 loss 0.5'); sys.stderr.write('oops\\n'); sys.exit(3)"),
                     log)
    assert status == 3
    assert log.read_text() == "step 1/2 loss 0.5\noops\n"
    assert "step 1/2 loss 0.5" in capfd.readouterr().out


def test_run_job_also_feeds_the_container_log(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    container_log = tmp_path / "pid1-stdout"  # stands for /proc/1/fd/1 in a pod: a pipe read by the runtime
    os.mkfifo(container_log)
    reader = subprocess.Popen(["cat", str(container_log)], stdout=subprocess.PIPE, text=True)
    job = Job([sys.executable, "-c", "print('step 1/2 loss 0.5')"],
              {"PYTHONUNBUFFERED": "1", "MLENV_CONTAINER_LOG": str(container_log)}, {}, {}, ANY)
    assert run_job(job) == 0
    assert reader.communicate(timeout=10)[0] == "step 1/2 loss 0.5\n"
    assert "step 1/2 loss 0.5" in capfd.readouterr().out


def test_an_unwritable_container_log_only_warns(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    job = Job([sys.executable, "-c", "print('ok')"],
              {"MLENV_CONTAINER_LOG": str(tmp_path / "missing" / "stdout")}, {}, {}, ANY)
    assert run_job(job) == 0
    captured = capfd.readouterr()
    assert captured.out == "ok\n" and "not copying output to the container log" in captured.err


def test_run_job_reports_death_by_signal_like_a_shell() -> None:
    assert run_job(python_job("import os, signal; os.kill(os.getpid(), signal.SIGTERM)")) == 128 + 15


SOCKET_LINES = (
    "print('n0:7:7 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>'); "
    "print('n0:7:7 [0] NCCL INFO Using network Socket')"
)


RDMA_DEFAULT = Expectation("rdma", explicit=False)
RDMA_ASKED = Expectation("rdma", explicit=True)


def test_rdma_expected_but_sockets_used_fails_the_job(capfd: pytest.CaptureFixture[str]) -> None:
    assert run_job(python_job(SOCKET_LINES, RDMA_DEFAULT)) == 1
    assert "error: expected rdma, the log shows SOCKETS (NCCL chose NET/Socket)" in capfd.readouterr().err


def test_rdma_used_passes(capfd: pytest.CaptureFixture[str]) -> None:
    rdma = SOCKET_LINES.replace("NET/Socket : Using [0]eth0:10.0.0.5<0>", "NET/IB : Using [0]mlx5_0:1/IB")
    assert run_job(python_job(rdma.replace("network Socket", "network IB"), RDMA_DEFAULT)) == 0
    assert "mlenv: RDMA (no GDR), as expected" in capfd.readouterr().err


def test_a_failed_job_keeps_its_own_status_even_on_sockets() -> None:
    assert run_job(python_job(SOCKET_LINES + "; raise SystemExit(7)", RDMA_DEFAULT)) == 7


def test_nothing_proven_fails_an_explicit_expectation(capfd: pytest.CaptureFixture[str]) -> None:
    assert run_job(python_job("print('step 1/2 loss 0.5')", RDMA_ASKED)) == 1
    assert ("error: could not prove rdma: no NCCL lines in the output: the job may not use NCCL"
            in capfd.readouterr().err)


@pytest.mark.parametrize(("env", "why"), [
    ({}, "no NCCL lines in the output: the job may not use NCCL"),
    ({"NCCL_DEBUG": "WARN"}, "NCCL_DEBUG=WARN hides the INFO lines that name the transport"),
    ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p"}, "NCCL_DEBUG_FILE=/tmp/nccl.%h.%p sends NCCL's "
                                                                   "lines to a file, not to the output"),
])
def test_nothing_proven_under_the_rdma_mode_default_only_warns(env: dict[str, str], why: str,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    assert run_job(python_job("print('step 1/2 loss 0.5')", RDMA_DEFAULT, env)) == 0
    assert f"mlenv: warning: could not prove rdma: {why}" in capfd.readouterr().err


def test_any_reports_the_verdict_and_keeps_the_exit_code(capfd: pytest.CaptureFixture[str]) -> None:
    assert run_job(python_job(SOCKET_LINES + "; raise SystemExit(3)")) == 3
    assert "mlenv: NCCL transport: SOCKETS" in capfd.readouterr().err


def test_rdma_mode_refuses_to_start_without_an_active_port(tmp_path: Path, fixtures: Path,
                                                           capfd: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "started"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    env = {"MLENV_NODE_RANK": "0", "MLENV_NUM_NODES": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561",
           "MLENV_NETWORK_MODE": "rdma", "PATH": os.environ["PATH"]}
    status = launch([str(script)], launcher="torchrun", environ=env, nproc=1, sysfs_root=fixtures / "sysfs/ib_down")
    assert (status, marker.exists()) == (1, False)
    assert ("not starting the job (--expect-transport any starts it anyway)" in capfd.readouterr().err)
