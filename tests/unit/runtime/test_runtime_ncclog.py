"""Reading NCCL_DEBUG=INFO logs: per-rank transports and the verdict."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlenv.runtime.ncclog import RDMA, RDMA_GDR, SOCKETS, UNKNOWN, contradicts, parse_nccl_log


def read_log(fixtures: Path, name: str) -> list[str]:
    return (fixtures / "nccl_logs" / f"{name}.log").read_text().splitlines()


def test_roce_with_gpudirect(fixtures: Path) -> None:
    report = parse_nccl_log(read_log(fixtures, "roce_gdrdma"))
    assert report.verdict == RDMA_GDR
    assert [(r.rank, r.process) for r in report.ranks] == [
        (0, "ml-dev-env-0:2145"), (1, "ml-dev-env-0:2146"), (2, "ml-dev-env-1:1873"), (3, "ml-dev-env-1:1874"),
    ]
    rank0 = report.ranks[0].to_dict()
    assert rank0["network"] == "IB"
    assert rank0["devices"] == ["mlx5_6:1/RoCE", "mlx5_7:1/RoCE"]
    assert rank0["nccl_version"] == "2.21.5+cuda12.4"
    assert (rank0["gdr"], rank0["net_channels"], rank0["p2p"], rank0["shm"]) == (True, 2, True, False)
    assert rank0["transports"] == {"NET/IB/0/GDRDMA": 1, "NET/IB/1/GDRDMA": 1, "P2P/CUMEM/read": 2}


def test_infiniband_without_gpudirect(fixtures: Path) -> None:
    report = parse_nccl_log(read_log(fixtures, "ib_no_gdr"))
    assert report.verdict == RDMA
    assert [r.verdict for r in report.ranks] == [RDMA, RDMA]
    assert report.ranks[1].devices == ["mlx5_0:1/IB", "mlx5_1:1/IB"]
    assert report.ranks[1].to_dict()["net_channels"] == 4


def test_socket_fallback(fixtures: Path) -> None:
    report = parse_nccl_log(read_log(fixtures, "socket_fallback"))
    assert report.verdict == SOCKETS
    assert report.ranks[0].devices == ["eth0:10.0.0.5", "net1:172.18.128.3"]
    assert report.ranks[0].warnings == ["Call to ibv_open_device failed"]
    assert report.ranks[0].summary() == (
        "rank 0 (gpu01:3412): SOCKETS; network Socket [eth0:10.0.0.5, net1:172.18.128.3]; "
        "2 net channels (0 GDRDMA); NCCL 2.18.6+cuda12.1"
    )


def test_one_node_on_sockets_makes_the_whole_job_sockets(fixtures: Path) -> None:
    report = parse_nccl_log(read_log(fixtures, "roce_gdrdma") + read_log(fixtures, "socket_fallback"))
    assert len(report.ranks) == 6
    assert report.verdict == SOCKETS


def test_gdr_on_some_channels_only_is_not_gdr() -> None:
    lines = [
        "n0:10:11 [0] NCCL INFO Using network IB",
        "n0:10:11 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA",
        "n0:10:11 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/1",
    ]
    assert parse_nccl_log(lines).verdict == RDMA


def test_ib_without_channel_lines_cannot_prove_gdr() -> None:
    line = "n0:10:11 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB ib0:10.2.0.1<0>"
    assert parse_nccl_log([line]).verdict == RDMA


def test_bootstrap_socket_is_not_the_data_transport() -> None:
    lines = ["n0:10:10 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.5<0>",
             "n0:10:10 [0] NCCL INFO cudaDriverVersion 12040"]
    report = parse_nccl_log(lines)
    assert (report.verdict, report.ranks[0].network) == (UNKNOWN, None)


def test_output_without_nccl_lines() -> None:
    report = parse_nccl_log(["step 10/30 loss 0.1342", "[W Utils.hpp] gloo: Warning"])
    assert (report.verdict, report.ranks) == (UNKNOWN, [])
    assert report.to_dict() == {"verdict": UNKNOWN, "ranks": []}


@pytest.mark.parametrize(("verdict", "expect", "contradiction"), [
    (SOCKETS, "rdma", True), (RDMA, "rdma", False), (RDMA_GDR, "rdma", False), (UNKNOWN, "rdma", False),
    (RDMA_GDR, "sockets", True), (RDMA, "sockets", True), (SOCKETS, "sockets", False),
])
def test_contradicts(verdict: str, expect: str, contradiction: bool) -> None:
    assert contradicts(verdict, expect) is contradiction
