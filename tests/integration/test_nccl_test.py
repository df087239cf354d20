"""``mlenv nccl-test``, the fabric gate: the verdict from fixture NCCL logs (RDMA asked and sockets seen FAILs
whatever the number; PASS from 80 % of the expected bus bandwidth at the largest size), and the whole run on a
local cluster that was never synced (gloo over network namespaces): table, JSON and PNG under runs/, exit 0/1."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlenv.errors import UsageError
from mlenv.ops.nccltest import (
    NO_GATE,
    NO_NCCL,
    ExpectedBandwidth,
    SizeResult,
    evaluate,
    expected_from_links,
    nccl_report,
    parse_bandwidth,
    read_results,
)

from tests.helpers import assert_shaped, documented_shape
from tests.integration.local_cluster import LocalProject, make_project, require_local

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_logs"
GIB = 1 << 30


def results(*busbw: float) -> list[SizeResult]:
    """One result per value, sizes 256M, 512M, 1G...; the last is the largest."""
    return [SizeResult((256 << 20) << i, 1000.0, value / 2, value) for i, value in enumerate(busbw)]


def test_rdma_asked_and_sockets_seen_fails_whatever_the_number() -> None:
    verdict = evaluate(results(900.0, 1000.0), nccl_report([LOGS / "socket_fallback.log"]), "rdma",
                       ExpectedBandwidth(180.0, "network.expected_busbw"))
    assert verdict.status == "FAIL"
    assert verdict.reasons[0] == ("the cluster file asks for RDMA but NCCL used sockets (ranks 0, 1): a FAIL "
                                  "whatever the bandwidth")
    assert verdict.reasons[1].startswith("1000.00 GB/s at 536870912 bytes is 556% of the expected 180.00 GB/s")


def test_rdma_with_gpudirect_passes_from_80_percent_at_the_largest_size() -> None:
    report = nccl_report([LOGS / "roce_gdrdma.log"])
    expected = ExpectedBandwidth(180.0, "network.expected_busbw")
    passed = evaluate(results(20.0, 144.0), report, "rdma", expected)
    assert passed.status == "PASS"
    assert passed.reasons == ("NCCL used RDMA+GDR, as the cluster file asks",
                              "144.00 GB/s at 536870912 bytes is 80% of the expected 180.00 GB/s "
                              "(network.expected_busbw); PASS needs 80%")
    slow = evaluate(results(200.0, 90.0), report, "rdma", expected)  # only the largest size counts
    assert slow.status == "FAIL" and "is 50% of the expected" in slow.reasons[-1]


def test_infiniband_without_gpudirect_is_rdma() -> None:
    verdict = evaluate(results(150.0), nccl_report([LOGS / "ib_no_gdr.log"]), "rdma", None)
    assert verdict.status == "PASS"
    assert verdict.reasons[0] == "NCCL used RDMA (no GDR), as the cluster file asks"
    assert verdict.reasons[1].startswith("no expected bandwidth")


def test_rdma_asked_without_an_nccl_log_to_prove_it_fails() -> None:
    verdict = evaluate(results(5.0), nccl_report([]), "rdma", None)
    assert verdict.status == "FAIL"
    assert verdict.reasons[0] == "the cluster file asks for RDMA but the logs have no NCCL INFO lines to prove it"


def test_sockets_are_fine_in_tcp_mode_and_no_result_fails() -> None:
    report = nccl_report([LOGS / "socket_fallback.log"])
    assert evaluate(results(2.0), report, "tcp", ExpectedBandwidth(2.5, "--expect 20Gb/s")).status == "PASS"
    assert evaluate([], report, "tcp", None).reasons == ("the benchmark printed no result",)


def test_nothing_compared_is_no_gate_not_pass() -> None:
    report = nccl_report([LOGS / "socket_fallback.log"])
    ungated = evaluate(results(2.0), report, "tcp", None)
    assert ungated.status == NO_GATE and ungated.reasons[-1].endswith("bandwidth not gated")
    assert evaluate(results(2.0), report, "tcp", ExpectedBandwidth(2.5, "--expect 20Gb/s")).status == "PASS"


@pytest.mark.parametrize(("text", "gbytes"), [("180GB/s", 180.0), ("1440Gb/s", 180.0), ("400 Gb/s", 50.0),
                                              ("1.5TB/s", 1500.0), ("800MB/s", 0.8)])
def test_expected_bandwidth_needs_its_unit(text: str, gbytes: float) -> None:
    assert parse_bandwidth(text) == pytest.approx(gbytes)


@pytest.mark.parametrize(("text", "why"), [
    ("180", "--expect: 180 has no unit: write 180GB/s for gigabytes per second"),
    ("180 GiB/s", "--expect: expected a bandwidth like 180GB/s or 1440Gb/s"),
    ("0GB/s", "--expect: expected a bandwidth larger than 0"),
    ("fast", "--expect: expected a bandwidth like 180GB/s or 1440Gb/s")])
def test_a_bandwidth_without_a_unit_is_bad_input(text: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        parse_bandwidth(text)


def test_expectation_from_the_slowest_nodes_links() -> None:
    links = {"pod-0": {"link_gbps": 800.0, "hca_count": 4}, "pod-1": {"link_gbps": 400.0, "hca_count": 2}}
    assert expected_from_links(links) == ExpectedBandwidth(50.0, "link rate in sysfs: 2 HCAs, 400 Gb/s on pod-1")
    assert expected_from_links({**links, "pod-2": {"link_gbps": 0, "hca_count": 0}}) is None


def test_results_come_from_rank_0s_log(tmp_path: Path) -> None:
    quiet, rank0 = tmp_path / "node-0.log", tmp_path / "node-1.log"
    quiet.write_text("mlenv: node 0/2\n")
    rank0.write_text("allreduce   size_bytes      time_us  algbw_GBps  busbw_GBps\n"
                     "allreduce         8192          9.5       0.862       1.293\n"
                     "ml-dev-env-1:77:77 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] via NET/IB/0\n"
                     "allreduce         4096          8.0       0.512       0.768\n")
    assert read_results([quiet, rank0]) == [SizeResult(4096, 8.0, 0.512, 0.768), SizeResult(8192, 9.5, 0.862, 1.293)]


# --- the whole run on a local cluster ---


@pytest.fixture
def project(tmp_path: Path) -> Iterator[LocalProject]:
    """A deployed 2 x 2 local cluster (namespaces) expecting 1Mb/s, never synced."""
    require_local("namespaces")
    project = make_project(tmp_path, "lnccl", "10.77.65.0/24", "namespaces")
    path = project.home / "clusters" / f"{project.name}.yaml"
    path.write_text(path.read_text().replace("  tcp:\n", "  expected_busbw: 1Mb/s\n  tcp:\n"))
    project.ok("deploy", project.name)
    yield project
    project.mlenv("clean", "--cluster", project.name, "--delete-data", "--yes")


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_gate_on_the_local_cluster_without_a_sync(project: LocalProject) -> None:
    bad = project.mlenv("nccl-test", "--sizes", "8M:1K")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--sizes" in bad.stderr

    passed = project.mlenv("nccl-test", "--sizes", "4K:16K", "--json", timeout=240)
    assert passed.returncode == 0, passed.stderr[-3000:]
    summary = json.loads(passed.stdout)
    assert_shaped(summary, documented_shape("nccl-test"))
    assert [r["size_bytes"] for r in summary["sizes"]] == [4096, 8192, 16384]
    assert all(r["busbw_gbps"] > 0 for r in summary["sizes"])
    assert summary["transport"] == {"verdict": NO_NCCL, "ranks": []}
    assert (summary["expected_busbw_gbps"], summary["expected_source"]) == (0.000125, "network.expected_busbw")
    assert (summary["ok"], summary["verdict"]) == (True, "PASS")
    saved = Path(summary["files"]["json"])
    assert json.loads(saved.read_text()) == summary
    assert png_size(Path(summary["files"]["png"])) == (640, 400)

    failed = project.mlenv("nccl-test", "--sizes", "4K:16K", "--expect", "1000GB/s", timeout=240)
    assert failed.returncode == 1, failed.stderr[-3000:]
    out = failed.stdout
    assert "ALGBW (GB/s)" in out and "16384" in out and f"transport: {NO_NCCL}" in out
    assert "busbw GB/s" in out and "1000 exp |" in out
    verdict = next(line for line in out.splitlines() if line.startswith("FAIL: "))
    assert "at 16384 bytes is 0% of the expected 1000.00 GB/s (--expect 1000GB/s); PASS needs 80%" in verdict
