"""Reads the output of NVIDIA's nccl-tests (``all_reduce_perf`` and its siblings) as it was printed or pasted:
the result table of every nccl-tests version (``#wrong`` or the old ``error`` column, with or without ``redop`` and
``root``, per-iteration columns, timestamps, time in us or the first versions' ms), ``N/A`` where checking was off
(``-c 0``), several data types and ops (``-d all -o all``), launcher prefixes (``[1,0]<stdout>:``, srun's ``0: ``,
pod names), NCCL INFO lines anywhere, Markdown or shell text around it and a header without its ``#``; the
``# Rank ... on HOST device ...`` lines; the footer; and the errors nccl-tests prints (``Test NCCL failure``, ...).

Reading is streamed and bounded (lines cut at ``MAX_LINE``, at most ``MAX_ROWS`` rows kept), and it never guesses:
what it cannot read stays None, and ``NcclTestsReport.problem`` says why the output cannot be judged."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ..regularfile import open_regular
from .ncclines import iter_lines

MAX_LINE = 4096
"""A longer line is no line of nccl-tests' (rows are under 300 characters): cut there, the rest skipped unread."""
MAX_ROWS = 10_000
"""Rows kept; a table of more is counted, searched for wrong results, and not judged."""
_MAX_RANKS = 1 << 16

_TEST = re.compile(r"\b((?:all_reduce|all_gather|alltoallv?|broadcast|reduce_scatter|reduce|scatter|gather|sendrecv|"
                   r"hypercube)_perf)(?:_mpi)?\b")
_RANK = re.compile(r"\bRank\s+(\d+)\s+(?:Group\s+\d+\s+)?(?:Pid\s+\d+\s+)?on\s+(\S+)\s+device\s+\d+")
_OUT_OF_BOUNDS = re.compile(r"Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?")
_AVERAGE = re.compile(r"Avg bus bandwidth\s*:\s*(\S+)")
_ERROR = re.compile(r"Test (?:NCCL |CUDA )?failure|\bNCCL failure|Test timeout|Invalid number of GPUs")
_TYPE = re.compile(r"[a-z][a-z0-9_]*")
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d|\d\d:\d\d:\d\d")
_NOT_OURS = (" NCCL INFO ", " NCCL WARN ")
_NCCL_LINE = re.compile(r"[A-Za-z][\w.-]*:\d+:\d+ \[\d+\] NCCL (?:INFO|WARN)")
"""Where NCCL's own line starts: it may cut a row, whose numbers then come on a later line."""
_PREAMBLE = 5
"""size count type redop root: a row cut after these waits for its numbers."""
_TAG = re.compile(r"\[\d+,\d+\]<std(?:out|err)>:")
"""mpirun --tag-output's mark, put before every piece a rank prints: ``-1[1,0]<stdout>:    85.14`` inside a row."""
_RUN = re.compile(r"\bnThread \d+ nGpus \d+")
"""The parameters line each run of a test prints first."""


@dataclass(frozen=True)
class Side:
    """One half of a row: out-of-place or in-place."""

    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    wrong: int | None
    """``#wrong``; None where checking was off (``N/A``) or the column is the old ``error`` (a relative error)."""
    checked: bool
    """Whether the results were checked (the column was not ``N/A``)."""

    def to_dict(self) -> dict[str, object]:
        return {"time_us": self.time_us, "algbw_GBps": self.algbw_gbps, "busbw_GBps": self.busbw_gbps,
                "wrong": self.wrong}


@dataclass(frozen=True)
class Row:
    """One row of the result table."""

    size: int
    count: int
    type: str
    redop: str | None
    out_of_place: Side
    in_place: Side | None

    def sides(self) -> tuple[Side, ...]:
        return (self.out_of_place,) if self.in_place is None else (self.out_of_place, self.in_place)

    def to_dict(self) -> dict[str, object]:
        return {"size": self.size, "count": self.count, "type": self.type, "redop": self.redop,
                "out_of_place": self.out_of_place.to_dict(),
                "in_place": self.in_place.to_dict() if self.in_place else None}


