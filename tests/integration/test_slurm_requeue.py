"""Keeping a job alive on a real 3-node Slurm (tests/integration/slurm_cluster.py, nodes n1, n2, n3; each job
takes 2 of them).

Slurm's warning signal, checkpoint and requeue: a detached batch job of 2 nodes x 2 ranks under ``slurm.signal:
"USR1@60"`` and ``slurm.requeue: true`` gets ``scancel --signal=USR1 --batch``; the batch shell passes it to the 4
ranks, which checkpoint and exit while every other process of the step (task shell, runtime, torchrun's agent)
lives on; mlenv requeues the job, and the next attempt (MLENV_RESTART_COUNT 1) resumes from the checkpoints; a
second warning finds the requeues capped (--max-restarts 1) and ends the job. Each attempt has its own exit file.
A requeue the site refuses fails the run with Slurm's words.

Bad nodes left out: a batch job that always fails on one node, under ``--max-restarts 3``, is submitted again
without that node once it failed first twice (attached, by mlenv; detached, by the run's script), and succeeds on the
third node."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.helpers import MLENV
from tests.integration.test_slurm_backend import Project, make_project

if TYPE_CHECKING:
    from tests.integration.slurm_cluster import SlurmCluster

pytest_plugins = ["tests.integration.slurm_cluster"]


@pytest.fixture
def slurm_nodes() -> int:
    """Every test here runs on a Slurm of 3 nodes."""
    return 3

# No torch: attempt 0 waits for the warning, writes its checkpoint and exits; attempt 1 resumes from it (and, with
# --again, waits for the warning again).
CHECKPOINTING_JOB = """\
import os, signal, sys, time
rank, attempt = os.environ["RANK"], int(os.environ["MLENV_RESTART_COUNT"])
checkpoint = os.path.join(os.environ["MLENV_CHECKPOINT_DIR"], f"rank{rank}")
if attempt:
    with open(checkpoint) as saved:
        print(f"rank {rank} attempt {attempt} resumed from step {saved.read()} of run {os.environ['MLENV_RUN_ID']}",
              flush=True)
    if "--again" not in sys.argv:
        sys.exit(0)
def save(signum, frame):
    os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
    with open(checkpoint, "w") as out:
        out.write("7")
    print(f"rank {rank} got {signal.Signals(signum).name}: checkpointed step 7", flush=True)
    sys.exit(0)
