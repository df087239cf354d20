"""The drill, a frozen node and a straggler on a real Slurm (tests/integration/slurm_cluster.py: nodes n1 and n2),
2 nodes x 2 ranks, CPU torch/gloo, through the real ``mlenv`` command, inside an allocation from ``mlenv deploy``
(one for the module, ``launch.node_silence`` 8 s): ``mlenv drill --fault F --json`` reports every phase with a time
and PASS on the default targets, and a timeline picture, for a rank that exits, a lost node and a frozen node
(the other faults: test_ssh_drill), put in from outside (the runtime's ``fault`` verb, run on the node through
``srun --overlap`` in the allocation) or made by the job; an attached launch whose node 1 is frozen (its
supervisor and ranks SIGSTOPped, found through their cgroup) names node 1 lost and ends within 60 s; a detached
run whose node 0 is frozen names node 0 alone and reads failed, node 1 recording its own stop; a batch job of
a cluster file with slurm.signal and slurm.requeue drills a preemption (the warning signal, the job requeued); a
rank 3x slower per step is named a straggler within 60 s, and a job of equal ranks names none."""

from __future__ import annotations

import json
import random
import re
import signal
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.helpers import MLENV
from tests.integration.test_drill import check_drill
from tests.integration.test_frozen_node import JOB as STEPS_JOB
from tests.integration.test_frozen_node import freeze_node_1, node_share, signal_share
from tests.integration.test_slurm_backend import Project, make_project
from tests.integration.test_stragglers import JOB as STRAGGLER_JOB

if TYPE_CHECKING:
    from tests.integration.slurm_cluster import SessionClusters

pytest_plugins = ["tests.integration.slurm_cluster"]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, slurm_clusters: SessionClusters) -> Iterator[Project]:
    """A project deployed as an allocation of n1 and n2 (node silence 8 s), the frozen node's job synced."""
    made = make_project(tmp_path_factory.mktemp("slurm-drill"), slurm_clusters.get(2), name="sdrill",
                        extra="launch: {node_silence: 8}\n")
    (made.home / "workspace" / "steps.py").write_text(STEPS_JOB)
    made.ok("sync", "-c", made.name)
    made.ok("deploy", made.name, "--timeout", "60")
    yield made
    made.mlenv("stop", "-c", made.name)
    made.mlenv("clean", "-c", made.name, timeout=120)


@pytest.mark.parametrize("fault", ["rank-kill", "node-loss"])
def test_the_drill_as_a_batch_job(fault: str, tmp_path_factory: pytest.TempPathFactory,
                                  slurm_clusters: SessionClusters) -> None:
    """Without an allocation the drill's run is a batch job: the faults reach its nodes through the job (before the
    module's allocation, which holds both nodes)."""
    batch = make_project(tmp_path_factory.mktemp("slurm-drill-batch"), slurm_clusters.get(2), name="sbdrill")
    batch.ok("sync", "-c", batch.name)
    check_drill(batch, fault, "-c", batch.name)


def test_the_drill_preempts_a_batch_job_with_slurm_s_warning(tmp_path_factory: pytest.TempPathFactory,
                                                              slurm_clusters: SessionClusters) -> None:
    """slurm.signal and slurm.requeue: the drill sends the batch job its warning (scancel --signal --batch), every
    node checkpoints and the job requeues itself; Slurm holds a requeued job until its credential expired on the
    nodes (120 s by default, 10 s in the harness), so this cluster file gives the resumption 300 s."""
    batch = make_project(tmp_path_factory.mktemp("slurm-drill-preempt"), slurm_clusters.get(2), name="spdrill",
                         slurm_extra='  signal: "USR1@60"\n  requeue: true\n',
                         extra="drill: {targets: {resumed: 300}}\n")
    batch.ok("sync", "-c", batch.name)
    drill = check_drill(batch, "preempt", "-c", batch.name)
    detected, checkpointed = drill["phases"][:2]
    assert re.fullmatch(r"batch job \d+ sent SIGUSR1 \(slurm\.signal\): the run recorded requeued",
                        detected["evidence"]), detected
    assert re.fullmatch(r"node 1 checkpointed step \d+ after SIGUSR1", checkpointed["evidence"]), checkpointed
    assert checkpointed["target"] == 22.5  # half the ranks' grace: three quarters of the warning's 60 s


# Each backend drills a node loss and shares the other faults with the others (test_ssh_drill: rank-kill, hang).
@pytest.mark.parametrize("fault", ["rank-exit", "node-loss", "node-freeze"])
def test_the_drill(project: Project, fault: str) -> None:
    check_drill(project, fault)


