"""The nccl-tests output reader (runtime/fabric/nccltests.py): every table layout nccl-tests has printed, written
here from its print formats (src/common.cu, util.cu across versions) with our own numbers, and bounded reading of
bad input. Real outputs from public repositories: test_nccltests_corpus.py."""

from __future__ import annotations

import io
import os
import re
import resource
from pathlib import Path

import pytest
from mlenv.runtime.fabric.nccltests import MAX_ROWS, NcclTestsReport, read_lines, read_path, read_stream

NEW_HEADER = """\
# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#  Rank  0 Group  0 Pid   1001 on     node-a device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   1002 on     node-a device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid   2001 on     node-b device  0 [0000:1b:00] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid   2002 on     node-b device  1 [0000:43:00] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
"""
NEW_ROWS = """\
           8             2     float     sum      -1    30.10    0.00    0.00       0    29.80    0.00    0.00       0
   268435456      67108864     float     sum      -1   2100.0  127.83  191.74       0   2098.1  127.94  191.91       0
  1073741824     268435456     float     sum      -1   8200.5  130.94  196.41       0   8190.2  131.10  196.65       0
"""
FOOTER = """\
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 129.38
#
# Collective test concluded: all_reduce_perf
"""
NEW = NEW_HEADER + NEW_ROWS + FOOTER

OLD = """\
# nThread 1 nGpus 8 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  4242 on    dgx-01 device  0 [0x06] Tesla V100-SXM2-32GB
#   Rank  1 Pid  4242 on    dgx-01 device  1 [0x07] Tesla V100-SXM2-32GB
#
#                                                     out-of-place                       in-place
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2   float     sum    41.20    0.00    0.00  1e-07    40.11    0.00    0.00  0e+00
   134217728      33554432   float     sum   1420.3   94.50  165.37  1e+00   1418.9   94.59  165.53  1e+00
 Out of bounds values : 2 FAILED
 Avg bus bandwidth    : 82.68
"""


def read(text: str) -> NcclTestsReport:
    return read_lines(text.splitlines())


def test_a_current_table_reads_every_field() -> None:
    report = read(NEW)
    assert (report.test, report.ranks, report.nodes) == ("all_reduce_perf", 4, 2)
    assert [row.size for row in report.rows] == [8, 268435456, 1073741824]
    top = report.largest()
    assert top is not None and (top.size, top.out_of_place.busbw_gbps, top.out_of_place.time_us) == (
        1073741824, 196.41, 8200.5)
    assert top.in_place is not None and top.in_place.busbw_gbps == 196.65
    assert (top.count, top.type, top.redop) == (268435456, "float", "sum")
    assert report.avg_busbw_gbps == 129.38
    assert (report.wrong, report.error, report.problem) == (False, None, None)


def test_a_non_zero_wrong_count_is_wrong_results_even_with_an_ok_footer() -> None:
    text = NEW.replace("131.10  196.65       0", "131.10  196.65    1024")
    report = read(text)
    assert report.wrong is True
    assert report.rows[-1].in_place is not None and report.rows[-1].in_place.wrong == 1024


def test_a_wrong_count_printed_with_an_exponent_is_counted() -> None:
    report = read(NEW.replace("196.41       0", "196.41  1.67772e+07"))
    assert report.rows[-1].out_of_place.wrong == 16777200
    assert report.wrong is True


def test_the_old_error_column_is_no_count_and_its_failed_footer_is_wrong_results() -> None:
    report = read(OLD)
    assert (report.ranks, report.nodes, report.test) == (2, 1, None)
    assert [side.wrong for side in report.rows[-1].sides()] == [None, None]
    assert report.out_of_bounds == 2 and report.wrong is True
    assert report.avg_busbw_gbps == 82.68


def test_the_old_error_column_with_an_ok_footer_is_checked_and_right() -> None:
    report = read(OLD.replace("2 FAILED", "0 OK"))
    assert report.wrong is False


def test_checking_off_gives_na_and_wrong_none() -> None:
    rows = re.sub(r" 0(?= |$)", "N/A", NEW_ROWS, flags=re.MULTILINE)
    report = read(NEW_HEADER + rows + FOOTER)
    assert len(report.rows) == 3
    assert all(side.wrong is None for row in report.rows for side in row.sides())
    assert report.wrong is None


