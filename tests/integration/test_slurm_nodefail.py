"""A node lost mid-run on a real 3-node Slurm (tests/integration/slurm_cluster.py, nodes n1, n2, n3; each run takes
2 of them): ``scontrol update nodename=n2 state=down`` while an attached ``--max-restarts 1`` run trains on n1 and
n2. Slurm takes n2 out of the job (mlenv's jobs are ``--no-kill``: the job goes on with the others) and kills the
run's step; the run's script asks the restart policy with the job's nodes and n2's state, which gives n2 the
``node-failure`` sign (the attempt's ``lost.json``, ``latest_run.node_faults``); the run is restarted without n2
(exit 0), never taken for a user's stop, and ``mlenv nodes`` names n2: inside an allocation deployed with a spare
on the spare (n3), as a batch job on the third node (``--exclude=n2``); detached, the run's script does the same.
A spare takes the node rank of the node it replaces.
Each attempt's directory records how it ended (``node-failure``, then ``succeeded``)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.helpers import MLENV
from tests.integration.test_slurm_backend import Project, make_project
from tests.integration.test_slurm_requeue import PICKY_JOB

if TYPE_CHECKING:
    from tests.integration.slurm_cluster import SlurmCluster

pytest_plugins = ["tests.integration.slurm_cluster"]

LOST = "n2"
SIGN = f"node failure: Slurm took {LOST} out of the job"
"""How the sign of n2 begins (Slurm may also still say it is down when the script asks)."""

# No torch: attempt 0 trains until its step is killed; a later attempt says where it ran.
LOSING_JOB = """\
import os, sys, time
host, attempt = os.environ["SLURMD_NODENAME"], int(os.environ["MLENV_RESTART_COUNT"])
if attempt == 0:
    print(f"attempt 0 training on {host}", flush=True)
    time.sleep(300)
    sys.exit(1)
print(f"attempt {attempt}: ok on {host} as node {os.environ['MLENV_NODE_RANK']}", flush=True)
"""


@pytest.fixture
def slurm_nodes() -> int:
    """Every test here runs on a Slurm of 3 nodes."""
    return 3


@pytest.fixture
def losing(tmp_path: Path, slurm_cluster: SlurmCluster) -> Iterator[Project]:
    """A project with the losing job; afterwards n2 is back in service (slurmd there never stopped: it returns as
    soon as it registers again, or when resumed)."""
    project = make_project(tmp_path, slurm_cluster)
    (project.home / "workspace" / "losing.py").write_text(LOSING_JOB)
    yield project
    slurm_cluster.run("scontrol", "update", f"nodename={LOST}", "state=resume")  # refused where it is back already
    slurm_cluster.wait(lambda: "idle" in slurm_cluster.ok("sinfo", "-h", "-N", "-n", LOST, "-o", "%T"),
                       f"{LOST} to be idle again")


def _lose_n2_mid_run(project: Project, slurm_cluster: SlurmCluster) -> subprocess.CompletedProcess[str]:
    """An attached ``launch --max-restarts 1`` of the losing job; once both nodes train, n2 is set down."""
    argv = [str(MLENV), "launch", "-c", project.name, "--launcher", "torchrun", "--nproc", "1", "--max-restarts", "1",
            "losing.py"]
    launch = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=project.env, cwd=project.home)
    runs = project.workdir / ".mlenv" / "runs"
    try:
        def training() -> bool:
            logs = runs.glob("*/attempt-0/node*/output.log") if runs.is_dir() else []
            return sum(log.read_text().count("attempt 0 training on") for log in logs) == 2

        slurm_cluster.wait(training, "both nodes to train", 120)
        slurm_cluster.ok("scontrol", "update", f"nodename={LOST}", "state=down", "reason=mlenv-test")
        out, err = launch.communicate(timeout=240)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.communicate()
    return subprocess.CompletedProcess(argv, launch.returncode, out, err)


def _lost_recorded(project: Project) -> None:
    """n2 is excluded on the deployment (or the cluster) with its sign, and attempt 0's lost.json holds the sign."""
    excluded = json.loads(project.ok("nodes", "-c", project.name, "--json").stdout)["excluded"]
    assert [entry["host"] for entry in excluded] == [LOST], excluded
    assert str(excluded[0]["reason"]).startswith(SIGN), excluded
    (run,) = [attempt.parent for attempt in (project.workdir / ".mlenv" / "runs").glob("*/attempt-0")]
    lost = json.loads((run / "attempt-0" / "lost.json").read_text())
    assert list(lost) == ["1"] and lost["1"]["sign"] == "node-failure", lost
    assert (run / "attempt").read_text() == "1\n" and (run / "attempt-1" / "exit").read_text() == "0\n"
    # each attempt's own record of how it ended
    assert [(run / f"attempt-{k}" / "ended").read_text() for k in (0, 1)] == ["node-failure\n", "succeeded\n"]


