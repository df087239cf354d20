"""Real launches through ``python -m mlenv.runtime launch``: two "nodes" x two processes on loopback.
(The DeepSpeed launch runs once in the suite, in tests/integration/test_demo.py.)

Each node is its own process tree with its own MLENV_NODE_RANK, as on two pods; both reach the
master at 127.0.0.1 on a port of their own. Training runs on CPU with gloo. Detached jobs (``launch --detach``,
``jobs``, ``logs --follow``, ``stop``) run a one-node torchrun each.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlenv.runtime.records.runlayout import NodeDir
from mlenv.runtime.supervise.reaping import marked_processes

from tests._prereq import clean_environ, require
from tests.helpers import free_port

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


def node_env(rank: int, nodes: int, nproc: int, port: int, run_dir: Path, **extra: str) -> dict[str, str]:
    """The env contract a backend gives each node, on top of a clean environment."""
    base = clean_environ()
    return {
        **base,
        "MLENV_NODE_RANK": str(rank), "MLENV_NUM_NODES": str(nodes), "MLENV_PROCS_PER_NODE": str(nproc),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "MLENV_RUN_ID": f"test-{port}",
        "MLENV_CONTROL_SECRET": f"secret-{port}",
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
    assert [sorted(rank for rank, _ in node) for node in ranks] == [["0", "1"], ["2", "3"]]  # node N: 2N, 2N+1
    (done,) = DONE.findall(output)
    steps, first, last, world = int(done[0]), float(done[1]), float(done[2]), int(done[3])
    assert (steps, world) == (30, 4)
    assert last < first / 4, done
    losses = [float(x) for x in re.findall(r"\bstep \d+/30 loss (\d+\.\d{4})", output)]
    assert len(losses) == 4 and losses == sorted(losses, reverse=True)
    for rank in (0, 1):  # each node wrote its own log
        assert "local_rank" in NodeDir(run_dir, 0, rank).log.read_text()
    return output


def test_torchrun_two_nodes_train_to_a_falling_loss(tmp_path: Path) -> None:
    require("torch")
    results = launch_nodes(tmp_path, "torchrun", [TRAIN, "--engine", "ddp"])
    output = check_training(results, tmp_path / "run")
    assert "engine ddp backend gloo world_size 4" in output
    assert "--node-rank 0" in results[0].err and "--node-rank 1" in results[1].err


# Runs a workspace script as __main__, then counts the gloo threads (pt_gloo_runloop, gloo_tcp_loop) still alive.
THREADS_LEFT = """\
import os, runpy, sys
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
names = [open(f"/proc/self/task/{task}/comm").read() for task in os.listdir("/proc/self/task")]
print(f"rank {os.environ['RANK']}: gloo threads after main: {sum('gloo' in name for name in names)}", flush=True)
"""


@pytest.mark.parametrize("job", [[TRAIN, "--engine", "ddp", "--steps", "2"],
                                 [TRAIN, "--engine", "deepspeed", "--steps", "2"],
                                 [str(WORKSPACE / "allreduce_bench.py"), "--max-bytes", "4K", "--iters", "1"]],
                         ids=["train-ddp", "train-deepspeed", "allreduce-bench"])
def test_the_examples_end_their_process_group_before_the_interpreter_exits(tmp_path: Path, job: list[str]) -> None:
    """A gloo thread still alive when the interpreter exits can abort a finished run (SIGABRT, "terminate called
    without an active exception"), so each example's main() must have joined them all by the time it returns."""
    require("torch", *(["deepspeed"] if "deepspeed" in job else []))
    probe = tmp_path / "threads_left.py"
    probe.write_text(THREADS_LEFT)
    # DeepSpeed's start (about 36 s alone) stretches past 240 s beside 3 busy workers on 2 cores: its own limit
    (result,) = launch_nodes(tmp_path, "torchrun", [str(probe), *job], nodes=1, nproc=2,
                             timeout=600 if "deepspeed" in job else 240)
    assert result.status == 0, result.err[-3000:]
    left = sorted(re.findall(r"rank (\d): gloo threads after main: (\d+)", result.out))
    assert left == [("0", "0"), ("1", "0")], result.out[-2000:]


def test_a_failing_job_fails_the_launch_with_the_rank_s_own_code(tmp_path: Path) -> None:
    require("torch")
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nprint('rank', os.environ['RANK'], flush=True)\nsys.exit(3)\n")
    (result,) = launch_nodes(tmp_path, "torchrun", [str(script)], nodes=1, nproc=1)
    assert result.status == 3  # torchrun itself reports a failed worker as 1
    assert "[node-0 r0] rank 0\n" in result.out
    assert re.search(r"mlenv: rank 0 \(node-0, pid \d+\) exited with 3 first; last lines: rank 0\n", result.err)


def test_a_group_sigterm_reaches_torchrun_once(tmp_path: Path) -> None:
    """mlenv stops a node's command by SIGTERM to its process group, which holds the recorded launch and its
    supervisor; the launch also forwards it. torchrun must still get it once, or its orderly stop is cut short."""
    require("torch")
    script = tmp_path / "sleeps.py"
    script.write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(300)\n")
    env = node_env(0, 1, 1, free_port(), tmp_path / "run")
    argv = [sys.executable, "-m", "mlenv.runtime", "launch", "--", str(script)]
    with running([(argv, env)], tmp_path) as (process,):
        wait_for_line(NodeDir(tmp_path / "run", 0, 0).log, "sleeping")
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(timeout=60) == 128 + signal.SIGTERM
    out = (tmp_path / "0.out").read_text()
    assert out.count("Received 15 death signal") == 1, out
    state = json.loads(NodeDir(tmp_path / "run", 0, 0).state.read_text())
    assert (state["state"], state["first_failure"]) == ("stopped", None)


# Counts the SIGUSR1 it gets: once caught, it waits a second for a late second delivery, then says how many came.
COUNTS_USR1 = """\
import os, signal, time
rank, got = os.environ["RANK"], []
signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
print(f"rank {rank} waiting", flush=True)
while not got:
    time.sleep(0.05)
time.sleep(1)
print(f"rank {rank} got SIGUSR1 {len(got)} time(s)", flush=True)
"""


def test_a_signal_the_task_ignores_reaches_each_rank_once_and_stops_nothing_else(tmp_path: Path) -> None:
    """Slurm's warning signal, as the batch script passes it on: the task shell ignores it (``trap '' USR1``) and
    Slurm sends it to every process of the step. The runtime, its supervisor, torchrun's agent and the rank
    wrappers live on; each rank, which catches it, gets it once (passed on by its wrapper as well, a second one
    killed it after its handler's exit had begun)."""
    require("torch")
    script = tmp_path / "usr1.py"
    script.write_text(COUNTS_USR1)
    env = node_env(0, 1, 2, free_port(), tmp_path / "run")
    argv = ["sh", "-c", "trap '' USR1; exec \"$@\"", "sh", sys.executable, "-m", "mlenv.runtime", "launch",
            "--launcher", "torchrun", "--", str(script)]
    log = NodeDir(tmp_path / "run", 0, 0).log
    with running([(argv, env)], tmp_path) as (process,):
        for rank in (0, 1):
            wait_for_line(log, f"rank {rank} waiting")
        every = marked_processes(f"MLENV_RUN_ID={env['MLENV_RUN_ID']}".encode())
        assert len(every) >= 6, every  # the runtime, its supervisor, torchrun, 2 rank wrappers, 2 ranks
        for pid in every:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        assert process.wait(timeout=60) == 0, (tmp_path / "0.err").read_text()[-3000:]
    for rank in (0, 1):
        assert f"[node-0 r{rank}] rank {rank} got SIGUSR1 1 time(s)\n" in log.read_text()
    assert json.loads(NodeDir(tmp_path / "run", 0, 0).state.read_text())["state"] == "succeeded"


def test_rdma_mode_stops_a_job_that_runs_over_sockets(tmp_path: Path) -> None:
    require("torch")
    script = tmp_path / "sockets.py"
    script.write_text(
        "import os, time\n"
        "assert (os.environ['NCCL_DEBUG'], os.environ['NCCL_DEBUG_SUBSYS']) == ('INFO', 'INIT,NET')\n"
        "print(f'n0:{os.getpid()}:7 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>')\n"  # as NCCL prints it
        "print(f'n0:{os.getpid()}:7 [0] NCCL INFO Using network Socket', flush=True)\n"
        "time.sleep(300)\n"
    )
    results = launch_nodes(tmp_path, "torchrun", [str(script)], nodes=2, nproc=1, timeout=120,
                           MLENV_NETWORK_MODE="rdma")
    assert [r.status for r in results] == [1, 1], [r.err[-2000:] for r in results]
    for node, result in enumerate(results):
        assert f"mlenv: node-{node}: SOCKETS via eth0 (NET/Socket): NCCL chose NET/Socket" in result.out + result.err


def test_allreduce_bench_reports_bus_bandwidth(tmp_path: Path) -> None:
    require("torch")
    job = [str(WORKSPACE / "allreduce_bench.py"), "--max-bytes", "256K", "--iters", "3"]
    (result,) = launch_nodes(tmp_path, "torchrun", job, nodes=1, nproc=2)
    assert result.status == 0, result.err[-2000:]
    sizes = re.findall(r"(\d+) +\d+\.\d +\d+\.\d{6} +\d+\.\d{6}\b", result.out)
    assert sizes == ["4096", "16384", "65536", "262144"]
    (peak,) = re.findall(r"\bpeak_busbw_gbps=([\d.]+) size_bytes=\d+ world_size=2 backend=gloo", result.out)
    assert float(peak) > 0


# Detached jobs: `launch --detach`, then `jobs`, `logs --follow` and `stop` as the host side runs them on a node.

HOST = "node-a"


def detached_env(tmp_path: Path, run_id: str, **extra: str) -> dict[str, str]:
    """One node's environment whose runs live under tmp_path/runs; HOSTNAME names the node."""
    runs = tmp_path / "runs"
    return node_env(0, 1, 1, free_port(), runs / run_id, MLENV_RUN_ID=run_id, MLENV_RUNS_ROOT=str(runs),
                    HOSTNAME=HOST, **extra)


def runtime(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mlenv.runtime", *args], env=env, cwd=WORKSPACE,
                          capture_output=True, text=True, timeout=timeout, check=False)


def start_detached(env: dict[str, str], script: Path) -> int:
    """``launch --detach``: it returns at once with one line; the pid of the detached supervisor."""
    result = runtime(env, "launch", "--detach", "--", str(script), timeout=60)
    assert result.returncode == 0, result.stderr
    log = NodeDir(Path(env["MLENV_RUN_DIR"]), 0, 0).log
    match = re.fullmatch(rf"mlenv: node 0 started in the background: pid (\d+), log {re.escape(str(log))}\n",
                         result.stdout)
    assert match, result.stdout
    return int(match.group(1))


def job_processes(run_id: str) -> list[int]:
    """Every live process that carries MLENV_RUN_ID=<run_id> (the supervisor, torchrun, workers, their children)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with suppress(OSError):
            stat = (environ.parent / "stat").read_text()
            if f"MLENV_RUN_ID={run_id}".encode() in environ.read_bytes().split(b"\0") and " Z " not in stat:
                found.append(int(environ.parent.name))
    return found


def wait_for_line(path: Path, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.2)


def jobs_of(env: dict[str, str]) -> list[dict[str, object]]:
    result = runtime(env, "jobs", "--json")
    assert result.returncode == 0, result.stderr
    jobs: list[dict[str, object]] = json.loads(result.stdout)
    return jobs


def test_a_detached_job_runs_on_and_logs_follow_it_to_its_exit_status(tmp_path: Path) -> None:
    require("torch")
    go, container_log = tmp_path / "go", tmp_path / "container.log"
    script = tmp_path / "waits.py"
    script.write_text(
        "import os, sys, time\n"
        "print('rank', os.environ['RANK'], 'started', flush=True)\n"
        f"while not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.1)\n"
        "print('finished', flush=True)\n"
    )
    env = detached_env(tmp_path, "run-a", MLENV_CONTAINER_LOG=str(container_log))
    pid = start_detached(env, script)
    run_dir = Path(env["MLENV_RUN_DIR"])
    node = NodeDir(run_dir, 0, 0)
    record = json.loads(node.record.read_text())
    assert (record["pid"], record["host"], record["run_id"], record["node_rank"]) == (pid, HOST, "run-a", 0)
    assert record["argv"][-2:] == ["--", str(script)] and record["started_at"]
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    assert int(stat[2]) == int(stat[3]) == pid  # leads its own process group and session
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    [job] = jobs_of(env)
    assert (job["state"], job["pid"], job["exit_code"]) == ("running", pid, None)

    with subprocess.Popen([sys.executable, "-m", "mlenv.runtime", "logs", "--follow"], env=env, cwd=WORKSPACE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as follower:
        wait_for_line(node.log, "rank 0 started")
        go.touch()
        out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    assert "rank 0 started" in out and "finished" in out
    assert "mlenv: node 0/1" in out  # the runtime's own notes are in the node log too
    assert node.exit.read_text() == "0\n"
    assert "finished" in container_log.read_text()
    [job] = jobs_of(env)
    assert (job["state"], job["exit_code"]) == ("succeeded", 0)
    assert job_processes("run-a") == []


def test_a_script_that_changes_directory_sees_one_absolute_checkpoint_dir_in_every_attempt(tmp_path: Path) -> None:
    """A detached run restarts itself: the relative MLENV_CHECKPOINT_DIR a backend sets is the workspace's, absolute,
    in both attempts, wherever the script goes."""
    require("torch")
    script = tmp_path / "moves.py"
    script.write_text(
        "import os, sys\n"
        "os.chdir('/')\n"
        "print('checkpoints', os.environ['MLENV_CHECKPOINT_DIR'], flush=True)\n"
        "sys.exit(3 if os.environ['MLENV_RESTART_COUNT'] == '0' else 0)\n"
    )
    env = detached_env(tmp_path, "run-c", MLENV_CHECKPOINT_DIR="checkpoints/run-c")
    result = runtime(env, "launch", "--detach", "--max-restarts", "1", "--", str(script), timeout=60)
    assert result.returncode == 0, result.stderr
    second = NodeDir(Path(env["MLENV_RUN_DIR"]), 1, 0)
    wait_for_line(second.exit, "0")
    said = [re.findall(r"checkpoints (\S+)", NodeDir(second.run_dir, attempt, 0).log.read_text())
            for attempt in (0, 1)]
    assert said == [[str(WORKSPACE / "checkpoints" / "run-c")]] * 2


def test_stacks_of_a_rank_with_300_threads_are_its_main_thread_s(tmp_path: Path) -> None:
    """faulthandler dumps 100 threads, the newest first, so a rank's every-thread dump lacks its main thread; the
    faulthandler stack of a real rank (armed by the runtime) is its main thread's all the same."""
    require("torch")
    script = tmp_path / "threads.py"
    script.write_text(
        "import threading, time\n"
        "never = threading.Event()\n"
        "for _ in range(300):\n"
        "    threading.Thread(target=never.wait, daemon=True).start()\n"
        "def inner_wait():\n"
        "    print('threads', threading.active_count() >= 301, flush=True)  # and mlenv's collective record\n"
        "    while True:\n"
        "        time.sleep(0.1)\n"
        "inner_wait()\n"
    )
    env = detached_env(tmp_path, "run-t")
    start_detached(env, script)
    wait_for_line(NodeDir(Path(env["MLENV_RUN_DIR"]), 0, 0).log, "threads True")
    result = runtime(env, "stacks", "--method", "faulthandler", "--json")
    assert result.returncode == 0, result.stderr
    [rank] = json.loads(result.stdout)["ranks"]
    assert (rank["method"], rank["error"]) == ("faulthandler", None), rank
    assert [frame["function"] for frame in rank["frames"]] == ["<module>", "inner_wait"], rank["frames"]
    said = runtime(env, "stacks", "--method", "faulthandler").stdout.splitlines()
    assert said[0] == "collectives (this node's ranks): no collectives recorded", said  # never a wrong name
    assert runtime(env, "stop", "--run", "run-t").returncode == 0


def test_stop_ends_a_detached_job_and_every_process_it_started(tmp_path: Path) -> None:
    require("torch")
    script = tmp_path / "sleeps.py"
    script.write_text(
        "import subprocess, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "print('child', child.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    env = detached_env(tmp_path, "run-b")
    pid = start_detached(env, script)
    wait_for_line(NodeDir(Path(env["MLENV_RUN_DIR"]), 0, 0).log, "child ")
    assert len(job_processes("run-b")) >= 4  # supervisor, torchrun, worker, sleep

    again = runtime(env, "launch", "--detach", "--", str(script))
    assert (again.returncode, again.stdout) == (1, "")
    assert again.stderr == f"mlenv.runtime launch: failed: node 0 of run run-b (pid {pid}) is still running; " \
                           "stop it first\n"

    result = runtime(env, "stop", "--run", "run-b")
    assert (result.returncode, result.stdout) == (0, f"stopped node 0 of run run-b (pid {pid}): ended after SIGTERM\n")
    assert job_processes("run-b") == []
    [job] = jobs_of(env)
    assert job["state"] == "stopped" and job["exit_code"] != 0
    assert runtime(env, "stop").stdout == "run run-b already finished (stopped): nothing to stop\n"


def test_stop_kills_what_ignores_sigterm_after_the_grace_time(tmp_path: Path) -> None:
    """A helper in a session of its own that ignores SIGTERM: torchrun cannot reach it, the job's marker can."""
    require("torch")
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import subprocess, time\n"
        "subprocess.Popen(['sh', '-c', 'trap \"\" TERM; echo helper ready; sleep 300'], start_new_session=True)\n"
        "time.sleep(300)\n"
    )
    env = detached_env(tmp_path, "run-c")
    pid = start_detached(env, script)
    wait_for_line(NodeDir(Path(env["MLENV_RUN_DIR"]), 0, 0).log, "helper ready")
    result = runtime(env, "stop", "--grace", "1")
    assert (result.returncode, result.stdout) == (
        0, f"stopped node 0 of run run-c (pid {pid}): killed with SIGKILL after 1 s\n")
    assert job_processes("run-c") == []
    [job] = jobs_of(env)
    assert job["state"] == "stopped" and job["exit_code"] != 0


def test_a_lost_node_stops_the_others(tmp_path: Path) -> None:
    """Node 1's supervisor dies without a word (SIGKILL): node 0 takes its lost control connection for a failure
    and stops its own share within seconds, recorded stopped for the lost node (the failure is not its own)."""
    require("torch")
    script = tmp_path / "sleeps.py"
    script.write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(300)\n")
    port, run_dir = free_port(), tmp_path / "run"
    argv = [sys.executable, "-m", "mlenv.runtime", "launch", "--", str(script)]
    commands = [(argv, node_env(rank, 2, 1, port, run_dir)) for rank in range(2)]
    try:
        with running(commands, tmp_path) as processes:
            for rank in (0, 1):
                wait_for_line(NodeDir(run_dir, 0, rank).log, "sleeping")
            os.killpg(processes[1].pid, signal.SIGKILL)  # node 1's launch and supervisor, at once
            lost = time.monotonic()
            assert processes[0].wait(timeout=60) == 1
            assert time.monotonic() - lost < 10
    finally:
        for pid in job_processes(f"test-{port}"):  # node 1's torchrun and rank, orphaned by the kill
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    state = json.loads(NodeDir(run_dir, 0, 0).state.read_text())
    assert (state["state"], state["reason"], state["first_failure"]) == ("stopped", "lost node 1", None)
    assert "mlenv: stopping the job: lost node 1" in (tmp_path / "0.err").read_text() + (tmp_path / "0.out").read_text()