@dataclass(frozen=True)
class NcclTestsReport:
    """What an nccl-tests output says; None where it does not say."""

    test: str | None
    ranks: int | None
    nodes: int | None
    rows: tuple[Row, ...]
    rows_seen: int
    out_of_bounds: int | None
    failed_footer: bool
    wrong_unkept: bool
    """A row past the first ``MAX_ROWS`` (not kept) counted wrong elements."""
    avg_busbw_gbps: float | None
    error: str | None
    header: bool
    footer: bool
    binary: bool
    more_runs: bool
    """The file goes on with another run after this one (only the first is read)."""
    side_by_side: bool
    """Another run started before the first ended: copies that did not join one test, or a run that died silently."""

    @property
    def wrong(self) -> bool | None:
        """True when a ``#wrong`` is not 0 or the footer says FAILED; None when nothing was checked."""
        if self.failed_footer or self.wrong_unkept or any(side.wrong for row in self.rows for side in row.sides()):
            return True
        checked = any(side.checked for row in self.rows for side in row.sides())
        return False if checked else None

    @property
    def problem(self) -> str | None:
        """Why the bandwidth cannot be judged (an error, no rows, cut short, ...); None when it can."""
        if self.binary:
            return "a binary file, not the text nccl-tests prints"
        if self.side_by_side:
            return ("another run of the test starts before this one ends (no footer, no error): copies side by side, "
                    "processes that did not join one test (no MPI between them: srun's MPI plugin, mpirun), or a "
                    "run that stopped without a word")
        if self.error:
            return f"nccl-tests failed: {self.error}"
        if not self.rows:
            if self.ranks:
                return (f"the output stops after the Rank lines ({self.ranks} ranks) with no result row: "
                        "a hang, or cut short")
            return "a result header and no row under it" if self.header else "no nccl-tests result table in it"
        if self.rows_seen > len(self.rows):
            return f"{self.rows_seen} rows: more than {MAX_ROWS}, so not judged"
        if not self.footer:
            return (f"the output stops inside the table after the {self.rows[-1].size}-byte row (no "
                    "'Avg bus bandwidth' footer): cut short")
        return None

    def largest(self) -> Row | None:
        """The row of the largest size (of several at that size, the one of the lowest out-of-place busbw)."""
        if not self.rows:
            return None
        top = max(row.size for row in self.rows)
        return min((row for row in self.rows if row.size == top), key=lambda row: row.out_of_place.busbw_gbps)


@dataclass
class _Layout:
    group: int = 4
    """Columns of one side: time algbw busbw #wrong (+ 4 per-iteration columns)."""
    wrong_column: str | None = None
    """``#wrong``, ``error`` (old), or None before a header says."""
    time_scale: float = 1.0
    """To microseconds (the first versions printed ms)."""


@dataclass
class NcclTestsReader:
    """Fed line by line (``feed``); ``report()`` at any point."""

    layout: _Layout = field(default_factory=_Layout)
    test: str | None = None
    hosts: set[str] = field(default_factory=set)
    ranks: set[int] = field(default_factory=set)
    rows: list[Row] = field(default_factory=list)
    rows_seen: int = 0
    wrong_unkept: bool = False
    out_of_bounds: int | None = None
    failed_footer: bool = False
    average: float | None = None
    error: str | None = None
    header: bool = False
    footer: bool = False
    binary: bool = False
    runs: bool = False
    more_runs: bool = False
    side_by_side: bool = False
    pending: list[str] = field(default_factory=list)
    """The start of a row an NCCL line cut (``size count type redop root``)."""

    def feed(self, line: str) -> bool:
        """Read one line; False once nothing more can be learnt: binary data, or a second run begins (the first
        run is the one read)."""
        if "\x00" in line:  # not text from here on (a binary file, or a log's preallocated tail): stop
            self.binary = not (self.rows or self.header or self.ranks or self.error)
            return False
        if any(mark in line for mark in _NOT_OURS):
            if not self.footer and (head := _NCCL_LINE.split(line, maxsplit=1)[0].split()):
                self._table_line(head)
            return True
        if "]<std" in line:
            line = _TAG.sub(" ", line)
        if _RUN.search(line):
            if self.runs:  # after the first run's end: the next run; before it: a copy running beside it
                self.more_runs, self.side_by_side = bool(self.footer or self.error), not (self.footer or self.error)
                return False
            self.runs = True
        if self.error is None and _ERROR.search(line):
            self.error = line.strip()[:MAX_LINE]
        if self.footer:
            return True
        if self.test is None and (test := _TEST.search(line)):
            self.test = test[1]
        if (rank := _RANK.search(line)) and len(self.ranks) < _MAX_RANKS:
            self.ranks.add(int(rank[1]))
            self.hosts.add(rank[2])
        elif found := _OUT_OF_BOUNDS.search(line):
            self.out_of_bounds, self.failed_footer = int(found[1]), found[2] == "FAILED" or int(found[1]) > 0
        elif found := _AVERAGE.search(line):
            self.average, self.footer = _finite(found[1]), True
        else:
            self._table_line(line.split())
        return True

    def _table_line(self, tokens: list[str]) -> None:
        if "algbw" in tokens and "busbw" in tokens:
            self.header = True
            self.layout.group = 8 if "i_min" in tokens else 4
            self.layout.wrong_column = "error" if "error" in tokens or "res" in tokens else "#wrong"
            self.layout.time_scale = 1000.0 if "res" in tokens else 1.0  # the first versions: ms, no units line
        elif "(ms)" in tokens or "(us)" in tokens:
            self.layout.time_scale = 1000.0 if "(ms)" in tokens else 1.0
        elif (row := self._row(tokens)) is not None:
            self.rows_seen += 1
            if len(self.rows) < MAX_ROWS:
                self.rows.append(row)
            elif any(side.wrong for side in row.sides()):
                self.wrong_unkept = True

    def _row(self, tokens: list[str]) -> Row | None:
        """The row in ``tokens``, or in the start an NCCL line cut and these numbers; keeps such a start."""
        pending, self.pending = self.pending, []
        start = _start(tokens)
        if start is None:
            return _row([*pending, *tokens], 0, self.layout) if pending else None
        if len(tokens) - start <= _PREAMBLE:
            self.pending = tokens[start:]
            return None
        return _row(tokens, start, self.layout)

    def report(self) -> NcclTestsReport:
        return NcclTestsReport(
            test=self.test, ranks=len(self.ranks) or None, nodes=len(self.hosts) or None,
            rows=tuple(self.rows), rows_seen=self.rows_seen, out_of_bounds=self.out_of_bounds,
            failed_footer=self.failed_footer, wrong_unkept=self.wrong_unkept, avg_busbw_gbps=self.average,
            error=self.error, header=self.header, footer=self.footer, binary=self.binary, more_runs=self.more_runs,
            side_by_side=self.side_by_side)


