"""`mlenv status`'s table at 60 columns and more: every header whole, one line per pod, a long DETAIL cut with …
(details first), never folded; the RDMA column only where there is something to show in it."""

from __future__ import annotations

import re

import pytest
from mlenv.core.capabilities import Handle, NodeStatus
from mlenv.ops.status import StatusReport, _print
from mlenv.ui import ELLIPSIS
from rich.cells import cell_len

LONG = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint {gpu: true}"


def _report(mode: str, rdma: str | None) -> StatusReport:
    pods = [NodeStatus(f"train-app-{n}", n, f"worker-{n}.example.internal", "Pending", False, 0, 8, None, rdma, LONG,
                       {"jobs": 0, "mode": "processes", "nic": "ens1f0np0"}) for n in range(3)]
    handle = Handle("local", "train", 3, mode, False, {}, {"namespace": "train-ns"})
    return StatusReport(handle, True, None, [], [], pods)


@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_every_header_whole_and_one_line_per_pod(width: int, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setenv("NO_COLOR", "1")
    _print(_report("tcp", None))
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("POD"))
    assert re.split(r"\s*┃\s*", lines[head].strip()) == ["POD", "NODE", "PHASE", "READY", "RESTARTS", "GPUS", "IP",
                                                          "JOBS", "MODE", "NIC", "DETAIL"]
    rows = lines[head + 2:]
    assert len(rows) == 3 and all(cell_len(line) <= width for line in lines[head:]), lines
    assert [row[:4] for row in rows] == ["trai"] * 3, rows  # one line per pod, its name first
    assert all(row.rstrip().endswith(ELLIPSIS) for row in rows), rows  # the detail is cut, not folded


def test_the_rdma_column_where_rdma_is_asked_or_found(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    for mode, devices, shown in [("rdma", None, True), ("tcp", "mlx5_0", True), ("tcp", None, False)]:
        _print(_report(mode, devices))
        header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("POD"))
        assert ("RDMA" in header) == shown, (mode, devices, header)
