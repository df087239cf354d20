"""NCCL's record shape (src/debug.cc) as the live proof reads it: the forms NCCL 2.3 to 2.2x print, after the
launchers' tags, and what is not NCCL's shape; real logs of public bug reports read the same in that shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlenv.runtime.fabric.ncclines import NcclRecord, nccl_record, records
from mlenv.runtime.fabric.ncclog import NcclLogReader, parse_nccl_log

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nccl_logs"
CORPUS = json.loads((FIXTURES / "corpus.json").read_text())


@pytest.mark.parametrize(("line", "record"), [
    ("gpu7:4242:4250 [3] NCCL INFO Using network IB", NcclRecord("INFO", "Using network IB", "gpu7", "4242", "3")),
    ("gpu7:4242:4250 [3] misc/ibvwrap.cc:160 NCCL WARN Call to ibv_open_device failed",  # 2.4 to 2.1x
     NcclRecord("WARN", "Call to ibv_open_device failed", "gpu7", "4242", "3")),
    ("[2025-10-16 22:16:08] gpu7:4242:4250 [3] transport/net_ib/p2p.cc:1295 (ncclIbTest) NCCL WARN NET/IB: Got "
     "completion from peer 10.0.0.2<45678> with status=12", NcclRecord("WARN", "NET/IB: Got completion from peer "
                                                                   "10.0.0.2<45678> with status=12", "gpu7", "4242",
                                                                   "3")),  # 2.2x: function and timestamp
    ("gpu7:4242:4250 [3] create_nccl_ofi_component:459 NCCL WARN NET/OFI Couldn't open AV",  # a plugin's WARN
     NcclRecord("WARN", "NET/OFI Couldn't open AV", "gpu7", "4242", "3")),
    ("NCCL version 2.21.5+cuda12.4", NcclRecord("VERSION", "NCCL version 2.21.5+cuda12.4", version="2.21.5+cuda12.4")),
    ("[node-1 r3] gpu7:4242:4250 [3] NCCL INFO Using network IB",
     NcclRecord("INFO", "Using network IB", "gpu7", "4242", "3", node="node-1", rank=3)),
    ("[default3]:gpu7:4242:4250 [3] NCCL INFO Using network IB",
     NcclRecord("INFO", "Using network IB", "gpu7", "4242", "3", tag="[default3]")),
    ("[rank3]:gpu7:4242:4250 [3] NCCL INFO Using network IB",
     NcclRecord("INFO", "Using network IB", "gpu7", "4242", "3", tag="[rank3]")),
    ("[1,3]<stdout>:gpu7:4242:4250 [3] NCCL INFO Using network IB",
     NcclRecord("INFO", "Using network IB", "gpu7", "4242", "3", tag="[1,3]")),
    ("3: gpu7:4242:4250 [3] NCCL INFO Using network IB", NcclRecord("INFO", "Using network IB", "gpu7", "4242", "3",
                                                                tag="[3]")),
    ("10.0.0.7: gpu7:4242:4250 [3] NCCL INFO Using network IB",  # DeepSpeed's (pdsh's) host prefix
     NcclRecord("INFO", "Using network IB", "gpu7", "4242", "3")),
])
def test_nccl_s_own_shape(line: str, record: NcclRecord) -> None:
    assert nccl_record(line) == record


@pytest.mark.parametrize("line", [
    "print('gpu7:4242:4250 [3] NCCL INFO Using network Socket')",  # quoted by a script
    "rank 3 says gpu7:4242:4250 [3] NCCL INFO Using network Socket",  # inside other text
    "gpu7:4242:4250 [3] NCCL INFO Using network IB gpu7:4243:4251 [4] NCCL INFO Using network Socket",
    "NCCL INFO Using network Socket",  # no header
    "[3] NCCL INFO Using network Socket",
    "<cluster_name>:925:925 [6] NCCL INFO Using network Socket",  # no host NCCL would print
    "gpu7:4242 [3] NCCL INFO Using network Socket",  # no tid
    "  | 2025-05-22T14:26:33.405-07:00 | gpu7:80:2500 [0] NCCL INFO Using network Socket",  # a log service's table
    "[default0]:[rank0]:gpu7:4242:4250 [3] NCCL INFO Using network Socket",  # two tags
    "NCCL version 2.21.5+cuda12.4 and more",
])
def test_not_nccl_s_shape(line: str) -> None:
    assert nccl_record(line) is None


def test_nccl_2_0_to_2_2_records_have_no_nccl_word_before_their_level() -> None:
    assert records("[1,0]<stdout>:cx50:18926:19004 [1] INFO Using internal Network Socket") == [
        NcclRecord("INFO", "Using internal Network Socket", "cx50", "18926", "1", tag="[1,0]")]
    assert [(r.level, r.host, r.message) for r in records("gpu2:7:9 [0] include/socket.h:185 WARN Call to connect "
                                                           "failed")] == [("WARN", "gpu2", "Call to connect failed")]
    assert records("2019-01-01 12:00:00 INFO root: Using internal Network IB") == []  # a logger's INFO


def test_pasted_logs_keep_their_records_where_nccl_s_shape_is_lost() -> None:
    assert [(r.host, r.pid, r.message) for r in records("1  [4] NCCL INFO Using network IB")] == [
        (None, None, "Using network IB")]
    joined = records("a:1:2 [0] NCCL INFO Using network IB b:3:4 [1] NCCL INFO Using network Socket")
    assert [(r.host, r.message) for r in joined] == [("a", "Using network IB"), ("b", "Using network Socket")]


def strict(lines: list[str]) -> tuple[str, int]:
    """The verdict from the records in NCCL's own shape only, and how many lines with NCCL's words were not."""
    reader, rejected = NcclLogReader(), 0
    for number, line in enumerate(lines, 1):
        if (record := nccl_record(line)) is not None:
            reader.add(record, f"-:{number}")
        elif "NCCL INFO" in line or "NCCL WARN" in line:
            rejected += 1
    return reader.report().verdict, rejected


def test_real_logs_in_nccl_s_own_shape_read_the_same_from_their_records_alone() -> None:
    shaped = 0
    for entry in CORPUS:
        lines = (FIXTURES / "corpus" / entry["file"]).read_text(errors="replace").splitlines()
        verdict, rejected = strict(lines)
        if rejected == 0:
            shaped += 1
            assert verdict == entry["expected"] == parse_nccl_log(lines).verdict, entry["file"]
    assert shaped >= 34