def test_the_first_versions_time_in_ms_is_read_in_us() -> None:
    text = """\
#                                        out-of-place                    in-place
#      bytes             N    type      op     time  algbw  busbw      res     time  algbw  busbw      res
     1048576        262144   float     sum    0.120   8.74  15.29    0e+00    0.121   8.67  15.17    0e+00
"""
    row = read(text).rows[0]
    assert row.out_of_place.time_us == pytest.approx(120.0) and row.out_of_place.wrong is None


def test_per_iteration_columns_and_timestamps() -> None:
    header = ("#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max"
              "    i_p99    i_cv%     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%\n")
    row = ("     1048576        262144     float     sum      -1    40.10   26.15   45.76       0    39.00    45.20"
           "    44.90     3.10    39.90   26.28   45.99       0    38.90    44.10    43.80     2.90\n")
    report = read(header + row)
    assert report.rows[0].out_of_place.busbw_gbps == 45.76 and report.rows[0].in_place is not None
    stamped = read(NEW_HEADER + NEW_ROWS.replace("0.00       0\n", "0.00       0  2025-03-01 10:20:30\n"))
    assert len(stamped.rows) == 3


def test_several_types_and_ops_and_zero_sizes() -> None:
    rows = """\
           0             0     float     sum      -1     1.10    0.00    0.00       0     1.00    0.00    0.00       0
     1048576        262144     float     sum      -1    40.10   26.15   45.76       0    39.90   26.28   45.99       0
     1048576        524288      half     max      -1    38.00   27.59   48.29       0    37.70   27.81   48.67       0
     1048576        131072    double    prod      -1    45.00   23.30   40.78       0    44.80   23.41   40.96       0
     1048576        262144  bfloat16     avg      -1    39.00   26.89   47.05       0    38.90   26.96   47.17       0
"""
    report = read(NEW_HEADER + rows + FOOTER)
    assert [(row.type, row.redop) for row in report.rows][1:] == [("float", "sum"), ("half", "max"),
                                                                  ("double", "prod"), ("bfloat16", "avg")]
    top = report.largest()
    assert top is not None and top.type == "double"  # the lowest busbw at the largest size


def test_alltoall_and_broadcast_rows_without_a_redop() -> None:
    text = """\
#       size         count    type     root     time   algbw   busbw  error     time   algbw   busbw  error
     1048576        262144   float        0    50.00   20.97   20.97  0e+00    49.00   21.40   21.40  0e+00
     2097152        524288   float            90.00   23.30   20.39    N/A    89.00   23.56   20.62    N/A
"""
    report = read(text)
    assert [(row.redop, row.out_of_place.busbw_gbps) for row in report.rows] == [(None, 20.97), (None, 20.39)]


@pytest.mark.parametrize("prefix", ["[1,0]<stdout>:", "0: ", "nccl-test-launcher-x7k2q: ", "[pod/worker-0/main] ",
                                    "2025-03-01T10:20:30.123Z "])
def test_launcher_prefixes(prefix: str) -> None:
    report = read("".join(prefix + line + "\n" for line in NEW.splitlines()))
    assert (report.ranks, report.nodes, len(report.rows), report.avg_busbw_gbps) == (4, 2, 3, 129.38)


def test_mpirun_tag_output_inside_a_row() -> None:
    row = ("[1,0]<stdout>:  1073741824     268435456     float     sum      -1[1,0]<stdout>:   8200.5  130.94  196.41"
           "       0[1,0]<stdout>:   8190.2  131.10  196.65       0\n")
    top = read(NEW_HEADER + row + FOOTER).largest()
    assert top is not None and top.out_of_place.busbw_gbps == 196.41


def test_nccl_info_lines_anywhere_and_one_cutting_a_row() -> None:
    info = "node-a:1001:1050 [0] NCCL INFO Channel 00/0 : 3[1] -> 0[0] [receive] via NET/IB/0/GDRDMA\n"
    cut = ("   268435456      67108864     float     sum      -1" + info +
           info + "  2100.0  127.83  191.74       0   2098.1  127.94  191.91       0\n")
    text = NEW_HEADER + info + NEW_ROWS.splitlines(keepends=True)[0] + cut + info + NEW_ROWS.splitlines()[2] + "\n"
    report = read(text + info + FOOTER)
    assert [row.size for row in report.rows] == [8, 268435456, 1073741824]
    assert report.rows[1].out_of_place.busbw_gbps == 191.74


