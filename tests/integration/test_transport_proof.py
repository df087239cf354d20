"""The live transport proof on a local cluster of 2 nodes x 2 ranks: real NCCL logs of public bug reports
(tests/fixtures/nccl_logs/corpus) are replayed by the job's ranks, as NCCL would print them (with the rank's own
pid), and then the job trains (sleeps) or ends. A socket fallback under --expect-transport rdma is stopped on every
node within 60 s naming SOCKETS; RDMA over the OFI plugin runs to its end; no NCCL lines under an explicit
expectation is not a pass; ``any`` reports and keeps the job's exit code; a detached run records each node's
verdict; an old log a rank prints as it is (other pids) is no evidence."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.local_cluster import LocalProject, leftovers, make_project, require_local

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_logs" / "corpus"
SOCKETS_LOG = "nccl1232_socket_shm_prefix_2.18.log"
OFI_LOG = "awsofi24_efa_ring_2.4.log"

REPLAY = """\
import os, re, sys, time
log, then, echoed = sys.argv[1], sys.argv[2], sys.argv[3:]
if os.environ["LOCAL_RANK"] == "0" and echoed:  # an old log, printed as it is
    with open(echoed[0], errors="replace") as lines:
        print(lines.read(), flush=True)
if os.environ["LOCAL_RANK"] == "0" and log != "-":  # one rank per node prints what NCCL printed there, as its own
    with open(log, errors="replace") as lines:
        for line in lines:
            line = re.sub(r"(?<![\\w-])([\\w-]+):[0-9]+:([0-9]+) \\[", rf"\\1:{os.getpid()}:\\2 [", line)
            print(line.rstrip("\\n"), flush=True)
print("step 1/3 loss 0.5", flush=True)
if then == "train":
    time.sleep(300)
sys.exit(int(then) if os.environ["LOCAL_RANK"] == "0" else 0)  # the code comes once the node's log was printed
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalProject]:
    """A deployed 2-node processes cluster (2 ranks each) with the replay job and the logs synced."""
    require_local("processes")
    project = make_project(tmp_path_factory.mktemp("proof"), "lprf", "10.77.69.0/24", "processes")
    project.ok("deploy", project.name)
    files = {"replay.py": REPLAY, **{name: (CORPUS / name).read_text() for name in (SOCKETS_LOG, OFI_LOG)}}
    project.ok("sync", "--cluster", project.name, "--source", str(project.source(files)))
    yield project
    project.mlenv("clean", "--cluster", project.name, "--delete-data", "--yes")


def launch(cluster: LocalProject, *args: str, timeout: int = 150) -> tuple[int, str, float]:
    started = time.monotonic()
    result = cluster.mlenv("launch", "--cluster", cluster.name, "--launcher", "torchrun", *args, timeout=timeout)
    return result.returncode, result.stdout + result.stderr, time.monotonic() - started


def test_a_socket_fallback_under_rdma_is_stopped_on_every_node(cluster: LocalProject) -> None:
    code, output, took = launch(cluster, "--expect-transport", "rdma", "replay.py", SOCKETS_LOG, "train")
    assert code == 1, output[-3000:]
    assert took < 60
    assert "node-0: SOCKETS" in output and "node-1: SOCKETS" in output
    assert "NCCL uses SOCKETS but --expect-transport is rdma" in output
    assert [item for item in leftovers(cluster) if item.startswith("process")] == []


def test_rdma_over_the_ofi_plugin_runs_to_its_end(cluster: LocalProject) -> None:
    code, output, _ = launch(cluster, "--expect-transport", "rdma", "replay.py", OFI_LOG, "0")
    assert code == 0, output[-3000:]
    assert "node-0: RDMA (no GDR) (NET/AWS Libfabric)" in output and "node-1: RDMA (no GDR)" in output
    assert "RDMA (no GDR), as expected" in output


def test_no_nccl_lines_under_an_explicit_expectation_is_not_a_pass(cluster: LocalProject) -> None:
    code, output, _ = launch(cluster, "--expect-transport", "sockets", "replay.py", "-", "0")
    assert code == 1, output[-3000:]
    assert "could not prove sockets: no NCCL lines in the output" in output


def test_any_reports_the_verdict_and_keeps_the_job_s_exit_code(cluster: LocalProject) -> None:
    code, output, _ = launch(cluster, "--expect-transport", "any", "replay.py", SOCKETS_LOG, "3")
    assert code == 3, output[-3000:]
    assert "node-0: SOCKETS" in output and "NCCL transport: SOCKETS" in output


def test_a_detached_run_records_each_node_s_verdict(cluster: LocalProject) -> None:
    cluster.ok("launch", "--cluster", cluster.name, "--launcher", "torchrun", "--detach", "replay.py", OFI_LOG, "0")
    deadline = time.monotonic() + 90
    report = json.loads(cluster.ok("status", "--cluster", cluster.name, "--json").stdout)
    while "running" in str(report.get("run_states")) and time.monotonic() < deadline:
        time.sleep(1)
        report = json.loads(cluster.ok("status", "--cluster", cluster.name, "--json").stdout)
    transport = report["latest_run"]["transport"]
    assert set(transport) == {"node-0", "node-1"}, report
    assert transport["node-0"]["verdict"] == "RDMA (no GDR)"
    assert transport["node-0"]["plugin"] == "NET/AWS Libfabric"
    assert set(transport["node-1"]) == {"verdict", "plugin", "devices", "nccl_version"}
    shown = cluster.ok("status", "--cluster", cluster.name).stdout
    assert "transport: node-0 RDMA (no GDR) (NET/AWS Libfabric), node-1 RDMA (no GDR)" in shown
    logs = cluster.ok("logs", "--cluster", cluster.name).stdout
    assert "node-0: RDMA (no GDR)" in logs


def test_an_old_log_a_rank_prints_is_no_evidence(cluster: LocalProject) -> None:
    code, output, _ = launch(cluster, "--expect-transport", "rdma", "replay.py", OFI_LOG, "0", SOCKETS_LOG)
    assert code == 0, output[-3000:]
    assert "SOCKETS" not in output
    assert "node-0: RDMA (no GDR) (NET/AWS Libfabric)" in output and "RDMA (no GDR), as expected" in output
    code, output, _ = launch(cluster, "--expect-transport", "any", "replay.py", "-", "0", SOCKETS_LOG)
    assert code == 0, output[-3000:]
    assert "SOCKETS" not in output and "NCCL transport" not in output
