"""The Slurm backend against a real Slurm (tests/integration/slurm_cluster.py: slurmctld and slurmd n1, n2 on this
host, partition ``debug`` up and ``down`` down), through the real ``mlenv`` command: batch launches of the
repository's workspace/train_multi_node.py (2 nodes x 2 processes, CPU/gloo) to a falling loss, a failing job's
exit code and logs, Ctrl-C, an allocation from ``deploy`` with exec, shell, launch, logs, status and clean, pending
reasons, sbatch's own errors and doctor. Every mlenv call has its own timeout."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests._prereq import clean_environ, require
from tests._waiting import wait_until_polling
from tests.helpers import MLENV, run_mlenv, succeeded

if TYPE_CHECKING:  # imported at run time as plugins, so that pytest rewrites their asserts
    from tests.integration.slurm_cluster import SlurmCluster
    from tests.integration.ssh_hosts import SshHostsFactory

pytest_plugins = ["tests.integration.slurm_cluster", "tests.integration.ssh_hosts"]

ROOT = Path(__file__).resolve().parents[2]
NO_STOP_GRACE = (sys.executable, "-c", "import mlenv.parallel; mlenv.parallel.STOP_GRACE = 0.0; "
                                       "from mlenv.cli import main; main()")
"""mlenv killing what it runs right after SIGTERM: srun dies before it can end its step, as on a slow machine."""
SECRET = f"tok-{os.getpid()}-{time.time_ns()}"
"""A forwarded token: found in no file under Slurm's state and spool directories or the workdir."""
TRAIN = ("train_multi_node.py", "--engine", "ddp", "--steps", "5")
DONE = re.compile(r"^\[node-(\d) r\d\] done steps=5 first_loss=([\d.]+) last_loss=([\d.]+) world_size=4$", re.MULTILINE)
# No torch: node 1's first process fails when asked to, once every process has printed (so that each rank has a
# log to show), every other one sleeps until stopped. The processes share the workdir (one machine).
FAILING_JOB = """\
import glob, hashlib, os, sys, time
secret = os.environ.get("MLENV_TEST_SECRET")  # shown by its digest: the job's own output may land in files
print(f"secret {secret and hashlib.sha256(secret.encode()).hexdigest()[:16]}", flush=True)
up = f".up-{os.environ.get('MLENV_RUN_ID', '')}-{os.environ.get('MLENV_RESTART_COUNT', '0')}-"
open(up + os.environ["RANK"], "w").close()
if "--fail" in sys.argv and os.environ["MLENV_NODE_RANK"] == "1" and os.environ["LOCAL_RANK"] == "0":
    deadline = time.monotonic() + 120
    while len(glob.glob(up + "*")) < int(os.environ["WORLD_SIZE"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    print("failing on purpose", flush=True)
    sys.exit(3)
print("sleeping", flush=True)
time.sleep(300)
"""
CLUSTER = """\
backend: slurm
cluster: {{name: {name}}}
slurm:
  partition: {partition}
  time: "15"
  workdir: {workdir}
  setup: ["source {venv}/bin/activate"]
{slurm_extra}gpus: {{per_node: {gpus}, default_nodes: 2, procs_per_node: 2}}
network: {{tcp: {{interface_exclude: "^docker0"}}}}
"""


