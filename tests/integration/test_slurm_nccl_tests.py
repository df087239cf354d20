"""``mlenv nccl-test --tool nccl-tests`` on a real Slurm (slurm_cluster.py: n1, n2 on this host) in an allocation
from ``deploy``: node 0's runner starts a stand-in nccl-tests binary (named ``*_perf_mpi``, so taken for an MPI
build) on every node through ``srun --overlap``, one task per GPU. The stand-in has no MPI: each task prints a test
of one rank, which the gate must not take for the 2-rank test it asked for."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from tests.integration.test_slurm_backend import make_project
from tests.unit.runtime.test_runtime_nccltestsrun import FAKE_TEST

if TYPE_CHECKING:
    from tests.integration.slurm_cluster import SlurmCluster

pytest_plugins = ["tests.integration.slurm_cluster", "tests.integration.ssh_hosts"]


def test_nccl_tests_through_srun(tmp_path: Path, slurm_cluster: SlurmCluster) -> None:
    tools = tmp_path / "nccl-tests" / "build"
    tools.mkdir(parents=True)
    binary = tools / "all_reduce_perf_mpi"
    started = tmp_path / "started"  # the two copies meet after their rank lines: both run at once
    started.mkdir()
    binary.write_text(FAKE_TEST.replace(
        'Fake GPU"\n', f'Fake GPU"\ntouch "{started}/$SLURM_PROCID"\n'
        f'until [ "$(ls "{started}" | wc -l)" -ge 2 ]; do sleep 0.05; done\n', 1))
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    project = make_project(tmp_path, slurm_cluster, name="nct")
    path = project.home / "clusters" / "nct.yaml"
    path.write_text(path.read_text().replace("network: {", f"network: {{nccl_tests: {tools}, "))
    project.ok("sync", "-c", project.name)
    project.ok("deploy", project.name, "--timeout", "60")
    try:
        ran = project.mlenv("nccl-test", "-c", project.name, "--tool", "nccl-tests", "--sizes", "1M:4M", "--json",
                            timeout=300)
        assert ran.returncode == 0, ran.stdout + ran.stderr[-4000:]  # UNKNOWN without --expect
        report = json.loads(ran.stdout)
        logs = "".join(p.read_text() for p in project.home.glob("runs/*/**/*.log"))
        assert f"srun --overlap --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 {binary} " \
               "-b 1048576 -e 4194304 -f 2 -g 1" in logs, logs[-3000:]
        assert sorted(re.findall(r"\] (\d): #  Rank  0 Group  0 ", logs)) == ["0", "1"]  # a task on each node
        assert (report["test"], report["rows"], report["verdict"]) == ("all_reduce_perf", [], "UNKNOWN"), report
        # srun forwards each node's output on its own connection, so node 1's lines may reach the log before node 0's
        # footer (two runs side by side) or after it (one whole run of 1 rank, then another): either way the verdict
        # says the copies did not join one test
        assert "did not join one test (no MPI between them: srun's MPI plugin, mpirun)" in report["reason"], report
        assert "(MPI)" in ran.stderr
    finally:
        project.mlenv("clean", "-c", project.name, "--yes", timeout=120)