def test_a_preemption_is_not_drilled_here(project: Project) -> None:
    refused = project.mlenv("drill", "-c", project.name, "--fault", "preempt")
    assert refused.returncode == 2 and "the slurm backend cannot" in refused.stderr, refused.stderr
    assert "slurm.signal" in refused.stderr and "Traceback" not in refused.stderr


def test_a_frozen_node_is_named_lost_and_the_launch_ends(project: Project) -> None:
    done, ended = freeze_node_1([str(MLENV), "launch", "-c", project.name, "--launcher", "torchrun", "steps.py"],
                                project.home, dict(project.env), project.workdir)
    err = done.stderr
    assert done.returncode != 0 and ended < 60, (ended, done.stdout[-2000:], err[-3000:])
    assert "error: node-1 was lost (unreachable: node 0 heard nothing from it for 8 s)" in err, err[-3000:]
    assert project.latest_run()["node_faults"]["1"]["sign"] == "unreachable"


@pytest.mark.timing
def test_a_rank_three_times_slower_is_named_a_straggler(project: Project) -> None:
    straggler = random.Random().randrange(4)  # noqa: S311 - a test's choice, not a secret
    (project.home / "workspace" / "slow.py").write_text(STRAGGLER_JOB.format(slow=0.15, straggler=straggler))
    project.ok("sync", "-c", project.name)
    project.ok("launch", "-c", project.name, "--detach", "--launcher", "torchrun", "slow.py")
    until = time.monotonic() + 60
    try:
        while not (named := project.latest_run().get("stragglers")):
            assert time.monotonic() < until, f"no straggler named within 60 s: {project.latest_run()}"
            time.sleep(1)
    finally:
        project.ok("stop", "-c", project.name)
    assert [entry.get("rank") for entry in named] == [straggler], named
    assert "is a straggler" in named[0]["text"]


@pytest.mark.timing
def test_equal_ranks_name_no_straggler(project: Project) -> None:
    (project.home / "workspace" / "equal.py").write_text(STRAGGLER_JOB.format(slow=0.05, straggler=-1))
    project.ok("sync", "-c", project.name)
    project.ok("launch", "-c", project.name, "--detach", "--launcher", "torchrun", "equal.py")
    until = time.monotonic() + 90
    try:  # judged: a verdict while the run still runs (the watch's, not an ended run's empty list)
        while not (isinstance((run := project.latest_run()).get("stragglers"), list)
                   and (run["stragglers"] or run.get("state") == "running")):
            assert time.monotonic() < until, f"not judged within 90 s: {run}"
            time.sleep(1)
    finally:
        project.ok("stop", "-c", project.name)
    assert run["stragglers"] == [], run["stragglers"]


def test_a_frozen_node_0_of_a_detached_run_in_the_allocation_is_named(project: Project) -> None:
    """Detached inside the allocation, no restarts: node 0's share frozen, node 1 names it lost within 30 s and
    stops; srun's stop then thaws and stops node 0. The run's records name node 0 alone (``latest_run.node_faults``,
    as on the other backends), it reads ``failed`` from then on, never ``running`` nor ``stopped``, and node 1, which
    stopped for it, records ``stopped`` itself: no culprit. Only this test drives a frozen node 0 through srun's
    stop (the local one: tests/integration/test_frozen_node.py)."""
    since = time.time()
    project.ok("launch", "-c", project.name, "--launcher", "torchrun", "--detach", "steps.py")
    share = node_share(project.workdir, 0, since)
    try:
        signal_share(share, signal.SIGSTOP)
        froze = time.monotonic()
        while "0" not in (run := project.latest_run())["node_faults"]:
            assert time.monotonic() - froze < 30, run
            time.sleep(0.5)
        silent = {"sign": "unreachable", "evidence": "node 1 heard nothing from it for 8 s"}
        assert run["node_faults"]["0"] == silent, run["node_faults"]
        attempt = project.workdir / ".mlenv" / "runs" / run["id"] / "attempt-0"
        while not (attempt / "exit").exists():  # the script recorded the attempt's end: every read meanwhile failed
            assert run["state"] == "failed" and time.monotonic() - froze < 120, run
            time.sleep(1)
            run = project.latest_run()
        said = json.loads(project.ok("status", "-c", project.name, "--json").stdout)
    finally:
        signal_share(share, signal.SIGKILL)
    assert (said["latest_run"]["state"], said["latest_run"]["node_faults"]) == ("failed", {"0": silent}), said
    assert said["run_states"]["0"].startswith("failed") and said["run_states"]["1"] == "stopped (1)", said
    assert (attempt / "ended").read_text().strip() == "failed"
    own = json.loads((attempt / "node1" / "state.json").read_text())
    assert (own["state"], own["lost_nodes"]) == ("stopped", {"0": silent}), own