def test_a_node_set_down_mid_run_is_restarted_without_it_on_the_allocation_s_spare(
        losing: Project, slurm_cluster: SlurmCluster) -> None:
    project = losing
    project.ok("deploy", project.name, "--spares", "1", "--timeout", "60", timeout=120)
    project.ok("sync", "-c", project.name)
    result = _lose_n2_mid_run(project, slurm_cluster)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "mlenv: lost to the infrastructure in attempt 0: n2 (node-1): " + SIGN in result.stdout, result.stdout
    assert f"excluding {LOST} (node-1) from the next attempts: {SIGN}" in result.stderr, result.stderr
    assert "(this run only" not in result.stderr  # a node-fault sign: recorded for later runs
    assert f"node-1: {LOST} excluded ({SIGN}" in result.stderr and "using spare n3" in result.stderr, result.stderr
    assert "attempt 1: ok on n1 as node 0" in result.stdout and "attempt 1: ok on n3 as node 1" in result.stdout
    assert "stopped" not in project.latest_run()["state"]
    assert project.recorded_jobs() == []  # every attempt ran inside the allocation, which held on
    _lost_recorded(project)
    # the allocation held on, without n2
    assert slurm_cluster.ok("squeue", "-h", "-o", "%T %N").split() == ["RUNNING", "n[1,3]"]
    project.ok("clean", "-c", project.name, timeout=120)


def test_a_node_set_down_mid_run_is_restarted_without_it_as_a_batch_job(losing: Project,
                                                                         slurm_cluster: SlurmCluster) -> None:
    project = losing
    project.ok("sync", "-c", project.name)
    result = _lose_n2_mid_run(project, slurm_cluster)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"excluding {LOST} (node-1) from the next attempts: {SIGN}" in result.stderr, result.stderr
    assert "attempt 1: ok on n1 as node 0" in result.stdout and "attempt 1: ok on n3 as node 1" in result.stdout
    first, second = project.recorded_jobs()
    assert slurm_cluster.job(first)["NodeList"] == "n1"  # --no-kill: the job went on without n2, and ended
    assert "#SBATCH --exclude=n2\n" in slurm_cluster.ok("scontrol", "write", "batch_script", second, "-")
    assert slurm_cluster.job(second)["NodeList"] == "n[1,3]"
    _lost_recorded(project)


def test_a_detached_run_in_an_allocation_that_lost_a_node_reads_failed_with_its_sign(
        losing: Project, slurm_cluster: SlurmCluster) -> None:
    """Without a spare and without restarts, the run's script ends the run; once its step is gone, status says what
    the scheduler did (the attempt's record: a node failure), not what the killed supervisors last wrote (running),
    nor a user's stop."""
    project = losing
    project.ok("deploy", project.name, "--timeout", "60", timeout=120)
    project.ok("sync", "-c", project.name)
    project.ok("launch", "-c", project.name, "--launcher", "torchrun", "--nproc", "1", "--detach", "losing.py",
               timeout=120)
    (run,) = (project.workdir / ".mlenv" / "runs").glob("2*")
    slurm_cluster.wait(lambda: (run / "output.log").exists()
                       and (run / "output.log").read_text().count("attempt 0 training on") == 2, "both to train", 120)
    slurm_cluster.ok("scontrol", "update", f"nodename={LOST}", "state=down", "reason=mlenv-test")
    slurm_cluster.wait(lambda: (run / "attempt-0" / "exit").exists(), "the run's script to end the attempt", 120)
    assert (run / "attempt-0" / "ended").read_text() == "node-failure\n"
    latest = project.latest_run()
    assert latest["state"] == "failed", latest
    assert latest["node_faults"]["1"]["sign"] == "node-failure", latest["node_faults"]
    assert str(latest["node_faults"]["1"]["evidence"]).startswith(f"Slurm took {LOST} out of the job"), latest
    project.ok("clean", "-c", project.name, timeout=120)


