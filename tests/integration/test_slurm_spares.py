"""``mlenv deploy --spares K`` on a real Slurm (tests/integration/slurm_cluster.py): the allocation holds one node
more than the 1-node job; a restarted run whose node (n1) fails first twice goes on, inside the allocation, on the
spare (n2), said and shown in the dry run; without a spare left the run stops, naming the node, with exit 1.
``--spares -1`` and ``SPARES=-1`` are bad input (exit 2)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from tests.helpers import launch_said
from tests.integration.test_makefile import make
from tests.integration.test_slurm_backend import make_project
from tests.integration.test_slurm_requeue import PICKY_JOB

if TYPE_CHECKING:
    from tests.integration.slurm_cluster import SlurmCluster

pytest_plugins = ["tests.integration.slurm_cluster"]


def test_a_spare_node_of_the_allocation_takes_an_excluded_nodes_place(tmp_path: Path,
                                                                      slurm_cluster: SlurmCluster) -> None:
    project = make_project(tmp_path, slurm_cluster)
    path = project.home / "clusters" / f"{project.name}.yaml"
    path.write_text(path.read_text().replace("default_nodes: 2", "default_nodes: 1"))
    (project.home / "workspace" / "picky.py").write_text(PICKY_JOB)
    refused = project.mlenv("deploy", project.name, "--spares", "-1")
    assert refused.returncode == 2 and "--spares" in refused.stderr and "-1" in refused.stderr
    through_make = make("deploy-cluster-dry-run", f"CLUSTER={project.name}", "SPARES=-1", home=project.home)
    assert through_make.returncode == 2 and "--spares" in through_make.stderr
    dry = make("deploy-cluster-dry-run", f"CLUSTER={project.name}", "SPARES=1", home=project.home)
    assert "#SBATCH --nodes=2\n" in dry.stdout and "allocation of 1 nodes and 1 spare" in dry.stdout, dry.stdout
    deployed = project.ok("deploy", project.name, "--spares", "1", "--timeout", "60", timeout=120)
    assert "is running on n[1-2] (1 for the job, 1 spare)" in deployed.stderr, deployed.stderr
    assert re.search(r"allocation \d+ submitted: 2 nodes \(1 \+ 1 spare\) of partition debug", deployed.stderr)
    assert [(pod["host"], pod["extra"].get("spares")) for pod in project.status()] == [("n1", "1"), ("n2", "1")]
    project.ok("sync", "-c", project.name)
    on_spare = project.ok("exec", "-c", project.name, "--pod", "1", "--", "sh", "-c", "echo $SLURMD_NODENAME")
    assert on_spare.stdout.split()[-1] == "n2", on_spare.stdout  # exec reaches the spare node
    assert "n2" not in project.ok("exec", "-c", project.name, "--", "sh", "-c", "echo $SLURMD_NODENAME").stdout

    result = project.mlenv("launch", "-c", project.name, "--launcher", "torchrun", "--nproc", "1", "--max-restarts",
                           "3", "picky.py", "n1", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "attempt 0: n1 is broken" in result.stdout and "attempt 1: n1 is broken" in result.stdout
    assert "node-0: n1 excluded (it failed first in 2 attempts of the run), using spare n2" in result.stderr
    assert "attempt 2: ok on n2 as node 0" in result.stdout, result.stdout
    assert project.recorded_jobs() == []  # every attempt ran inside the allocation: no batch job
    # without a node-fault sign, n1 was left out of that run only: the next run starts on it again
    assert json.loads(project.ok("nodes", "-c", project.name, "--json").stdout)["excluded"] == []
    dry_launch = project.ok("launch", "-c", project.name, "--dry-run", "picky.py", "none").stdout
    assert " --nodelist n1 --allocation n1,n2 " in dry_launch and " --distribution=arbitrary " in dry_launch, dry_launch
    again = project.ok("launch", "-c", project.name, "--launcher", "torchrun", "--nproc", "1", "picky.py", "none",
                       timeout=300)
    assert "attempt 0: ok on n1 as node 0" in again.stdout and "using spare" not in again.stderr
    report = json.loads(project.ok("status", "-c", project.name, "--json").stdout)
    assert "spares" not in report["runs"][-1], report["runs"][-1]

    short = project.mlenv("launch", "-c", project.name, "--launcher", "torchrun", "--nproc", "1", "--max-restarts",
                          "5", "picky.py", "n1,n2", timeout=600)
    assert short.returncode == 1, short.stdout + short.stderr
    assert "attempt 3: n2 is broken" in short.stdout, short.stdout  # n1 twice, then its spare n2 twice
    assert launch_said(short.stderr)[-1] == (
        f"error: n1 must be left out of the run (mlenv nodes says why), and {project.name} has no usable spares for "
        "the 1 excluded node (node-0): stopping. mlenv nodes --forget-excluded lets the run use them again")
    assert json.loads(project.ok("nodes", "-c", project.name, "--json").stdout)["excluded"] == []
    project.ok("clean", "-c", project.name, timeout=120)


def test_a_detached_run_s_script_moves_a_node_that_failed_first_twice_onto_a_spare(
        tmp_path: Path, slurm_cluster: SlurmCluster) -> None:
    """Detached, the launch script inside the allocation restarts the run itself: once n1 failed first in attempts 0
    and 1, attempt 2 runs on the allocation's spare n2 (its master there too), and succeeds."""
    project = make_project(tmp_path, slurm_cluster)
    path = project.home / "clusters" / f"{project.name}.yaml"
    path.write_text(path.read_text().replace("default_nodes: 2", "default_nodes: 1"))
    (project.home / "workspace" / "picky.py").write_text(PICKY_JOB)
    project.ok("deploy", project.name, "--spares", "1", "--timeout", "60", timeout=120)
    project.ok("sync", "-c", project.name)
    project.ok("launch", "-c", project.name, "--launcher", "torchrun", "--nproc", "1", "--detach", "--max-restarts",
               "3", "picky.py", "n1", timeout=120)
    run_id = json.loads(project.ok("status", "-c", project.name, "--json").stdout)["runs"][-1]["id"]
    run = project.workdir / ".mlenv" / "runs" / run_id
    slurm_cluster.wait(lambda: (run / "attempt-2" / "exit").exists(), "attempt 2 to end", 240)
    output = (run / "output.log").read_text()
    assert (run / "attempt-2" / "exit").read_text() == "0\n", output
    assert "attempt 0: n1 is broken" in output and "attempt 1: n1 is broken" in output, output
    assert ("mlenv: excluding n1 (node-0) from the next attempts: it failed first in 2 attempts of the run\n"
            in output), output
    assert re.search(r"^mlenv: job \d+ on n2, master n2 at ", output, re.MULTILINE), output
    assert "attempt 2: ok on n2 as node 0" in output and "attempt 3" not in output, output
    project.ok("clean", "-c", project.name, timeout=120)
