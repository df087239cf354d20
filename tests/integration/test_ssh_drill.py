"""The drill, a frozen node and a straggler on the ssh backend, against real sshd "machines"
(tests/integration/ssh_hosts.py: each its own PID namespace, sharing this machine's files), 2 hosts x 2 ranks, CPU
torch/gloo, through the real ``mlenv`` command: ``mlenv drill --fault F --json`` reports every phase with a time and
PASS on the default targets, and a timeline picture, for a killed rank, a lost node and a hang (the other faults:
test_slurm_drill, test_drill), each put in from outside (the runtime's ``fault`` verb finds the pids on the node
itself, in the machine's own namespace); an attached launch whose node 1 is frozen (its supervisor and ranks
SIGSTOPped, found from here through their cgroup) names node 1 lost and ends within 60 s; a rank 3x slower per step
is named a straggler within 60 s, and a job of equal ranks names none. One deployment for the module
(``launch.node_silence`` 8 s)."""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator
from ipaddress import IPv4Address
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests._prereq import require
from tests.helpers import MLENV, ROOT
from tests.integration.local_cluster import LocalProject
from tests.integration.test_drill import check_drill
from tests.integration.test_frozen_node import JOB as STEPS_JOB
from tests.integration.test_frozen_node import freeze_node_1
from tests.integration.test_stragglers import JOB as STRAGGLER_JOB
from tests.integration.test_stragglers import judged

if TYPE_CHECKING:  # imported at run time as a plugin, so that pytest rewrites its asserts
    from tests.integration.ssh_hosts import SshCluster

pytest_plugins = ["tests.integration.ssh_hosts"]

NAME = "sdr"
FIRST_ADDRESS = IPv4Address("127.0.0.60")  # apart from the other ssh modules' machines


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    """Two machines sharing this machine's files, deployed (2 ranks each, node silence 8 s) and synced."""
    from tests.integration.ssh_hosts import create_cluster, require_ssh

    require_ssh()
    require("rsync", "torch")
    root = tmp_path_factory.mktemp("ssh-drill")
    machines: SshCluster = create_cluster(root / "machines", 2, separate=False, first_address=FIRST_ADDRESS)
    try:
        for host in machines.hosts:
            machines.start(host)
        home = root / "project"
        (home / "clusters").mkdir(parents=True)
        (home / "clusters" / f"{NAME}.yaml").write_text(f"""\
backend: ssh
cluster:
  name: {NAME}
ssh:
  hosts: {json.dumps([host.spec for host in machines.hosts])}
  identity_file: {machines.identity}
  known_hosts: {machines.known_hosts}
  workdir: {machines.workdir}/{NAME}
  python: {Path(MLENV).parent / "python"}
  connect_timeout: 5
gpus:
  per_node: 0
  default_nodes: 2
  procs_per_node: 2
launch:
  node_silence: 8
""")
        deployed = LocalProject(home, NAME, "ml-dev-env")
        deployed.ok("deploy", NAME)
        deployed.ok("sync", "--source", str(deployed.source({"steps.py": STEPS_JOB})))
        yield deployed
        deployed.mlenv("stop")
    finally:
        machines.close()


# The fault verb goes in through the backend's exec route alike for every fault, and the supervisor that judges it
# is the same on every backend: each backend drills a node loss (its own way of seeing a node end) and shares the
# other faults with the others (Slurm: rank-exit, node-freeze; local: rank-exit, node-freeze).
@pytest.mark.parametrize("fault", ["rank-kill", "node-loss", "hang"])
def test_the_drill(project: LocalProject, fault: str) -> None:
    check_drill(project, fault)


def test_a_frozen_node_is_named_lost_and_the_launch_ends(project: LocalProject) -> None:
    done, ended = freeze_node_1([str(MLENV), "launch", "--launcher", "torchrun", "steps.py"], ROOT,
                                {**os.environ, "MLENV_HOME": str(project.home)},
                                project.home.parent / "machines" / "workdir")
    out, err = done.stdout, done.stderr
    assert done.returncode != 0 and ended < 60, (ended, out[-2000:], err[-3000:])
    assert "error: node-1 was lost (unreachable: node 0 heard nothing from it for 8 s)" in err, err[-3000:]
    run = json.loads(project.ok("status", "--json").stdout)["latest_run"]
    assert run["node_faults"]["1"]["sign"] == "unreachable", run["node_faults"]


@pytest.mark.timing
def test_a_rank_three_times_slower_is_named_a_straggler(project: LocalProject) -> None:
    straggler = random.Random().randrange(4)  # noqa: S311 - a test's choice, not a secret
    project.ok("sync", "--source", str(project.source({"steps.py": STRAGGLER_JOB.format(slow=0.15,
                                                                                         straggler=straggler)})))
    project.ok("launch", "--detach", "--launcher", "torchrun", "steps.py")
    until = time.monotonic() + 60
    try:
        while not (run := judged(project, until - time.monotonic()))["stragglers"]:
            time.sleep(1)
    finally:
        project.ok("stop")
    named = run["stragglers"]
    assert [entry.get("rank") for entry in named] == [straggler], named
    assert "is a straggler" in named[0]["text"]


@pytest.mark.timing
def test_equal_ranks_name_no_straggler(project: LocalProject) -> None:
    project.ok("sync", "--source", str(project.source({"steps.py": STRAGGLER_JOB.format(slow=0.05, straggler=-1)})))
    project.ok("launch", "--detach", "--launcher", "torchrun", "steps.py")
    try:
        run = judged(project, 90)
    finally:
        project.ok("stop")
    assert run["stragglers"] == [], run["stragglers"]