def test_a_detached_run_in_an_allocation_that_lost_a_node_goes_on_on_the_spare_and_nodes_names_it(
        losing: Project, slurm_cluster: SlurmCluster) -> None:
    """The run's launch script moves node 1 onto the spare (n3), which takes node 1's rank; ``mlenv nodes``, the
    first command after, records and names n2 (read once: forgotten, it stays forgotten)."""
    project = losing
    project.ok("deploy", project.name, "--spares", "1", "--timeout", "60", timeout=120)
    project.ok("sync", "-c", project.name)
    project.ok("launch", "-c", project.name, "--launcher", "torchrun", "--nproc", "1", "--detach", "--max-restarts",
               "1", "losing.py", timeout=120)
    (run,) = (project.workdir / ".mlenv" / "runs").glob("2*")
    slurm_cluster.wait(lambda: (run / "output.log").exists()
                       and (run / "output.log").read_text().count("attempt 0 training on") == 2, "both to train", 120)
    slurm_cluster.ok("scontrol", "update", f"nodename={LOST}", "state=down", "reason=mlenv-test")
    slurm_cluster.wait(lambda: (run / "attempt-1" / "exit").exists(), "attempt 1 to end", 120)
    output = (run / "output.log").read_text()
    assert "attempt 1: ok on n3 as node 1" in output and "attempt 1: ok on n1 as node 0" in output, output
    _lost_recorded(project)
    project.ok("nodes", "-c", project.name, "--forget-excluded")
    assert json.loads(project.ok("nodes", "-c", project.name, "--json").stdout)["excluded"] == []
    project.ok("clean", "-c", project.name, timeout=120)


def test_a_detached_batch_run_that_lost_a_node_goes_on_in_a_batch_job_without_it(
        losing: Project, slurm_cluster: SlurmCluster) -> None:
    """Detached, no terminal waits: the run's script submits the next attempt as a batch job with --exclude=n2, and
    mlenv, when it next looks (status), records the new job as the run's and n2 as excluded."""
    project = losing
    project.ok("sync", "-c", project.name)
    started = project.ok("launch", "-c", project.name, "--launcher", "torchrun", "--nproc", "1", "--detach",
                         "--max-restarts", "1", "losing.py", timeout=120)
    first = project.submitted(started.stderr)
    (run,) = (project.workdir / ".mlenv" / "runs").glob("2*")
    slurm_cluster.wait(lambda: (run / "output.log").exists()
                       and (run / "output.log").read_text().count("attempt 0 training on") == 2, "both to train", 120)
    slurm_cluster.ok("scontrol", "update", f"nodename={LOST}", "state=down", "reason=mlenv-test")
    slurm_cluster.wait(lambda: (run / "resubmitted").exists(), "the next attempt to be submitted", 120)
    second = (run / "resubmitted").read_text().split()[0]
    assert slurm_cluster.wait_finished(second, 120)["NodeList"] == "n[1,3]"
    output = (run / "output.log").read_text()
    assert f"mlenv: excluding {LOST} (node-1) from the next attempts: {SIGN}" in output, output
    assert "attempt 1: ok on n3 as node 1" in output, output
    assert slurm_cluster.job(first)["JobState"] == "COMPLETED"  # it handed the run on
    status = json.loads(project.ok("status", "-c", project.name, "--json").stdout)
    assert project.recorded_jobs() == [first, second]
    assert status["latest_run"]["state"] == "succeeded", status["latest_run"]
    _lost_recorded(project)


def test_a_spare_takes_the_node_rank_of_the_node_it_replaces(tmp_path: Path, slurm_cluster: SlurmCluster) -> None:
    """n1 (node 0) fails first twice; attempt 2 runs with the spare n3 as node 0, and n2 stays node 1, though Slurm
    numbers n2 first in the step (its SLURM_NODEID 0): each node's ranks, and checkpoints, stay where they were."""
    project = make_project(tmp_path, slurm_cluster)
    (project.home / "workspace" / "picky.py").write_text(PICKY_JOB)
    project.ok("deploy", project.name, "--spares", "1", "--timeout", "60", timeout=120)
    project.ok("sync", "-c", project.name)
    result = project.mlenv("launch", "-c", project.name, "--launcher", "torchrun", "--nproc", "1", "--max-restarts",
                           "3", "picky.py", "n1", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "node-0: n1 excluded (it failed first in 2 attempts of the run), using spare n3" in result.stderr
    assert "[node-0 r0] attempt 2: ok on n3 as node 0" in result.stdout, result.stdout
    assert "[node-1 r1] attempt 2: ok on n2 as node 1" in result.stdout, result.stdout
    project.ok("clean", "-c", project.name, timeout=120)
