"""Real launches through ``python -m mlenv.runtime launch``: two "nodes" x two processes on loopback.
(The DeepSpeed launch runs once in the suite, in tests/integration/test_demo.py.)

Each node is its own process tree with its own MLENV_NODE_RANK, as on two pods; both reach the
master at 127.0.0.1 on a port of their own. Training runs on CPU with gloo.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from _prereq import clean_environ, require

ROOT = Path(__file__).resolve().parents[2]
WORKSPACE = ROOT / "workspace"
TRAIN = str(WORKSPACE / "train_multi_node.py")
# Not anchored to line starts: other processes of a node share its pipe, and not all write whole lines.
DONE = re.compile(r"\bdone steps=(\d+) first_loss=([\d.]+) last_loss=([\d.]+) world_size=(\d+)")


@dataclass(frozen=True)
class NodeResult:
    status: int
    out: str
    err: str


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def node_env(rank: int, nodes: int, nproc: int, port: int, run_dir: Path, **extra: str) -> dict[str, str]:
    """The env contract a backend gives each node, on top of a clean environment."""
    base = clean_environ()
    return {
        **base,
        "MLENV_NODE_RANK": str(rank), "MLENV_NUM_NODES": str(nodes), "MLENV_PROCS_PER_NODE": str(nproc),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "MLENV_RUN_ID": f"test-{port}",
        "MLENV_RUN_DIR": str(run_dir), "OMP_NUM_THREADS": "1",
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), base.get("PATH", os.defpath)]),
        **extra,
    }  # fmt: skip


@contextmanager
def running(commands: list[tuple[list[str], dict[str, str]]], logs: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Start each command in its own process group; kill what is left of each group at the end."""
    processes = []
    try:
        for n, (argv, env) in enumerate(commands):
            with (logs / f"{n}.out").open("w") as out, (logs / f"{n}.err").open("w") as err:
                processes.append(subprocess.Popen(argv, env=env, cwd=WORKSPACE, stdout=out, stderr=err, text=True,
                                                  start_new_session=True))
        yield processes
    finally:
        for process in processes:
            with suppress(ProcessLookupError):  # the group our child leads: torchrun/DeepSpeed and workers
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def launch_nodes(tmp_path: Path, launcher: str, job: list[str], *, nodes: int = 2, nproc: int = 2,
                 timeout: float = 240, **extra: str) -> list[NodeResult]:
    """Run ``launch`` as every node of a job and wait for all of them."""
    port, run_dir = free_port(), tmp_path / "run"
    argv = [sys.executable, "-m", "mlenv.runtime", "launch", "--launcher", launcher, "--", *job]
    commands = [(argv, node_env(rank, nodes, nproc, port, run_dir, **extra)) for rank in range(nodes)]
    with running(commands, tmp_path) as processes:
        statuses = [process.wait(timeout=timeout) for process in processes]
    return [NodeResult(status, (tmp_path / f"{n}.out").read_text(), (tmp_path / f"{n}.err").read_text())
            for n, status in enumerate(statuses)]


def check_training(results: list[NodeResult], run_dir: Path) -> str:
    """Both nodes succeeded, four ranks reported in, the loss fell; returns the joined output."""
    assert [r.status for r in results] == [0, 0], [r.err[-3000:] for r in results]
    output = "".join(r.out for r in results)
    ranks = [re.findall(r"\brank (\d)/4 local_rank (\d) ", r.out) for r in results]
    assert [sorted(local for _, local in node) for node in ranks] == [["0", "1"], ["0", "1"]]
    assert sorted(rank for node in ranks for rank, _ in node) == ["0", "1", "2", "3"]
    (done,) = DONE.findall(output)
    steps, first, last, world = int(done[0]), float(done[1]), float(done[2]), int(done[3])
    assert (steps, world) == (30, 4)
    assert last < first / 4, done
    losses = [float(x) for x in re.findall(r"\bstep \d+/30 loss (\d+\.\d{4})", output)]
    assert len(losses) == 4 and losses == sorted(losses, reverse=True)
    for rank in (0, 1):  # each node wrote its own log
        assert "local_rank" in (run_dir / f"node{rank}.log").read_text()
    return output


def test_torchrun_two_nodes_train_to_a_falling_loss(tmp_path: Path) -> None:
    require("torch")
    results = launch_nodes(tmp_path, "torchrun", [TRAIN, "--engine", "ddp"])
    output = check_training(results, tmp_path / "run")
    assert "engine ddp backend gloo world_size 4" in output
    assert "--rdzv-conf is_host=true" in results[0].err and "--rdzv-conf is_host=false" in results[1].err


def test_a_failing_job_fails_the_launch(tmp_path: Path) -> None:
    require("torch")
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nprint('rank', os.environ['RANK'], flush=True)\nsys.exit(3)\n")
    (result,) = launch_nodes(tmp_path, "torchrun", [str(script)], nodes=1, nproc=1)
    assert result.status == 1  # torchrun reports a failed worker as 1
    assert "rank 0" in result.out


def test_rdma_mode_rejects_a_job_that_ran_over_sockets(tmp_path: Path) -> None:
    require("torch")
    script = tmp_path / "sockets.py"
    script.write_text(
        "import os\n"
        "assert os.environ['NCCL_DEBUG'] == 'INFO'\n"
        "print('n0:7:7 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>')\n"
        "print('n0:7:7 [0] NCCL INFO Using network Socket')\n"
    )
    (result,) = launch_nodes(tmp_path, "torchrun", [str(script)], nodes=1, nproc=1, MLENV_NETWORK_MODE="rdma")
    assert result.status == 1, result.err[-2000:]
    assert "NCCL transport: SOCKETS" in result.err
    assert "error: the cluster file asks for rdma but NCCL used SOCKETS" in result.err


def test_allreduce_bench_reports_bus_bandwidth(tmp_path: Path) -> None:
    require("torch")
    job = [str(WORKSPACE / "allreduce_bench.py"), "--max-bytes", "256K", "--iters", "3"]
    (result,) = launch_nodes(tmp_path, "torchrun", job, nodes=1, nproc=2)
    assert result.status == 0, result.err[-2000:]
    sizes = re.findall(r"(\d+) +\d+\.\d +\d+\.\d{3} +\d+\.\d{3}\b", result.out)
    assert sizes == ["4096", "16384", "65536", "262144"]
    (peak,) = re.findall(r"\bpeak_busbw_gbps=([\d.]+) size_bytes=\d+ world_size=2 backend=gloo", result.out)
    assert float(peak) > 0
