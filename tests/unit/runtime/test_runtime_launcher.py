"""The launcher's command lines, and running a job under the supervisor: tagged lines, node log, the rank's exit
status, transport check."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlenv.runtime.node.topology import Topology
from mlenv.runtime.records.runlayout import NodeDir, read_ranks, read_state
from mlenv.runtime.supervise.launcher import (
    RUNTIME_PARENT,
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
from mlenv.runtime.watch.transportproof import Expectation, TransportProof

NODE0 = Topology(0, 2, 4, "ml-dev-env-0.ml-dev-env-headless", 29500, "mlenv")
NODE1 = Topology(1, 2, 4, "ml-dev-env-0.ml-dev-env-headless", 29500, "mlenv")


def test_torchrun_node0_hosts_the_rendezvous() -> None:
    argv = torchrun_argv(NODE0, 4, ["train.py", "--steps", "5"], rdzv_id="ml-dev-env-1a2b", local_addr="10.128.2.15")
    assert argv == [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "4",
        "--rdzv-backend", "static", "--rdzv-endpoint", "ml-dev-env-0.ml-dev-env-headless:29500",
        "--rdzv-id", "ml-dev-env-1a2b", "--node-rank", "0", "--max-restarts", "0",
        "--local-addr", "10.128.2.15", "-m", "mlenv.runtime.rank", "train.py", "--steps", "5",
    ]


def test_torchrun_other_nodes_keep_their_rank_and_ipv6_endpoints_are_bracketed() -> None:
    topology = Topology(1, 2, None, "fd00::5", 29400, "mlenv")
    argv = torchrun_argv(topology, 2, ["t.py"], rdzv_id="r", local_addr=None)
    assert argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "[fd00::5]:29400"
    assert "--local-addr" not in argv


def test_deepspeed_without_ssh() -> None:
    argv = deepspeed_argv(NODE1, 4, ["train.py", "--steps", "5"], hostfile=Path("/run/hostfile.node1"))
    assert argv == [
        sys.executable, "-m", "deepspeed.launcher.runner", "--no_ssh", "--node_rank", "1", "--num_nodes", "2",
        "--num_gpus", "4", "--master_addr", "ml-dev-env-0.ml-dev-env-headless", "--master_port", "29500",
        "--hostfile", "/run/hostfile.node1", "--module", "mlenv.runtime.rank", "train.py", "--steps", "5",
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


LAUNCHER = """
import os, subprocess, sys
script, nproc = sys.argv[1], int(sys.argv[2])
ranks = [subprocess.Popen([sys.executable, "-m", "mlenv.runtime.rank", script],
                          env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(nproc)]
codes = [rank.wait() for rank in ranks]
sys.exit(next((c for c in codes if c), 0) and 1)
"""
"""A launcher as small as can be: ``nproc`` ranks through the wrapper, exit 1 when one failed (as torchrun)."""


def python_job(tmp_path: Path, code: str, nproc: int = 1, env: dict[str, str] | None = None) -> Job:
    script = tmp_path / "job.py"
    script.write_text(code)
    return Job([sys.executable, "-c", LAUNCHER, str(script), str(nproc)],
               {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": RUNTIME_PARENT, **(env or {})}, {}, {})


ANY = Expectation("any", explicit=False)


def run(job: Job, tmp_path: Path, log: Path | None = None, expected: Expectation = ANY,
        env: dict[str, str] | None = None) -> int:
    proof = TransportProof(expected, {**job.env, **(env or {})})
    return run_job(job, log, node_dir=NodeDir(tmp_path / "run", 0, 0), observers=[proof])


def test_run_job_copies_tagged_lines_to_the_node_log_and_returns_the_rank_s_exit_status(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "output.log"
    job = python_job(tmp_path, "import sys; print('step 1/2 loss 0.5'); sys.stderr.write('oops\\n'); sys.exit(3)")
    assert run(job, tmp_path, log) == 3  # the rank's own code, not the launcher's 1
    lines = log.read_text().splitlines()
    assert lines[:2] == ["[node-0 r0] step 1/2 loss 0.5", "[node-0 r0] oops"]
    assert lines[2].startswith("mlenv: rank 0 (node-0, pid ") and " exited with 3 first; last lines: " in lines[2]
    assert "[node-0 r0] step 1/2 loss 0.5" in capfd.readouterr().out


def test_run_job_also_feeds_the_container_log(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    container_log = tmp_path / "pid1-stdout"  # stands for /proc/1/fd/1 in a pod: a pipe read by the runtime
    os.mkfifo(container_log)
    reader = subprocess.Popen(["cat", str(container_log)], stdout=subprocess.PIPE, text=True)
    job = python_job(tmp_path, "print('step 1/2 loss 0.5')", env={"MLENV_CONTAINER_LOG": str(container_log)})
    assert run(job, tmp_path) == 0
    assert reader.communicate(timeout=10)[0] == "[node-0 r0] step 1/2 loss 0.5\n"
    assert "[node-0 r0] step 1/2 loss 0.5" in capfd.readouterr().out


def test_an_unwritable_container_log_only_warns(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    job = python_job(tmp_path, "print('ok')", env={"MLENV_CONTAINER_LOG": str(tmp_path / "missing" / "stdout")})
    assert run(job, tmp_path) == 0
    captured = capfd.readouterr()
    assert captured.out == "[node-0 r0] ok\n" and "not copying output to the container log" in captured.err


def test_a_rank_killed_by_a_signal_is_named_and_exits_like_a_shell(tmp_path: Path) -> None:
    assert run(python_job(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"), tmp_path) == 128 + 15
    node_dir = NodeDir(tmp_path / "run", 0, 0)
    (rank,) = read_ranks(node_dir)
    assert (rank.state, rank.exit_code, rank.signal) == ("failed", 143, "SIGTERM")
    assert read_state(node_dir)["first_failure"]["reason"] == "killed by SIGTERM"


STOP_MY_SUPERVISOR = """
import os, pathlib, signal, time
mark = os.environ.get("MLENV_PREEMPTED_MARK")
if mark and os.environ["TAKEN_AWAY"] == "1":
    pathlib.Path(mark).write_text("now")  # as the pod's PID 1 does before it passes a pod deletion's SIGTERM on
os.kill(int(os.environ["SUPERVISOR_PID"]), signal.SIGTERM)
time.sleep(30)
"""


@pytest.mark.parametrize(("taken_away", "state", "reason"), [
    ("1", "preempted", "preempted: the pod of node-0 was deleted or evicted"),
    ("0", "stopped", "stopped by SIGTERM"),
])
def test_a_stop_while_the_pod_is_taken_away_is_a_preemption_else_the_user_s(
    taken_away: str, state: str, reason: str, tmp_path: Path
) -> None:
    env = {"MLENV_PREEMPTED_MARK": str(tmp_path / "mark"), "SUPERVISOR_PID": str(os.getpid()),
           "TAKEN_AWAY": taken_away}
    assert run(python_job(tmp_path, STOP_MY_SUPERVISOR, env=env), tmp_path) == 128 + 15
    recorded = read_state(NodeDir(tmp_path / "run", 0, 0))
    assert (recorded["state"], recorded["reason"]) == (state, reason)
    assert recorded["first_failure"] is None  # neither is a failure


SOCKET_LINES = (  # as NCCL prints them in the rank's own process
    "import os; print(f'n0:{os.getpid()}:7 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>'); "
    "print(f'n0:{os.getpid()}:7 [0] NCCL INFO Using network Socket')"
)


RDMA_DEFAULT = Expectation("rdma", explicit=False)
RDMA_ASKED = Expectation("rdma", explicit=True)


def test_rdma_expected_but_sockets_used_stops_the_job_while_it_runs(tmp_path: Path,
                                                                   capfd: pytest.CaptureFixture[str]) -> None:
    job = python_job(tmp_path, SOCKET_LINES + "; import time; time.sleep(120)")
    started = time.monotonic()
    assert run(job, tmp_path, expected=RDMA_DEFAULT) == 1
    assert time.monotonic() - started < 60
    err = capfd.readouterr().err
    assert "mlenv: node-0: SOCKETS via eth0 (NET/Socket): NCCL chose NET/Socket" in err
    assert "error: NCCL uses SOCKETS but --expect-transport is rdma: NCCL chose NET/Socket (evidence: rank0:1" in err
    state = read_state(NodeDir(tmp_path / "run", 0, 0))
    assert state["transport"] == {"verdict": "SOCKETS", "plugin": "NET/Socket", "devices": ["eth0:10.0.0.5"],
                                  "nccl_version": None}
    assert state["state"] == "failed" and "NCCL uses SOCKETS" in state["reason"]


def test_rdma_used_passes(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    rdma = SOCKET_LINES.replace("NET/Socket : Using [0]eth0:10.0.0.5<0>", "NET/IB : Using [0]mlx5_0:1/IB")
    assert run(python_job(tmp_path, rdma.replace("network Socket", "network IB")), tmp_path,
               expected=RDMA_DEFAULT) == 0
    assert "mlenv: RDMA (GDR not shown), as expected" in capfd.readouterr().err
    assert read_state(NodeDir(tmp_path / "run", 0, 0))["transport"]["verdict"] == "RDMA (GDR not shown)"


def test_an_old_log_printed_by_a_rank_stops_nothing_and_a_child_s_nccl_lines_count(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "old.log"
    old.write_text("node1:123:456 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>\n"
                   "node1:123:456 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n")
    # NCCL in a child of the rank (a container it starts) prints, then trains on: the proof reads the child's
    # ancestry in /proc while it lives (a line whose process is gone cannot be told from an old log's)
    child = ("import os, time; print(f'n0:{os.getpid()}:9 [0] NCCL INFO Using network IB', flush=True); "
             "time.sleep(3)")
    code = (f"import subprocess, sys; print(open({str(old)!r}).read(), flush=True); "
            f"subprocess.run([sys.executable, '-c', {child!r}], check=True)")
    assert run(python_job(tmp_path, code), tmp_path, expected=RDMA_ASKED) == 0
    err = capfd.readouterr().err
    assert "SOCKETS" not in err and "mlenv: RDMA (GDR not shown), as expected" in err
    assert read_state(NodeDir(tmp_path / "run", 0, 0))["transport"]["verdict"] == "RDMA (GDR not shown)"


def test_nothing_proven_fails_an_explicit_expectation(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert run(python_job(tmp_path, "print('step 1/2 loss 0.5')"), tmp_path, expected=RDMA_ASKED) == 1
    assert ("error: could not prove rdma: no NCCL lines in the output: the job may not use NCCL"
            in capfd.readouterr().err)


def test_a_failed_job_keeps_its_own_status(tmp_path: Path) -> None:
    assert run(python_job(tmp_path, "raise SystemExit(7)"), tmp_path, expected=RDMA_ASKED) == 7


@pytest.mark.parametrize(("env", "why"), [
    ({}, "no NCCL lines in the output: the job may not use NCCL"),
    ({"NCCL_DEBUG": "WARN"}, "NCCL_DEBUG=WARN hides the INFO lines that name the transport"),
    ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p"}, "NCCL_DEBUG_FILE=/tmp/nccl.%h.%p sends NCCL's "
                                                                   "lines to a file, not to the output"),
])
def test_nothing_proven_under_the_rdma_mode_default_only_warns(env: dict[str, str], why: str, tmp_path: Path,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    assert run(python_job(tmp_path, "print('step 1/2 loss 0.5')"), tmp_path, expected=RDMA_DEFAULT, env=env) == 0
    assert f"mlenv: warning: could not prove rdma: {why}" in capfd.readouterr().err


def test_any_reports_the_verdict_and_keeps_the_exit_code(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert run(python_job(tmp_path, SOCKET_LINES + "; raise SystemExit(3)"), tmp_path) == 3
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


def test_the_rank_wrapper_without_a_supervisor_runs_the_script_with_deepspeed_s_argument_after_it(
        tmp_path: Path) -> None:
    script = tmp_path / "args.py"
    script.write_text("import sys; print(sys.argv[1:]); sys.exit(4)")
    env = {**os.environ, "PYTHONPATH": RUNTIME_PARENT, "MLENV_SUPERVISOR_SOCKET": str(tmp_path / "gone")}
    result = subprocess.run([sys.executable, "-m", "mlenv.runtime.rank", "--local_rank=1", str(script), "a"],
                            env=env, capture_output=True, text=True, timeout=60, check=False)
    assert (result.returncode, result.stdout) == (4, "['--local_rank=1', 'a']\n")