signal.signal(getattr(signal, os.environ["MLENV_CHECKPOINT_SIGNAL"]), save)  # slurm.signal's: SIGUSR1
print(f"rank {rank} attempt {attempt} training", flush=True)
time.sleep(300)
print(f"rank {rank} never warned", flush=True)
sys.exit(1)
"""


def test_the_warning_signal_checkpoints_requeues_and_resumes(tmp_path: Path, slurm_cluster: SlurmCluster) -> None:
    project: Project = make_project(tmp_path, slurm_cluster, slurm_extra='  signal: "USR1@60"\n  requeue: true\n')
    (project.home / "workspace" / "ckpt.py").write_text(CHECKPOINTING_JOB)
    project.ok("sync", "-c", project.name)
    started = project.ok("launch", "-c", project.name, "--launcher", "torchrun", "--detach", "--max-restarts", "1",
                         "ckpt.py", "--again", timeout=120)
    job_id = project.submitted(started.stderr)
    script = slurm_cluster.ok("scontrol", "write", "batch_script", job_id, "-")
    assert "#SBATCH --signal=B:USR1@60\n#SBATCH --requeue\n" in script
    (run,) = (project.workdir / ".mlenv" / "runs").iterdir()
    output = run / "output.log"

    def text() -> str:
        return output.read_text() if output.exists() else ""

    slurm_cluster.wait(lambda: text().count("attempt 0 training") == 4, "the 4 ranks to train", 120)
    shown = tmp_path / "followed.log"  # node 0's log, followed from attempt 0 through the requeue to the run's end
    with shown.open("w") as out:
        follower = subprocess.Popen([str(MLENV), "logs", "-c", project.name, "--pod", "0", "-f"],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=project.env,
                                    cwd=project.home)
    slurm_cluster.ok("scancel", "--signal=USR1", "--batch", job_id)
    slurm_cluster.wait(lambda: int(slurm_cluster.job(job_id).get("Restarts", "0")) >= 1, "the requeue", 60)
    attempt0 = text()
    assert "mlenv: got SIGUSR1: passing it to every rank" in attempt0
    # each rank's line, whole and tagged (the supervisor may quote it again as a rank's last line)
    assert set(re.findall(r"rank (\d) got SIGUSR1: checkpointed step 7", attempt0)) == {"0", "1", "2", "3"}, attempt0
    assert f"mlenv: attempt 0 ended after the warning (exit 0): requeueing job {job_id}" in attempt0
    assert (run / "attempt-0" / "exit").read_text() == "0\n"  # torchrun's agent and the runtime lived on
    assert (run / "attempt-0" / "ended").read_text() == "requeued\n"  # the attempt's own record: not succeeded
    # Slurm holds a requeued job back (Reason=BeginTime) until the first attempt's job credential has expired on
    # the nodes (AuthInfo's cred_expire: 120 s by default, 10 s in tests/integration/slurm_cluster.py): starting it
    # earlier (scontrol update StartTime=now) only gets it killed with "Job credential revoked"
    slurm_cluster.wait(lambda: slurm_cluster.job(job_id).get("Reason") == "BeginTime", "the requeued job to wait", 60)
    waiting = project.latest_run()  # the ranks checkpointed and exited 0, but the run is not done
    assert (waiting["state"], waiting["attempt"]) == ("requeued", 0), waiting
    slurm_cluster.wait(lambda: text().count("attempt 1 training") == 4, "the resumed attempt to train", 360)
    slurm_cluster.ok("scancel", "--signal=USR1", "--batch", job_id)  # a second warning: no second requeue
    slurm_cluster.wait(lambda: slurm_cluster.state(job_id) == "", "the resumed attempt to end", 120)
    assert (f"not requeueing job {job_id} again: requeued 1 times, the most --max-restarts 1 allows"
            in text()), text()
    assert (slurm_cluster.job(job_id)["JobState"], project.latest_run()["state"]) == ("FAILED", "failed")
    try:
        followed = follower.wait(timeout=120)
    finally:
        follower.kill()
        follower.wait()
    lines = shown.read_text()
    assert followed == 1, lines  # the run's end: the job was not requeued again
    waiting = lines.index(f"[node-0] mlenv: attempt 0 ended (exit 0); waiting for attempt 1 (job {job_id} requeued)")
    header = lines.index(f"[node-0] mlenv: ==== attempt 1 (MLENV_RESTART_COUNT=1) of run {run.name}, node 0 ====")
    assert lines.index("attempt 0 training") < waiting < header < lines.index("attempt 1 resumed from step 7"), lines
    assert (run / "attempt-1" / "exit").read_text() == "1\n" and (run / "attempt").read_text() == "1\n"
    assert [(run / f"attempt-{k}" / "ended").read_text() for k in (0, 1)] == ["requeued\n", "failed\n"]
    assert sorted(path.name for path in (project.workdir / "checkpoints" / run.name).iterdir()) == [
        "rank0", "rank1", "rank2", "rank3"]
    resumed = re.findall(rf"rank (\d) attempt 1 resumed from step 7 of run {run.name}", text())
    assert set(resumed) == {"0", "1", "2", "3"}
    logs = project.ok("logs", "-c", project.name, timeout=30).stdout
    # mlenv logs shows both attempts of the run, each under its header, every rank of each
    assert set(re.findall(r"rank (\d) got SIGUSR1: checkpointed step 7", logs)) == {"0", "1", "2", "3"}, logs
    assert set(re.findall(r"rank (\d) attempt 1 resumed from step 7", logs)) == {"0", "1", "2", "3"}, logs
    for node in (0, 1):
        first, second = (logs.index(f"mlenv: ==== attempt {k} (MLENV_RESTART_COUNT={k}) of run {run.name}, "
                                    f"node {node} ====") for k in (0, 1))
        assert first < logs.index(f"[node-{node} ", first) < second < logs.index(f"[node-{node} ", second), logs
    (row,) = project.status()
    assert (row["phase"], row["detail"]) == ("FAILED", "exit code 1")


def test_a_requeue_the_site_refuses_fails_the_run_with_slurm_s_words(tmp_path: Path,
                                                                     slurm_cluster: SlurmCluster) -> None:
    """The job asked for its requeue (#SBATCH --requeue), but the site takes it away, as its policy may (here an
    admin's scontrol update): after the warning the ranks checkpoint, the requeue is refused, and the attached
    launch fails with Slurm's own words; nothing runs again."""
    project = make_project(tmp_path, slurm_cluster, slurm_extra='  signal: "USR1@60"\n  requeue: true\n')
    (project.home / "workspace" / "ckpt.py").write_text(CHECKPOINTING_JOB)
    project.ok("sync", "-c", project.name)
    launch = subprocess.Popen([str(MLENV), "launch", "-c", project.name, "--launcher", "torchrun", "ckpt.py"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=project.env, cwd=project.home)
    try:
        runs = project.workdir / ".mlenv" / "runs"

        def training() -> bool:
            logs = list(runs.glob("*/output.log")) if runs.is_dir() else []
            return bool(logs) and logs[0].read_text().count("attempt 0 training") == 4

        slurm_cluster.wait(training, "the 4 ranks to train", 120)
        (job_id,) = project.recorded_jobs()
        slurm_cluster.ok("scontrol", "update", f"JobId={job_id}", "Requeue=0")
        slurm_cluster.ok("scancel", "--signal=USR1", "--batch", job_id)
        out, err = launch.communicate(timeout=120)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.communicate()
    assert launch.returncode == 1, out + err
    assert f"mlenv: scontrol requeue {job_id} failed" in out, out
    assert f"Requested operation is presently disabled for job {job_id}" in out, out
    assert set(re.findall(r"rank (\d) got SIGUSR1: checkpointed step 7", out)) == {"0", "1", "2", "3"}, out
    job = slurm_cluster.job(job_id)
    assert (job["JobState"], job["ExitCode"], job["Restarts"]) == ("FAILED", "1:0", "0")
    assert project.latest_run()["state"] == "failed"  # every rank exited 0 after its checkpoint; the job failed


def test_a_grace_that_runs_out_says_so(tmp_path: Path, slurm_cluster: SlurmCluster) -> None:
    """Ranks that ignore the warning are stopped when the grace (3 of the warning's 4 s) runs out: the output and the
    attempt's grace file say so, and the job is requeued."""
    project = make_project(tmp_path, slurm_cluster, slurm_extra='  signal: "USR1@4"\n  requeue: true\n')
    project.ok("sync", "-c", project.name)
    job_id = project.submitted(project.ok("launch", "-c", project.name, "--detach", "fail.py").stderr)
    runs = project.workdir / ".mlenv" / "runs"

    def output() -> str:
        found = list(runs.glob("*/output.log")) if runs.is_dir() else []
        return found[0].read_text() if found else ""

    slurm_cluster.wait(lambda: output().count("sleeping") == 4, "the 4 ranks to sleep", 120)
    slurm_cluster.ok("scancel", "--signal=USR1", "--batch", job_id)
    slurm_cluster.wait(lambda: int(slurm_cluster.job(job_id).get("Restarts", "0")) >= 1, "the requeue", 60)
    said = "mlenv: the ranks did not end within the grace of 3 s after the warning: stopping them\n"
    (grace,) = runs.glob("*/attempt-0/grace")
    assert said in output() and grace.read_text() == said, output()
    project.ok("clean", "-c", project.name)


def test_doctor_checks_that_jobs_may_be_requeued(tmp_path: Path, slurm_cluster: SlurmCluster) -> None:
    from mlenv.backends.slurm.checks import requeue_check

    project = make_project(tmp_path, slurm_cluster, slurm_extra="  requeue: true\n")
    report = json.loads(project.ok("doctor", "-c", project.name, "--json").stdout)
    checks = {c["name"]: (c["status"], c["evidence"]) for c in report["checks"]}
    assert checks["requeue"] == ("PASS", "JobRequeue=1: batch jobs may be requeued")
    # this Slurm's own configuration, as a site that forbids requeues by default would show it
    config = slurm_cluster.ok("scontrol", "show", "config")
    assert re.search(r"^JobRequeue\s*=\s*1$", config, re.MULTILINE)
    forbidding = re.sub(r"^(JobRequeue\s*=\s*)1$", r"\g<1>0", config, flags=re.MULTILINE)
    check = requeue_check(forbidding)
    assert check.status == "WARN" and "this Slurm has JobRequeue=0" in check.evidence
    without = make_project(tmp_path / "plain", slurm_cluster)
    plain = json.loads(without.ok("doctor", "-c", without.name, "--json").stdout)
    assert "requeue" not in {c["name"] for c in plain["checks"]}


# No torch: the nodes named in argv[1] (comma-separated) always fail, wherever Slurm puts the job.
PICKY_JOB = """\
import os, sys
host, attempt = os.environ["SLURMD_NODENAME"], os.environ["MLENV_RESTART_COUNT"]
if host in sys.argv[1].split(","):
    print(f"attempt {attempt}: {host} is broken", flush=True)
    sys.exit(5)
print(f"attempt {attempt}: ok on {host} as node {os.environ['MLENV_NODE_RANK']}", flush=True)
"""


def test_a_node_that_fails_first_twice_is_left_out_of_the_next_attempt(tmp_path: Path,
                                                                        slurm_cluster: SlurmCluster) -> None:
    """2 of the 3 nodes: Slurm gives the job n1 and n2, n2 fails first twice, the third attempt runs on n1 and n3."""
    project = make_project(tmp_path, slurm_cluster)
    (project.home / "workspace" / "picky.py").write_text(PICKY_JOB)
    project.ok("sync", "-c", project.name)
    result = project.mlenv("launch", "-c", project.name, "--launcher", "torchrun", "--nproc", "1", "--max-restarts",
                           "3", "picky.py", "n2", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "attempt 0: n2 is broken" in result.stdout and "attempt 1: n2 is broken" in result.stdout
    assert "excluding n2 (node-1) from the next attempts: it failed first in 2 attempts of the run" in result.stderr
    assert "attempt 2 of at most 3 restarts (MLENV_RESTART_COUNT=2) without n2" in result.stderr
    assert set(re.findall(r"attempt 2: ok on (n\d)", result.stdout)) == {"n1", "n3"}, result.stdout
    assert "attempt 2: n2" not in result.stdout and "attempt 3" not in result.stdout
    jobs = project.recorded_jobs()
    assert len(jobs) == 3
    assert [slurm_cluster.job(job)["NodeList"] for job in jobs] == ["n[1-2]", "n[1-2]", "n[1,3]"]
    assert "#SBATCH --exclude=n2\n" in slurm_cluster.ok("scontrol", "write", "batch_script", jobs[-1], "-")
    # without a node-fault sign, n2 is left out of this run only: nothing is recorded for later runs
    status = json.loads(project.ok("status", "-c", project.name, "--json").stdout)
    assert status["excluded"] == [] and "excluded:" not in project.ok("status", "-c", project.name).stdout
    assert json.loads(project.ok("nodes", "-c", project.name, "--json").stdout)["excluded"] == []


# No torch: node 1 fails the first attempt only.
FLAKY_JOB = """\
import os, sys
attempt = int(os.environ["MLENV_RESTART_COUNT"])
print(f"attempt {attempt} of run {os.environ['MLENV_RUN_ID']} on {os.environ['SLURMD_NODENAME']}", flush=True)
sys.exit(3 if attempt == 0 and os.environ["MLENV_NODE_RANK"] == "1" else 0)
"""


def detached(project: Project, slurm_cluster: SlurmCluster, job: str, *args: str) -> tuple[Path, dict[str, str]]:
    """Launch ``job`` detached under --max-restarts 3 (1 process a node); its run directory and how the job
    ended."""
    project.ok("sync", "-c", project.name)
    started = project.ok("launch", "-c", project.name, "--launcher", "torchrun", "--nproc", "1", "--detach",
                         "--max-restarts", "3", job, *args, timeout=120)
    assert "not restarted" not in started.stderr, started.stderr
    job_id = project.submitted(started.stderr)
    ended = slurm_cluster.wait_finished(job_id, 120)
    (run,) = (project.workdir / ".mlenv" / "runs").iterdir()
    return run, ended


def test_the_batch_script_restarts_a_detached_run(tmp_path: Path, slurm_cluster: SlurmCluster) -> None:
    project = make_project(tmp_path, slurm_cluster)
    (project.home / "workspace" / "flaky.py").write_text(FLAKY_JOB)
    run, ended = detached(project, slurm_cluster, "flaky.py")
    assert (ended["JobState"], ended["ExitCode"]) == ("COMPLETED", "0:0"), ended
    output = (run / "output.log").read_text()
    assert "mlenv: node 1 failed first, with exit code 3\n" in output, output
    assert ("mlenv: attempt 0 failed with exit code 3: restarting the run, attempt 1 of at most 3 restarts "
            "(MLENV_RESTART_COUNT=1)\n") in output, output
    assert [(run / f"attempt-{k}" / "exit").read_text() for k in (0, 1)] == ["3\n", "0\n"]
    assert [(run / f"attempt-{k}" / "ended").read_text() for k in (0, 1)] == ["failed\n", "succeeded\n"]
    assert (run / "attempt").read_text() == "1\n" and not (run / "attempt-2").exists()
    logs = project.ok("logs", "-c", project.name, timeout=30).stdout
    for node in (0, 1):  # each attempt of each node under its header, the same run
        first, second = (logs.index(f"mlenv: ==== attempt {k} (MLENV_RESTART_COUNT={k}) of run {run.name}, "
                                    f"node {node} ====") for k in (0, 1))
        assert first < logs.index(f"attempt 0 of run {run.name}", first) < second, logs
        assert second < logs.index(f"attempt 1 of run {run.name}", second), logs
    (row,) = project.status()
    assert (row["phase"], row["detail"]) == ("COMPLETED", "exit code 0")
    latest = json.loads(project.ok("status", "-c", project.name, "--json").stdout)["latest_run"]
    found = latest["goodput"]  # every attempt's records, read in the one look at the shared run directory
    assert found["attempts"] == 2 and abs(sum(found["phases"].values()) - found["wall"]) <= 0.05 * found["wall"], found


# No torch: node 1 fails attempt 0 (once the test says go) with 3 and attempt 1 with 4; node 0 waits to be stopped.
FOLLOWED_JOB = """\
import os, sys, time
attempt, node = int(os.environ["MLENV_RESTART_COUNT"]), os.environ["MLENV_NODE_RANK"]
print(f"attempt {attempt} of node {node} started", flush=True)
while node == "1" and attempt == 0 and not os.path.exists("go"):
    time.sleep(0.1)
if node == "1":
    sys.exit(3 + attempt)
time.sleep(300)
"""


def test_logs_follow_a_detached_batch_run_through_its_restart_to_its_end(tmp_path: Path,
                                                                         slurm_cluster: SlurmCluster) -> None:
    """mlenv logs -f of a detached batch run under --max-restarts 1, started while attempt 0 runs: it shows attempt
    0's lines, says that it waits for attempt 1 (which the run's script starts in the same job), shows attempt 1
    under its header and ends with the run's final exit code (attempt 1's 4, not attempt 0's 3)."""
    project = make_project(tmp_path, slurm_cluster)
    (project.home / "workspace" / "followed.py").write_text(FOLLOWED_JOB)
    project.ok("sync", "-c", project.name)
    started = project.ok("launch", "-c", project.name, "--launcher", "torchrun", "--nproc", "1", "--detach",
                         "--max-restarts", "1", "followed.py", timeout=120)
    job_id = project.submitted(started.stderr)
    runs = project.workdir / ".mlenv" / "runs"


    def training() -> bool:
        logs = list(runs.glob("*/attempt-0/node*/output.log"))
        return len(logs) == 2 and all("started" in log.read_text() for log in logs)

    slurm_cluster.wait(training, "attempt 0 to start on both nodes", 120)
    shown = tmp_path / "followed.log"
    with shown.open("w") as out:
        follower = subprocess.Popen([str(MLENV), "logs", "-c", project.name, "-f"], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, env=project.env, cwd=project.home)
    try:
        slurm_cluster.wait(lambda: "attempt 0 of node 1 started" in shown.read_text(), "the follower's first line",
                           120)
        (project.workdir / "go").touch()  # attempt 0 ends while it is followed
        code = follower.wait(timeout=120)
    finally:
        follower.kill()
        follower.wait()
    logs = shown.read_text()
    assert code == 4, logs
    (run,) = runs.iterdir()
    for node in (0, 1):
        waiting = logs.index(f"[node-{node}] mlenv: attempt 0 ended (exit 3); waiting for attempt 1 (job {job_id} "
                             "restarts the run)")
        header = logs.index(f"mlenv: ==== attempt 1 (MLENV_RESTART_COUNT=1) of run {run.name}, node {node} ====")
        assert logs.index(f"attempt 0 of node {node} started") < waiting < header, logs
        assert header < logs.index(f"attempt 1 of node {node} started"), logs
    assert [(run / f"attempt-{k}" / "exit").read_text() for k in (0, 1)] == ["3\n", "4\n"]
    assert (run / "attempt-0" / "next").read_text() == f"job {job_id} restarts the run\n"
    assert not (run / "attempt-1" / "next").exists()
    assert slurm_cluster.wait_finished(job_id, 60)["ExitCode"] == "4:0"


def test_a_detached_run_goes_on_in_a_batch_job_without_the_node_that_failed_first_twice(
        tmp_path: Path, slurm_cluster: SlurmCluster) -> None:
    """Detached, with no terminal waiting: after n2 failed first in attempts 0 and 1 (job X on n[1-2]), the run's
    script submits job Y with --exclude=n2, to start once X has handed the run on; attempt 2 runs on n1 and n3 and
    succeeds. mlenv finds Y in the run's directory: status shows both jobs (n2 is not recorded as excluded: it failed
    without a node-fault sign), logs every attempt."""
    project = make_project(tmp_path, slurm_cluster)
    (project.home / "workspace" / "picky.py").write_text(PICKY_JOB)
    run, ended = detached(project, slurm_cluster, "picky.py", "n2")
    assert (ended["JobState"], ended["ExitCode"], ended["NodeList"]) == ("COMPLETED", "0:0", "n[1-2]"), ended
    output = (run / "output.log").read_text()
    assert output.count("mlenv: node 1 failed first, with exit code 5\n") == 2, output
    assert ("mlenv: excluding n2 (node-1) from the next attempts: it failed first in 2 attempts of the run\n"
            in output), output
    found = re.search(r"^mlenv: attempt 2 of at most 3 restarts submitted as batch job (\d+), without n2 "
                      r"\(MLENV_RESTART_COUNT=2\)$", output, re.MULTILINE)
    assert found, output
    following = found[1]
    assert slurm_cluster.job(following)["ExcNodeList"] == "n2"
    last = slurm_cluster.wait_finished(following, 120)
    assert (last["JobState"], last["ExitCode"], last["NodeList"]) == ("COMPLETED", "0:0", "n[1,3]"), last
    output = (run / "output.log").read_text()
    assert set(re.findall(r"attempt 2: ok on (n\d) as node", output)) == {"n1", "n3"}, output
    assert "attempt 2: n2" not in output and not (run / "attempt-3").exists()
    assert [(run / f"attempt-{k}" / "exit").read_text() for k in (0, 1, 2)] == ["5\n", "5\n", "0\n"]
    assert (run / "attempt").read_text() == "2\n"
    # mlenv follows the run into the job its script submitted, and records the node it left out
    status = json.loads(project.ok("status", "-c", project.name, "--json").stdout)
    assert project.recorded_jobs() == [ended["JobId"], following]
    rows = {row["pod"]: (row["phase"], row["detail"]) for row in status["pods"]}
    assert rows == {f"job-{ended['JobId']}": ("COMPLETED", f"its run went on as job {following}, without a node "
                                                            "the restart policy left out"),
                    f"job-{following}": ("COMPLETED", "exit code 0")}, rows
    assert status["excluded"] == [], status["excluded"]  # left out of this run only (no node-fault sign)
    assert status["latest_run"]["attempt"] == 2, status["latest_run"]
    logs = project.ok("logs", "-c", project.name, timeout=30).stdout
    for k in (0, 1, 2):
        assert f"mlenv: ==== attempt {k} (MLENV_RESTART_COUNT={k}) of run {run.name}, node 1 ====" in logs, logs
    assert "attempt 2: ok on n3 as node 1" in logs, logs
