"""``mlenv nccl-test --read FILE``, run as a user runs it: the --json shape of docs/json.md, the exit codes (FAIL 1,
UNKNOWN 1 only under --expect, bad input 2), wrong results FAIL first whatever the bandwidth, and bad files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import ROOT, assert_shaped, documented_shape, run_mlenv
from tests.unit.runtime.test_runtime_nccltests import FOOTER, NEW, NEW_HEADER, NEW_ROWS


def read(path: Path, *args: str) -> tuple[int, dict[str, object], str]:
    result = run_mlenv("nccl-test", "--read", str(path), "--json", *args)
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, json.loads(result.stdout), result.stderr


@pytest.fixture
def output(tmp_path: Path) -> Path:
    path = tmp_path / "all_reduce.txt"
    path.write_text(NEW)
    return path


def test_json_is_the_documented_shape_and_gates_the_largest_size(output: Path) -> None:
    code, report, _ = read(output, "--expect", "200GB/s")
    assert_shaped(report, documented_shape("nccl-test-read"))
    assert list(report) == ["tool", "test", "ranks", "nodes", "rows", "avg_busbw_GBps", "wrong", "error", "verdict",
                            "reason"]
    assert (code, report["verdict"], report["test"], report["ranks"], report["nodes"]) == (
        0, "PASS", "all_reduce_perf", 4, 2)
    assert report["reason"].startswith("196.41 GB/s at 1073741824 bytes is 98% of the expected 200.00 GB/s")
    code, report, _ = read(output, "--expect", "2000Gb/s")
    assert (code, report["verdict"]) == (1, "FAIL")


def test_wrong_results_fail_first_whatever_the_bandwidth(tmp_path: Path) -> None:
    path = tmp_path / "wrong.txt"
    path.write_text(NEW.replace("196.41       0", "196.41      12").replace("0 OK", "1 FAILED"))
    for args in ((), ("--expect", "1GB/s")):
        code, report, _ = read(path, *args)
        assert (code, report["verdict"], report["wrong"]) == (1, "FAIL", True)
        assert report["reason"].startswith("wrong results") and "1073741824 bytes float" in report["reason"]


def test_an_error_is_unknown_and_fails_only_under_expect(tmp_path: Path) -> None:
    path = tmp_path / "error.txt"
    failure = "node-b: Test NCCL failure common.cu:1012 'unhandled system error / '"
    path.write_text(NEW_HEADER + failure + "\n")
    code, report, _ = read(path)
    assert (code, report["verdict"], report["error"], report["rows"]) == (0, "UNKNOWN", failure, [])
    code, report, _ = read(path, "--expect", "100GB/s")
    assert (code, report["verdict"]) == (1, "UNKNOWN") and failure in str(report["reason"])


@pytest.mark.parametrize(("content", "said"), [
    (b"", "no nccl-tests result table in it"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00" * 100, "a binary file"),
    ((NEW_HEADER + NEW_ROWS).encode(), "cut short"),
])
def test_bad_files_are_unknown_with_a_reason(tmp_path: Path, content: bytes, said: str) -> None:
    path = tmp_path / "bad"
    path.write_bytes(content)
    code, report, _ = read(path, "--expect", "1GB/s")
    assert (code, report["verdict"]) == (1, "UNKNOWN") and said in str(report["reason"])


def test_the_table_plot_and_verdict_for_a_person(output: Path) -> None:
    result = run_mlenv("nccl-test", "--read", str(output), "--expect", "180GB/s")
    assert result.returncode == 0, result.stderr
    assert "all_reduce_perf bus bandwidth: all_reduce.txt (4 ranks, 2 nodes)" in result.stdout
    assert "busbw GB/s" in result.stdout and "180 exp" in result.stdout
    assert result.stdout.rstrip().splitlines()[-1].startswith("PASS: 196.41 GB/s")


@pytest.mark.parametrize(("args", "said"), [
    (["--read", "/nonexistent/out.txt"], "--read: no file /nonexistent/out.txt"),
    (["--read", "/dev/zero"], "--read: /dev/zero is not a regular file (a character device): give an nccl-tests "
                              "output file"),
    (["--read", str(ROOT / "docs")], f"--read: {ROOT / 'docs'} is not a regular file (a directory): give an "
                                     "nccl-tests output file"),
    (["--read", str(ROOT / "Makefile"), "--pairs"], "it does not go with --pairs"),
    (["--read", str(ROOT / "Makefile"), "--tool", "nccl-tests"], "it does not go with --tool"),
    (["--read", str(ROOT / "Makefile"), "--expect", "fast"], "--expect"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], said: str) -> None:
    result = run_mlenv("nccl-test", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert said in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_a_named_pipe_is_refused_unopened(tmp_path: Path) -> None:
    """No writer ever comes: opening it to read would wait for one forever."""
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    result = run_mlenv("nccl-test", "--read", str(fifo), timeout=30)
    assert (result.returncode, result.stderr) == (2, f"error: --read: {fifo} is not a regular file (a named pipe): "
                                                     "give an nccl-tests output file\n")


def test_a_large_table_is_judged_on_its_first_rows_or_not_at_all(tmp_path: Path) -> None:
    row = NEW_ROWS.splitlines()[1] + "\n"
    path = tmp_path / "many.txt"
    path.write_text(NEW_HEADER + row * 100_000 + FOOTER)
    code, report, _ = read(path, "--expect", "1GB/s")
    assert (code, report["verdict"], len(report["rows"])) == (1, "UNKNOWN", 10_000)
    assert "100000 rows: more than 10000, so not judged" in str(report["reason"])