def _finite(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()


def _start(tokens: list[str]) -> int | None:
    """Where a row starts in ``tokens`` (``size count type``, after any prefix), or None."""
    for start in range(min(len(tokens) - 2, 8)):
        if tokens[start].isdigit() and tokens[start + 1].isdigit() and _TYPE.fullmatch(tokens[start + 2]):
            return start
    return None


def _row(tokens: list[str], start: int, layout: _Layout) -> Row | None:
    """The result row starting at ``tokens[start]``, or None."""
    rest = tokens[start + 3:]
    redop = rest.pop(0) if rest and _TYPE.fullmatch(rest[0]) else None
    while rest and _TIMESTAMP.fullmatch(rest[-1]):
        rest.pop()
    root = len(rest) % 4 == 1
    if root and not _is_int(rest[0]):
        return None
    values = rest[1:] if root else rest
    group = layout.group
    if len(values) not in (group, 2 * group):
        return None
    sides = [side for at in range(0, len(values), group) if (side := _side(values[at:at + group], layout))]
    if len(sides) * group != len(values):
        return None
    out_of_place, in_place = sides[0], sides[1] if len(sides) == 2 else None
    return Row(int(tokens[start]), int(tokens[start + 1]), tokens[start + 2], redop, out_of_place, in_place)


def _side(values: list[str], layout: _Layout) -> Side | None:
    time, algbw, busbw = (_finite(value) for value in values[:3])
    if time is None or algbw is None or busbw is None:
        return None
    mark = values[3]
    if mark == "N/A":
        return Side(time * layout.time_scale, algbw, busbw, None, False)
    if layout.wrong_column == "#wrong" and (count := _finite(mark)) is not None:
        return Side(time * layout.time_scale, algbw, busbw, int(count), True)
    if layout.wrong_column is None and mark.isdigit():
        return Side(time * layout.time_scale, algbw, busbw, int(mark), True)
    if _finite(mark) is None:
        return None
    return Side(time * layout.time_scale, algbw, busbw, None, True)


def read_lines(lines: Iterable[str]) -> NcclTestsReport:
    """The report of an nccl-tests output given line by line."""
    reader = NcclTestsReader()
    for line in lines:
        if not reader.feed(line):
            break
    return reader.report()


def read_stream(stream: BinaryIO) -> NcclTestsReport:
    """The report of an nccl-tests output read from a binary stream, in bounded memory."""
    return read_lines(iter_lines(stream, MAX_LINE))


def read_path(path: Path) -> NcclTestsReport:
    """The report of an nccl-tests output file; NotRegularFile when ``path`` is a directory, a device or a named pipe
    (never read: /dev/zero has no end), OSError when it cannot be opened."""
    with open_regular(path) as stream:
        return read_stream(stream)