def test_markdown_around_and_a_header_without_its_hash() -> None:
    text = ("## Results\n\nWe ran:\n\n```shell\n$ mpirun -np 4 ./build/all_gather_perf -b 8 -e 1G -f 2 -g 1\n" +
            NEW.replace("# Collective test starting: all_reduce_perf\n", "").replace("#       size", "        size")
            + "```\n\nThe bandwidth looks fine.\n")
    report = read(text)
    assert (report.test, len(report.rows), report.header) == ("all_gather_perf", 3, True)


@pytest.mark.parametrize(("error", "where"), [
    ("node-b: Test NCCL failure common.cu:1012 'unhandled system error (run with NCCL_DEBUG=INFO for details) / '",
     "before"),
    (" .. node-b pid 2001: Test failure common.cu:891", "inside"),
    ("node-a: Test CUDA failure common.cu:732 'an illegal memory access was encountered'", "after"),
    ("NCCL failure common.cu:486 'unhandled cuda error'", "inside"),
    ("Invalid number of GPUs: 8 requested but only 4 were found.", "before"),
])
def test_errors_before_inside_or_after_the_table(error: str, where: str) -> None:
    parts = {"before": NEW_HEADER + error + "\n" + NEW_ROWS + FOOTER,
             "inside": NEW_HEADER + NEW_ROWS + error + "\n",
             "after": NEW + error + "\n"}
    report = read(parts[where])
    assert report.error == error.strip()
    assert report.problem is not None and error.strip() in report.problem


def test_a_hang_after_the_rank_lines_and_a_cut_short_table() -> None:
    hang = read(NEW_HEADER.split("#\n#      ")[0])
    assert hang.ranks == 4 and not hang.rows
    assert hang.problem is not None and "after the Rank lines (4 ranks)" in hang.problem
    cut = read(NEW_HEADER + NEW_ROWS)
    assert len(cut.rows) == 3 and cut.problem is not None and "cut short" in cut.problem


def test_a_second_run_in_the_file_is_not_read() -> None:
    report = read(NEW + NEW.replace("all_reduce_perf", "all_gather_perf").replace("196.41", "1.00"))
    assert report.more_runs and report.test == "all_reduce_perf"
    top = report.largest()
    assert top is not None and top.out_of_place.busbw_gbps == 196.41


def test_copies_of_the_test_side_by_side_are_no_test_of_the_fabric() -> None:
    """Processes that did not join (an MPI build launched without MPI between them) each print a whole test."""
    report = read("\n".join(f"{rank}: {line}" for line in NEW.splitlines() for rank in (0, 1)))
    assert report.side_by_side and not report.more_runs
    assert report.problem is not None
    assert report.problem.startswith("another run of the test starts before this one ends")


def test_no_table_empty_and_binary() -> None:
    assert read("").problem == "no nccl-tests result table in it"
    assert read("hello\nworld\n").problem == "no nccl-tests result table in it"
    binary = read_stream(io.BytesIO(b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 64))
    assert binary.binary and binary.problem == "a binary file, not the text nccl-tests prints"


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_bounded_on_huge_input(tmp_path: Path) -> None:
    """A 1 GB file (sparse), 10 MB lines and 100,000 rows: a report, in bounded memory."""
    before = _peak_kib()
    huge = tmp_path / "huge.txt"
    with huge.open("wb") as out:
        out.write(NEW.encode())
        out.truncate(1 << 30)
    report = read_path(huge)
    assert report.avg_busbw_gbps == 129.38 and len(report.rows) == 3

    long_lines = tmp_path / "long.txt"
    long_lines.write_bytes(NEW_HEADER.encode() + b"x" * (10 << 20) + b"\n" + NEW_ROWS.encode() + b"9" * (10 << 20)
                           + b"\n" + FOOTER.encode())
    report = read_path(long_lines)
    assert len(report.rows) == 3 and report.problem is None

    many = tmp_path / "many.txt"
    row = NEW_ROWS.splitlines(keepends=True)[1]
    wrong = row.replace("191.74       0", "191.74       3")
    many.write_text(NEW_HEADER + row * 100_000 + wrong + FOOTER)
    report = read_path(many)
    assert (report.rows_seen, len(report.rows)) == (100_001, MAX_ROWS)
    assert report.wrong is True and report.wrong_unkept  # a wrong row past those kept still counts
    assert report.problem is not None and "more than" in report.problem
    assert _peak_kib() - before < 200 * 1024  # KiB: far from the 1 GB read
    assert os.path.getsize(huge) == 1 << 30
