"""Real nccl-tests outputs from public repositories read right: test, ranks, nodes, rows, the largest size and its
out-of-place busbw, the footer's average, wrong results, errors, and the verdict at 100 GB/s. The outputs are committed
as fixtures, verbatim (``git show COMMIT:PATH`` of each entry), under ``tests/fixtures/nccl-tests/corpus/``; their
provenance (repository, path, commit, version, what each holds, sha256 and the repository's licence) is in
``tests/fixtures/nccl-tests/corpus.json``. A missing one fails; its sha256 is checked."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from mlenv.ops.nccltest import ExpectedBandwidth
from mlenv.ops.nccltests import judge
from mlenv.runtime.fabric.nccltests import read_lines, read_path

from tests.helpers import ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "nccl-tests"
OUTPUTS = FIXTURES / "corpus"
CORPUS: list[dict[str, Any]] = json.loads((FIXTURES / "corpus.json").read_text())


def _output(entry: dict[str, Any]) -> Path:
    path = OUTPUTS / entry["file"]
    assert path.is_file(), f"{path} is missing: git show {entry['commit']}:{entry['path']} of {entry['repo']}"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], f"{path} is not the published text"
    return path


def test_the_corpus_spans_what_the_issue_asks() -> None:
    assert len(CORPUS) >= 15
    assert all(entry["url"].startswith("https://github.com/") and entry["commit"] in entry["url"] for entry in CORPUS)
    expected = [entry["expected"] for entry in CORPUS]
    assert any(e["nodes"] == 1 for e in expected) and any((e["nodes"] or 0) > 100 for e in expected)
    assert sum(1 for e in expected if e["error"]) >= 3
    assert any("before 2.13" in entry["nccl_tests_version"] for entry in CORPUS)
    assert any("2.13 or later" in entry["nccl_tests_version"] for entry in CORPUS)
    assert all(entry.get("licence") for entry in CORPUS), "every entry names its repository's licence (NONE if none)"


@pytest.mark.parametrize("entry", CORPUS, ids=[entry["file"] for entry in CORPUS])
def test_a_real_output_is_read_right(entry: dict[str, Any]) -> None:
    report = read_path(_output(entry))
    want = entry["expected"]
    assert (report.test, report.ranks, report.nodes) == (want["test"], want["ranks"], want["nodes"])
    assert (len(report.rows), report.avg_busbw_gbps, report.wrong) == (want["rows"], want["avg_busbw_GBps"],
                                                                        want["wrong"])
    assert report.error == want["error"]
    largest = report.largest()
    got = {"size": largest.size, "busbw_GBps": largest.out_of_place.busbw_gbps} if largest else None
    assert got == want["largest"]
    verdict, reason = judge(report, ExpectedBandwidth(100.0, "--expect 100GB/s"))
    assert verdict == want["verdict_at_100GBps"], reason
    if want["error"]:
        assert want["error"] in reason


@pytest.mark.parametrize("entry", [e for e in CORPUS if e["expected"]["rows"] > 2], ids=lambda e: e["file"])
def test_a_real_output_cut_short_or_hung_is_unknown(entry: dict[str, Any]) -> None:
    lines = _output(entry).read_text(errors="replace").splitlines()
    footer = next(i for i, line in enumerate(lines) if "Out of bounds values" in line)
    size = f" {entry['expected']['largest']['size']} "
    last_row = max(i for i, line in enumerate(lines[:footer]) if size in f" {line} " and "NCCL" not in line)
    cut = read_lines(lines[:last_row])  # the last row and the footer missing
    assert len(cut.rows) == entry["expected"]["rows"] - 1
    assert judge(cut, ExpectedBandwidth(1.0, "--expect 1GB/s"))[0] == "UNKNOWN"
    last_rank = max(i for i, line in enumerate(lines[:footer]) if " device " in line and "Rank" in line)
    hung = read_lines(lines[:last_rank + 1])
    verdict, reason = judge(hung, None)
    assert (hung.ranks, verdict) == (entry["expected"]["ranks"], "UNKNOWN")
    assert "after the Rank lines" in reason