@dataclass(frozen=True)
class Project:
    """A project (MLENV_HOME) with one Slurm cluster file and the repository's workspace, for a private Slurm."""

    home: Path
    name: str
    workdir: Path
    cluster: SlurmCluster
    last_stderr: list[str] = field(default_factory=list)
    slurm_here: bool = True
    """Whether mlenv's own environment reaches the private Slurm (False: only the login host's does)."""

    @property
    def env(self) -> dict[str, str]:
        return clean_environ({**(self.cluster.env if self.slurm_here else {}), "MLENV_HOME": str(self.home)})

    def mlenv(self, *args: str, timeout: float = 60, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """The real `mlenv` against this project and the private Slurm."""
        return run_mlenv(*args, cwd=self.home, env=self.env, input=stdin or "", timeout=timeout)

    def ok(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return succeeded(self.mlenv(*args, timeout=timeout))

    def status(self) -> list[dict[str, Any]]:
        return list(json.loads(self.ok("status", "-c", self.name, "--json").stdout)["pods"])

    def latest_run(self) -> dict[str, Any]:
        """status --json's latest_run (never null on a deployment that ran something)."""
        run = json.loads(self.ok("status", "-c", self.name, "--json").stdout)["latest_run"]
        assert isinstance(run, dict), run
        return run

    def recorded_jobs(self) -> list[str]:
        state = json.loads((self.home / ".mlenv" / "state.json").read_text())
        return [job["id"] for job in state["jobs"].get(self.name, [])]

    def submitted(self, stderr: str) -> str:
        """The job id launch reported."""
        match = re.search(r"^batch job (\d+) submitted", stderr, re.MULTILINE)
        assert match, stderr
        return match[1]


def make_project(tmp_path: Path, cluster: SlurmCluster, name: str = "hpc", partition: str = "debug",
                 gpus: int = 0, extra: str = "", slurm_extra: str = "", slurm_here: bool = True) -> Project:
    require("torch", "deepspeed", "rsync")
    home = tmp_path / "home"
    (home / "clusters").mkdir(parents=True)
    shutil.copytree(ROOT / "workspace", home / "workspace")
    (home / "workspace" / "fail.py").write_text(FAILING_JOB)
    workdir = tmp_path / "work"
    (home / "clusters" / f"{name}.yaml").write_text(CLUSTER.format(
        name=name, partition=partition, workdir=workdir, venv=Path(sys.executable).parent.parent, gpus=gpus,
        slurm_extra=slurm_extra) + extra)
    return Project(home, name, workdir, cluster, slurm_here=slurm_here)


@pytest.fixture
def project(tmp_path: Path, slurm_cluster: SlurmCluster) -> Project:
    """A synced project for partition debug."""
    made = make_project(tmp_path, slurm_cluster)
    made.ok("sync", "-c", made.name)
    return made


def losses(stdout: str) -> tuple[float, float]:
    """(first, last) loss of the training's done line."""
    (done,) = DONE.findall(stdout)
    return float(done[1]), float(done[2])


def test_batch_launch_trains_to_a_falling_loss(project: Project, slurm_cluster: SlurmCluster) -> None:
    result = project.mlenv("launch", "-c", project.name, "--launcher", "torchrun", *TRAIN, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    first, last = losses(result.stdout)
    assert last < first
    reported = re.findall(r"^\[node-(\d) r(\d)\] rank (\d)/4 local_rank \d on ", result.stdout, re.MULTILINE)
    assert sorted(own for _, tag, own in reported if tag == own) == ["0", "1", "2", "3"], result.stdout  # 4 ranks
    job_id = project.submitted(result.stderr)
    assert f"mlenv: job {job_id} on n[1-2], master n1 at " in result.stdout
    assert {"[node-0] mlenv: node 0/2 (mlenv), 2 processes", "[node-1] mlenv: node 1/2 (mlenv), 2 processes"} <= {
        line.partition(", master")[0] for line in result.stdout.splitlines()}
    assert project.recorded_jobs() == [job_id]
    (run,) = (project.home / "runs").iterdir()
    assert "step 5/5 loss" in "".join((run / f"node-{n}.log").read_text() for n in (0, 1))
    remote = project.workdir / ".mlenv" / "runs" / run.name
    assert (remote / "attempt-0" / "exit").read_text() == "0\n"
    assert "step 5/5 loss" in (remote / "output.log").read_text()
    assert slurm_cluster.job(job_id)["JobState"] == "COMPLETED"
    (row,) = project.status()
    assert (row["pod"], row["phase"], row["host"], row["detail"], row["extra"]["run"]) == (
        f"job-{job_id}", "COMPLETED", "n[1-2]", "exit code 0", run.name)


def _launch_with_secret(project: Project, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``mlenv launch -c NAME --env MLENV_TEST_SECRET ARGS`` with SECRET in the environment."""
    return subprocess.run([str(MLENV), "launch", "-c", project.name, "--env", "MLENV_TEST_SECRET", *args],
                          capture_output=True, text=True, timeout=timeout, env={**project.env,
                                                                                "MLENV_TEST_SECRET": SECRET},
                          cwd=project.home, stdin=subprocess.DEVNULL, check=False)


def _files_holding(secret: str, *roots: Path) -> list[Path]:
    return [path for root in roots for path in root.rglob("*")
            if path.is_file() and not path.is_symlink() and secret.encode() in path.read_bytes()]


def test_a_failing_node_gives_the_job_its_exit_code(project: Project, slurm_cluster: SlurmCluster) -> None:
    refused = _launch_with_secret(project, "fail.py")  # a batch job would need the secret after mlenv is gone
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert ("error: --env MLENV_TEST_SECRET: on Slurm, a batch job (like a batch job, a detached run or a requeue) "
            "would need the secret later") in refused.stderr
    assert "deploy an allocation (mlenv deploy hpc) and launch attached" in refused.stderr
    assert "through slurm.setup" in refused.stderr
    unset = project.mlenv("launch", "-c", project.name, "--env", "MLENV_NOT_SET_ANYWHERE", "fail.py")
    assert unset.returncode == 2 and "--env MLENV_NOT_SET_ANYWHERE: not set in your environment" in unset.stderr
    for typo in (["--detatch"], ["--nodes", "3"]):  # an option launch does not know, before SCRIPT
        mistyped = project.mlenv("launch", "-c", project.name, *typo, "fail.py")
        assert mistyped.returncode == 2 and f"No such option '{typo[0]}'" in mistyped.stderr, mistyped.stderr
    assert not (project.home / ".mlenv" / "state.json").exists()  # nothing submitted, nothing recorded
    assert slurm_cluster.ok("squeue", "-h", "-o", "%i") == ""
    result = project.mlenv("launch", "-c", project.name, "--launcher", "deepspeed", "fail.py", "--fail", timeout=180)
    assert result.returncode == 3, result.stdout + result.stderr
    job_id = project.submitted(result.stderr)
    assert re.search(r"^\[node-1 r[23]\] failing on purpose$", result.stdout, re.MULTILINE), result.stdout
    assert re.search(r"^\[node-0 r[01]\] secret None$", result.stdout, re.MULTILINE)  # nothing forwarded
    assert re.search(r"mlenv: rank [23] \(node-1, pid \d+\) exited with 3 first", result.stdout)
    assert "mlenv: node 1 failed first, with exit code 3" in result.stdout
    assert "error: node-1 failed with exit code 3; the other nodes were stopped." in result.stderr
    assert re.search(r"^node-0 +│ stopped \((143|3)\)", result.stdout, re.MULTILINE)  # srun's stop, or ours
    assert slurm_cluster.job(job_id)["ExitCode"] == "3:0"
    (row,) = project.status()
    assert (row["phase"], row["detail"]) == ("FAILED", "exit code 3")
    run = project.latest_run()  # the batch job's run, from the nodes' records in the shared run directory
    failure = run["first_failure"]
    assert (run["state"], failure["node"], failure["exit_code"]) == ("failed", 1, 3) and failure["rank"] in (2, 3)
    assert failure["host"] == "n2", failure  # the scheduler's name of the node, never the batch shell's HOSTNAME
    assert {(rank["node"], rank["host"]) for rank in run["ranks"]} == {(0, "n1"), (1, "n2")}, run["ranks"]
    for follow, code in (([], 0), (["-f"], 3)):  # the run has ended: following it ends too, with the run's code
        shown = project.mlenv("logs", "-c", project.name, "--pod", "1", *follow, timeout=30)
        logs = shown.stdout
        assert shown.returncode == code, shown.stderr
        assert any(re.fullmatch(r"\[node-1 r[23]\] failing on purpose", line) for line in logs.splitlines())
    for rank in (2, 3):  # node 1's ranks: one failed, the other was stopped
        one = project.mlenv("logs", "-c", project.name, "--rank", str(rank), timeout=30)
        assert one.returncode == 0 and one.stdout, one.stderr
        assert all(line.startswith(f"[node-1 r{rank}] ") for line in one.stdout.splitlines()), one.stdout
    unknown = project.mlenv("logs", "-c", project.name, "--rank", "9", timeout=30)
    assert (unknown.returncode, unknown.stderr) == (
        2, "error: rank 9 is not in the latest run of hpc (its ranks: 0, 1, 2, 3)\n")


def _cmdline(pid: int) -> bytes:
    """A process's command line (the nodes are on this host); empty once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def steps(cluster: SlurmCluster, job_id: str) -> list[str]:
    """The job's own steps (not its batch and extern steps)."""
    listed = cluster.ok("squeue", "-h", "-s", f"--jobs={job_id}", "-o", "%i").split()
    return [step for step in listed if step.partition(".")[2].isdigit()]


def interrupted(project: Project, args: list[str], mlenv: Sequence[str] = (str(MLENV),)) -> int:
    """Launch ``args`` (a job whose every process prints "sleeping"), Ctrl-C it once all four sleep; its exit
    code. Raises with what it printed when it does not end."""
    process = subprocess.Popen([*mlenv, "launch", "-c", project.name, *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=project.env, cwd=project.home,
                               stdin=subprocess.DEVNULL)
    try:
        seen = ""
        deadline = time.monotonic() + 120
        while seen.count("sleeping") < 4 and time.monotonic() < deadline and process.stdout:
            seen += process.stdout.readline()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    project.last_stderr.append(err)
    assert process.returncode is not None, seen + out + err
    return process.returncode


def test_ctrl_c_cancels_the_batch_job(project: Project, slurm_cluster: SlurmCluster) -> None:
    code = interrupted(project, ["--launcher", "torchrun", "fail.py"])
    assert code == 130, project.last_stderr
    (job_id,) = project.recorded_jobs()
    assert f"error: job {job_id} cancelled" in project.last_stderr[-1]
    slurm_cluster.wait(lambda: slurm_cluster.state(job_id) == "", f"job {job_id} to end", 30)
    assert slurm_cluster.job(job_id)["JobState"] == "CANCELLED"


def test_deploy_exec_shell_launch_logs_status_clean(project: Project, slurm_cluster: SlurmCluster) -> None:
    deployed = project.ok("deploy", project.name, "--timeout", "60")
    match = re.search(r"allocation (\d+) of hpc is running on n\[1-2\]; master n1 at (\S+):(\d+)", deployed.stderr)
    assert match, deployed.stderr
    allocation, master, port = match.groups()
    rows = project.status()
    assert [(r["pod"], r["host"], r["phase"], r["ready"], r["extra"]["job"]) for r in rows] == [
        ("node-0", "n1", "RUNNING", True, allocation), ("node-1", "n2", "RUNNING", True, allocation)]
    assert [r["ip"] for r in rows] == [master, master]  # every node's address (here all on this host), not node 0's
    shown = project.ok("exec", "-c", project.name, "--", "sh", "-c",
                       'echo "$SLURMD_NODENAME $MLENV_NODE_RANK $MLENV_NUM_NODES $MASTER_ADDR:$MASTER_PORT $PWD"')
    assert sorted(shown.stdout.splitlines()) == [f"[node-{n}] n{n + 1} {n} 2 {master}:{port} {project.workdir}"
                                                 for n in (0, 1)]
    assert project.mlenv("exec", "-c", project.name, "--", "sh", "-c", "exit $((MLENV_NODE_RANK * 5))").returncode == 5
    shell = project.mlenv("shell", "-c", project.name, "--pod", "1", stdin='echo "on $SLURMD_NODENAME"; exit 4\n')
    assert shell.returncode == 4 and "on n2" in shell.stdout.splitlines(), shell.stdout + shell.stderr

    launched = project.mlenv("launch", "-c", project.name, "--launcher", "torchrun", *TRAIN, timeout=300)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    first, last = losses(launched.stdout)
    assert last < first
    assert f"mlenv: job {allocation} on n[1-2], master n1 at {master}:{port}" in launched.stdout
    assert "batch job" not in launched.stderr and slurm_cluster.ok("squeue", "-h", "-o", "%i").split() == [allocation]
    assert "rank" in project.ok("logs", "-c", project.name, "--pod", "1").stdout

    forwarded = _launch_with_secret(project, "--launcher", "deepspeed", "fail.py", "--fail")  # attached: stdin
    assert forwarded.returncode == 3, forwarded.stdout + forwarded.stderr
    digest = hashlib.sha256(SECRET.encode()).hexdigest()[:16]
    got = {match[1] for line in forwarded.stdout.splitlines()
           if (match := re.match(rf"\[(node-\d) r\d\] secret {digest}$", line))}
    assert got == {"node-0", "node-1"}, forwarded.stdout  # every node's processes got it
    assert SECRET not in forwarded.stdout + forwarded.stderr
    assert _files_holding(SECRET, slurm_cluster.tmp, project.workdir, project.home) == []
    failed = project.latest_run()  # read from the nodes' records in the shared run directory
    failure = failed["first_failure"]
    assert (failed["state"], failed["attempt"], failure["node"], failure["exit_code"], failure["reason"]) == (
        "failed", 0, 1, 3, "exited with 3") and failure["rank"] in (2, 3), failed
    assert (failure["rank"], 1, "failed", 3) in [(r["rank"], r["node"], r["state"], r["exit_code"])
                                                 for r in failed["ranks"]], failed["ranks"]
    assert [r["rank"] for r in failed["ranks"]] == [0, 1, 2, 3]
    said = project.ok("status", "-c", project.name).stdout
    assert f"first failure: rank {failure['rank']} (node-1) exited with 3" in said, said
    refused = _launch_with_secret(project, "--detach", "fail.py")
    assert refused.returncode == 2 and "on Slurm, a detached run" in refused.stderr and not steps(slurm_cluster,
                                                                                                 allocation)
    detached = project.ok("launch", "-c", project.name, "--launcher", "torchrun", "--detach", "fail.py")
    assert f"started inside allocation {allocation}" in detached.stderr
    output = max((project.workdir / ".mlenv" / "runs").glob("*/output.log"))  # run ids sort by time
    slurm_cluster.wait(lambda: "mlenv: job" in output.read_text() and len(steps(slurm_cluster, allocation)) == 1,
                       "the detached run's step (after the master's address)", 60)
    def detached_ranks() -> list[tuple[int, str, bytes]]:
        """(rank, state, the command line of its pid) of every rank of the detached run, as status reads it."""
        return [(r["rank"], r["state"], _cmdline(r["pid"])) for r in project.latest_run()["ranks"]]

    slurm_cluster.wait(lambda: [(rank, state) for rank, state, _ in detached_ranks()] == [
        (rank, "running") for rank in range(4)], "status to list the detached run's 4 running ranks", 60)
    assert all(b"fail.py" in cmdline for _, _, cmdline in detached_ranks())  # each pid: the rank's own process
    running = project.latest_run()
    assert (running["state"], running["first_failure"], sorted(r["node"] for r in running["ranks"])) == (
        "running", None, [0, 0, 1, 1]), running
    unknown = project.mlenv("logs", "-c", project.name, "--rank", "9", timeout=30)
    assert (unknown.returncode, unknown.stderr) == (
        2, "error: rank 9 is not in the latest run of hpc (its ranks: 0, 1, 2, 3)\n")
    (step,) = steps(slurm_cluster, allocation)
    assert project.ok("stop", "-c", project.name).stderr == f"cancelled {step}\n"
    slurm_cluster.wait(lambda: not steps(slurm_cluster, allocation), f"step {step} to end", 30)
    ended = json.loads(project.ok("status", "-c", project.name, "--json").stdout)
    # the supervisors stop the job and record it, or Slurm's KillWait (2 s here) kills them first: stopped either way
    assert "running" not in ended["run_states"].values() and ended["latest_run"]["state"] == "stopped", ended
    assert interrupted(project, ["--launcher", "torchrun", "fail.py"], NO_STOP_GRACE) == 130  # Ctrl-C cancels the step
    assert re.search(r"error: interrupted: (step \d+\.\d+ cancelled|the run's step has ended)\n",
                     project.last_stderr[-1]), project.last_stderr[-1]
    slurm_cluster.wait(lambda: not steps(slurm_cluster, allocation), "the interrupted run's step to end", 30)
    assert slurm_cluster.state(allocation) == "RUNNING"

    doctor = json.loads(project.mlenv("doctor", "-c", project.name, "--json", timeout=120).stdout)
    torch = {c["name"]: (c["status"], c["evidence"]) for c in doctor["checks"] if c["name"].endswith(": torch")}
    assert {name: status for name, (status, _) in torch.items()} == {"n1: torch": "PASS", "n2: torch": "PASS"}, \
        torch  # found through slurm.setup (source VENV/bin/activate), as launch finds it
    cleaned = project.ok("clean", "-c", project.name)
    assert f"cancelled job(s) {allocation} of hpc" in cleaned.stderr
    assert slurm_cluster.job(allocation)["JobState"] == "CANCELLED"
    assert project.name not in json.loads((project.home / ".mlenv" / "state.json").read_text())["deployments"]


def test_stop_ends_a_detached_run_with_restarts_left_for_good(project: Project, slurm_cluster: SlurmCluster) -> None:
    """mlenv stop of a detached run under --max-restarts inside an allocation: its script starts no further
    attempt, and the run reads as stopped, never failed (no first failure, nothing restarted)."""
    allocation = re.search(r"allocation (\d+) submitted", project.ok("deploy", project.name, "--timeout", "60").stderr)
    assert allocation, "deploy named no allocation"
    project.ok("launch", "-c", project.name, "--launcher", "torchrun", "--detach", "--max-restarts", "2", "fail.py")
    (output,) = (project.workdir / ".mlenv" / "runs").glob("*/output.log")
    slurm_cluster.wait(lambda: output.read_text().count("sleeping") == 4, "the 4 ranks to sleep", 120)
    project.ok("stop", "-c", project.name)
    slurm_cluster.wait(lambda: "stopped by mlenv stop" in output.read_text(), "the run's script to end", 60)
    assert not steps(slurm_cluster, allocation[1]) and "restarting the run" not in output.read_text()
    assert not (output.parent / "attempt-1").exists()
    run = project.latest_run()
    assert (run["state"], run["first_failure"]) == ("stopped", None), run
    assert "mlenv stop stops it" not in project.ok("status", "-c", project.name).stdout  # nothing of it runs
    project.ok("clean", "-c", project.name)


def test_slurm_commands_run_on_the_login_host_over_ssh(tmp_path: Path, slurm_cluster: SlurmCluster,
                                                       ssh_hosts: SshHostsFactory) -> None:
    """slurm.login with slurm.ssh: sync, deploy, exec, status and clean reach Slurm only through the login host (an
    sshd "machine" on this filesystem whose sessions know the private Slurm), with the file's key and known_hosts."""
    machines = ssh_hosts(1, env=slurm_cluster.env)
    login = machines.hosts[0]
    known_hosts = tmp_path / "login_known_hosts"
    project = make_project(tmp_path, slurm_cluster, slurm_here=False, slurm_extra=(
        f"  login: {login.spec}\n  ssh: {{identity_file: {machines.identity}, known_hosts: {known_hosts}}}\n"))
    here = subprocess.run(["squeue"], capture_output=True, text=True, env=project.env, timeout=30, check=False)
    assert here.returncode != 0, "this machine reaches a Slurm without the test's SLURM_CONF: the test proves nothing"

    wrong_key = tmp_path / "wrong_key"  # a key the login host does not accept: rsync's own error, nothing else
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong_key)], check=True, timeout=30)
    (project.home / "clusters" / "wrong-key.yaml").write_text(
        (project.home / "clusters" / "hpc.yaml").read_text().replace(str(machines.identity), str(wrong_key))
        .replace("name: hpc", "name: wrong-key"))
    refused = project.mlenv("sync", "-c", "wrong-key", timeout=120)
    assert refused.returncode == 1 and "Permission denied (publickey" in refused.stderr, refused.stderr
    assert "allocation" not in refused.stderr and not (project.workdir / "train_multi_node.py").exists()

    project.ok("sync", "-c", project.name, timeout=120)
    assert (project.workdir / "train_multi_node.py").is_file()
    deployed = project.ok("deploy", project.name, "--timeout", "60", timeout=120)
    match = re.search(r"allocation (\d+) of hpc is running on n\[1-2\]", deployed.stderr)
    assert match, deployed.stderr
    assert [(r["host"], r["phase"]) for r in project.status()] == [("n1", "RUNNING"), ("n2", "RUNNING")]
    shown = project.ok("exec", "-c", project.name, "--", "sh", "-c", 'echo "$SLURMD_NODENAME $MLENV_NODE_RANK"')
    assert sorted(shown.stdout.splitlines()) == ["[node-0] n1 0", "[node-1] n2 1"]
    cleaned = project.ok("clean", "-c", project.name)
    assert f"cancelled job(s) {match[1]} of hpc" in cleaned.stderr
    assert slurm_cluster.job(match[1])["JobState"] == "CANCELLED"

    found = subprocess.run(["ssh-keygen", "-F", login.known_hosts_name, "-f", str(known_hosts)], capture_output=True,
                           text=True, timeout=30, check=False)  # accept-new wrote the key into this file
    assert found.returncode == 0 and " ssh-ed25519 " in found.stdout, found.stdout + found.stderr
    assert "Accepted publickey for root" in login.log.read_text()


def test_a_pending_allocation_shows_its_reason_and_launch_waits_for_it(tmp_path: Path,
                                                                      slurm_cluster: SlurmCluster) -> None:
    project = make_project(tmp_path, slurm_cluster, partition="down")
    waited = project.mlenv("deploy", project.name, "--timeout", "2")
    assert waited.returncode == 1
    match = re.search(r"error: allocation (\d+) of hpc is still PENDING \(PartitionDown: the partition is down\) "
                      r"after 2s; it stays queued: mlenv status shows it; mlenv clean -c hpc cancels it$",
                      waited.stderr, re.MULTILINE)
    assert match, waited.stderr
    allocation = match[1]
    assert [(r["phase"], r["detail"]) for r in project.status()] == [
        ("PENDING", "PartitionDown: the partition is down")] * 2
    process = subprocess.Popen([str(MLENV), "launch", "-c", project.name, "fail.py"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=project.env, cwd=project.home,
                               stdin=subprocess.DEVNULL)
    try:  # launch checked the script (asking Slurm) and made its run directory; then it waits for the allocation
        slurm_cluster.wait(lambda: any((project.home / "runs").glob("*-hpc")), "the run's directory", 60)
        wait_until_polling(process.pid)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130 and f"allocation {allocation} of hpc: PENDING (PartitionDown" in err, err
    assert slurm_cluster.ok("squeue", "-h", "-o", "%i").split() == [allocation]  # never a second job
    project.ok("clean", "-c", project.name)
    assert slurm_cluster.job(allocation)["JobState"] == "CANCELLED"


def test_status_and_clean_touch_only_the_jobs_mlenv_submitted(tmp_path: Path, slurm_cluster: SlurmCluster) -> None:
    project = make_project(tmp_path, slurm_cluster, partition="down")
    job_id = project.submitted(project.ok("launch", "-c", project.name, "--detach", "fail.py").stderr)
    foreign = slurm_cluster.ok("sbatch", "--parsable", "-p", "down", "--wrap", "true").strip()
    (row,) = project.status()
    assert (row["pod"], row["phase"], row["detail"]) == (f"job-{job_id}", "PENDING",
                                                          "PartitionDown: the partition is down")
    assert f"cancelled job(s) {job_id} of hpc" in project.ok("clean", "-c", project.name).stderr
    assert slurm_cluster.job(job_id)["JobState"] == "CANCELLED" and slurm_cluster.state(foreign) == "PENDING"


def test_the_submitting_shell_s_variables_stay_out_of_slurm_s_state(tmp_path: Path,
                                                                      slurm_cluster: SlurmCluster) -> None:
    """A token exported in the shell before deploy and a batch launch is in no file of slurmctld's state (jobs held
    pending in partition down, whose saved environments are there); slurm.export's names are carried."""
    project = make_project(tmp_path, slurm_cluster, partition="down", slurm_extra="  export: [MLENV_CARRIED]\n")
    batch = project.home / "clusters" / "batch.yaml"
    batch.write_text((project.home / "clusters" / "hpc.yaml").read_text().replace("name: hpc", "name: batch"))
    carried = f"carried-{os.getpid()}-{time.time_ns()}"
    env = {**project.env, "MLENV_SHELL_TOKEN": SECRET, "MLENV_CARRIED": carried}
    def mlenv(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(MLENV), *args], capture_output=True, text=True, timeout=60, env=env,
                              cwd=project.home, stdin=subprocess.DEVNULL, check=False)

    deployed = mlenv("deploy", project.name, "--timeout", "1")
    allocation = re.search(r"allocation (\d+) submitted", deployed.stderr)
    assert deployed.returncode == 1 and allocation and "still PENDING" in deployed.stderr, deployed.stderr
    launched = mlenv("launch", "-c", "batch", "--detach", "fail.py")
    assert launched.returncode == 0, launched.stderr
    saved = [path for job_id in (allocation[1], project.submitted(launched.stderr))
             for path in (slurm_cluster.tmp / "state").glob(f"hash.*/job.{job_id}/environment")]
    assert len(saved) == 2 and all(carried.encode() in path.read_bytes() for path in saved), saved
    assert _files_holding(SECRET, slurm_cluster.tmp) == []
    doctor = json.loads(mlenv("doctor", "-c", project.name, "--json").stdout)
    (evidence,) = [c["evidence"] for c in doctor["checks"] if c["name"] == "environment"]
    assert "--export=MLENV_CARRIED" in evidence and "only slurm.export's MLENV_CARRIED" in evidence, evidence
    for name in (project.name, "batch"):
        project.ok("clean", "-c", name)


def test_sbatch_errors_come_verbatim_with_a_hint(tmp_path: Path, slurm_cluster: SlurmCluster) -> None:
    project = make_project(tmp_path, slurm_cluster, partition="nosuch")
    words = ("error: sbatch: error: invalid partition specified: nosuch\n"
             "error: sbatch: error: Batch job submission failed: Invalid partition name specified\n"
             "error: hint: check slurm.partition: `sinfo -s` lists the partitions\n")
    launched = project.mlenv("launch", "-c", project.name, "fail.py")
    assert launched.returncode == 1 and launched.stderr.endswith(
        "error: sbatch refused the job on this machine:\n" + words), launched.stderr
    deployed = project.mlenv("deploy", project.name)
    assert deployed.returncode == 1 and deployed.stderr.endswith(words) and "Traceback" not in deployed.stderr
    assert slurm_cluster.ok("squeue", "-h", "-o", "%i") == ""


def test_doctor(tmp_path: Path, slurm_cluster: SlurmCluster) -> None:
    image = tmp_path / "pytorch.sif"
    image.write_bytes(b"SIF")
    good = make_project(tmp_path / "good", slurm_cluster, gpus=2, extra=f"container: {{image: {image}}}\n")
    report = json.loads(good.ok("doctor", "-c", good.name, "--json").stdout)
    checks = {c["name"]: (c["status"], c["evidence"]) for c in report["checks"]}
    assert list(checks) == ["slurm", "partition", "nodes", "gpus", "time", "workdir", "apptainer", "image",
                            "environment"]
    assert {name: status for name, (status, _) in checks.items() if name != "apptainer"} == dict.fromkeys(
        ("slurm", "partition", "nodes", "gpus", "time", "workdir", "image", "environment"), "PASS")
    assert "--export=NONE" in checks["environment"][1] and "nothing from the shell" in checks["environment"][1]
    assert checks["nodes"][1] == "2 of 2 nodes of debug can run jobs; 2 asked"
    assert checks["image"][1] == f"{image} is there on this machine"
    assert checks["apptainer"][0] == ("PASS" if shutil.which("apptainer") else "WARN")
    bad = make_project(tmp_path / "bad", slurm_cluster, partition="down", gpus=4)
    result = bad.mlenv("doctor", "-c", bad.name, "--json")
    assert result.returncode == 1
    checks = {c["name"]: (c["status"], c["evidence"]) for c in json.loads(result.stdout)["checks"]}
    assert checks["partition"] == ("FAIL", "down is down")
    assert checks["gpus"] == ("FAIL", "0 usable nodes have 4 or more GPUs (gres 2 per node)")
    assert checks["workdir"][0] == "PASS" and os.access(tmp_path, os.W_OK)


def test_status_gpus_and_stacks_through_srun(project: Project, slurm_cluster: SlurmCluster,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.integration.test_stacks import WARM_UP, hanging_job, until_grouped

    monkeypatch.setenv("PATH", f"{ROOT / 'tests' / 'fixtures' / 'nvidia_smi'}{os.pathsep}{os.environ['PATH']}")
    (project.home / "workspace" / "hang.py").write_text(hanging_job("stuck_in_slurm", 1))
    project.ok("sync", "-c", project.name)
    project.ok("deploy", project.name, "--timeout", "60")
    try:
        states = json.loads(project.ok("status", "-c", project.name, "--gpus", "--json").stdout)["gpu_state"]
        assert [(s["node"], s["pod"], len(s["gpus"])) for s in states] == [(0, "n1", 2), (1, "n2", 2)], states
        project.ok("launch", "-c", project.name, "--launcher", "torchrun", "--detach", "hang.py")
        until_grouped(lambda: project.mlenv("stacks", "-c", project.name, "--json", timeout=60), 1,
                      "stuck_in_slurm", 120)
        project.ok("stop", "-c", project.name)
    finally:
        project.mlenv("clean", "-c", project.name)
    # no allocation: stacks reaches a detached batch job's nodes through the job, with the py-spy of the venv that
    # slurm.setup activates, and says which method it used
    project.ok("launch", "-c", project.name, "--launcher", "torchrun", "--detach", "hang.py")
    until_grouped(lambda: project.mlenv("stacks", "-c", project.name, "--json", timeout=60), 1, "stuck_in_slurm", 120)
    named = json.loads(project.ok("stacks", "-c", project.name, "--json", timeout=60).stdout)["collectives"]
    assert named["verdict"] == "behind" and named["unknown"] == [], named  # rank 1, by collective sequence
    assert [(b["rank"], b["last_seq"]) for b in named["groups"][0]["behind"]] == [(1, WARM_UP)], named
    said = project.ok("stacks", "-c", project.name, timeout=60).stdout
    assert re.match(r"run \S+: 4 ranks, sampled by py-spy\n", said), said
    assert f"collectives: ranks 0,2-3 wait in all_reduce #{WARM_UP + 1}; rank 1 last completed #{WARM_UP}" in said, \
        said
    project.ok("stop", "-c", project.name)
