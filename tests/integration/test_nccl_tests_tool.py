"""``mlenv nccl-test --tool nccl-tests`` on a local cluster (pods as processes): the runtime finds the binary where
network.nccl_tests says, doctor names the nodes that have it, node 0 runs it with the sizes asked, and its output
is judged by the nccl-tests reader (table, JSON under runs/, exit codes). The binary is a stand-in printing what
nccl-tests prints (no GPUs here); the command lines of the real launchers are golden-tested in
test_runtime_nccltestsrun.py."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.local_cluster import LocalProject, make_project, require_local
from tests.unit.runtime.test_runtime_nccltestsrun import FAKE_TEST


@pytest.fixture
def project(tmp_path: Path) -> Iterator[LocalProject]:
    """A deployed 1-node local cluster whose network.nccl_tests names a directory with a stand-in all_reduce_perf."""
    require_local("processes")
    (tmp_path / "project").mkdir()
    project = make_project(tmp_path / "project", "lnct", "10.77.64.0/24", "processes")
    tools = tmp_path / "nccl-tests" / "build"
    tools.mkdir(parents=True)
    binary = tools / "all_reduce_perf"
    binary.write_text(FAKE_TEST)
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    path = project.home / "clusters" / f"{project.name}.yaml"
    path.write_text(path.read_text().replace("  tcp:\n", f"  nccl_tests: {tools}\n  tcp:\n"))
    project.ok("deploy", project.name, "--nodes", "1")
    yield project
    project.mlenv("clean", "--cluster", project.name, "--delete-data", "--yes")


def test_nccl_tests_where_the_nodes_have_it(project: LocalProject, tmp_path: Path) -> None:
    doctor = project.mlenv("doctor", "--cluster", project.name, timeout=240)
    assert f"all_reduce_perf on every node ({project.app}-0: {tmp_path}/nccl-tests/build/all_reduce_perf)" in \
        doctor.stdout, doctor.stdout + doctor.stderr

    passed = project.mlenv("nccl-test", "--tool", "nccl-tests", "--sizes", "1M:4M", "--json", timeout=240)
    assert passed.returncode == 0, passed.stderr[-3000:]
    report = json.loads(passed.stdout)
    assert (report["tool"], report["test"], report["ranks"], report["nodes"]) == ("nccl-tests", "all_reduce_perf",
                                                                                  1, 1)
    assert [row["size"] for row in report["rows"]] == [4194304]  # the stand-in prints the largest size asked
    assert (report["wrong"], report["verdict"]) == (False, "PASS")
    assert "nccl-tests: all_reduce_perf on every node" in passed.stderr
    saved = sorted(project.home.glob("runs/*/nccl-tests.json"))
    assert saved and json.loads(saved[-1].read_text()) == report

    failed = project.mlenv("nccl-test", "--tool", "nccl-tests", "--sizes", "1M:4M", "--expect", "1GB/s",
                           timeout=240)
    assert failed.returncode == 1, failed.stdout + failed.stderr[-3000:]
    assert "FAIL: 0.00 GB/s at 4194304 bytes is 0% of the expected 1.00 GB/s" in failed.stdout

    bad = project.mlenv("nccl-test", "--tool", "nccl-tests", "--test", "nope_perf")
    assert bad.returncode == 2 and "is not a test of nccl-tests" in bad.stderr
