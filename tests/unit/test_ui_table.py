"""ui.layout draws tables as rich does (rich takes ~3 ms a row), one line per row, cut to the terminal's width."""

from __future__ import annotations

import io
import random
import re
import string

import pytest
from mlenv.ui import ELLIPSIS, judged, layout, styled, table, table_width
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

STATUS = ["POD", "NODE", "PHASE", "READY", "RESTARTS", "GPUS", "IP", "RDMA", "JOBS", "DETAIL"]
ESCAPES = re.compile(r"\x1b\[[0-9;]*m")


def _rich(title: str | None, columns: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    grid = Table(title=title, header_style="bold", show_edge=False, pad_edge=False)
    for column in columns:
        grid.add_column(column, no_wrap=True)
    for row in rows:
        grid.add_row(*(Text(cell) for cell in row))
    Console(file=out, width=1000).print(grid)
    return out.getvalue()


def _status_rows(count: int) -> list[list[str]]:
    return [[f"bench-{n}", f"worker-{n}.example.internal", "Running" if n % 3 else "Pending", "yes", "0", "8",
             f"10.128.{n}.17", "mlx5_0,mlx5_1", str(n % 2),
             "0/4 nodes are available: 4 Insufficient nvidia.com/gpu" if n % 3 == 0 else ""] for n in range(count)]


def test_tables_that_fit_are_what_rich_prints() -> None:
    draw = random.Random(22)  # noqa: S311 - test data, not secrets
    for _ in range(300):
        columns = ["".join(draw.choices(string.ascii_uppercase, k=draw.randint(1, 9)))
                   for _ in range(draw.randint(1, 7))]
        rows = [["".join(draw.choices(string.ascii_letters + " -_.:[]/", k=draw.randint(0, 14))) for _ in columns]
                for _ in range(draw.randint(0, 6))]
        title = draw.choice([None, "", "T", "bench256 (kubernetes, tcp, namespace ml)"])
        if title and len(title) > len(_rich(None, columns, rows).splitlines()[0]):
            title = None  # rich folds a title wider than its table; here it stays on one line
        assert layout(title, columns, rows, None, False) == _rich(title, columns, rows), (title, columns, rows)


@pytest.mark.parametrize("width", [60, 80, 100, 120])
def test_at_any_width_one_line_per_row_and_every_header_whole(width: int) -> None:
    rows = _status_rows(5)
    lines = layout("bench (kubernetes, rdma, namespace ml, current)", STATUS, rows, width, False).splitlines()
    assert len(lines) == 3 + len(rows)  # title, header, rule, one line per pod: nothing folded
    assert all(cell_len(line) <= width for line in lines), lines
    assert re.split(r"\s*┃\s*", lines[1].strip()) == STATUS
    assert [line.split("│")[0].strip()[:3] for line in lines[3:]] == ["ben"] * len(rows)


def test_details_are_cut_first_then_the_columns_to_their_left() -> None:
    rows = _status_rows(3)
    wide = layout(None, STATUS, rows, None, False).splitlines()
    assert ELLIPSIS not in "".join(wide)
    unpadded = len(wide[0]) - 2 * (len(STATUS) - 1)  # the padding goes first
    assert ELLIPSIS not in layout(None, STATUS, rows, unpadded, False)
    narrower = layout(None, STATUS, rows, unpadded - 5, False).splitlines()
    cells = [re.split(r"\s*│\s*", line.strip()) for line in narrower[2:]]
    assert cells[0][-1].endswith(ELLIPSIS) and [row[:-1] for row in cells] == [row[:-1] for row in rows]
    narrowest = layout(None, STATUS, rows, 60, False).splitlines()
    cells = [line.split("│") for line in narrowest[2:]]
    assert cells[0][0] == "bench-0" and cells[0][1].endswith(ELLIPSIS)  # the pod's name stays whole longest


def test_headers_stay_whole_where_they_cannot_fit() -> None:
    lines = layout(None, STATUS, _status_rows(2), 30, False).splitlines()
    assert lines[0].split("┃") == STATUS and {len(line) for line in lines} == {len(lines[0])}


def test_wide_characters_take_two_cells() -> None:
    lines = layout(None, ["NAME", "NOTE"], [["n0", "日本語のノード名です"]], 20, False).splitlines()
    assert all(cell_len(line) <= 20 for line in lines) and lines[2].endswith(ELLIPSIS)


def test_colour_for_states_on_a_terminal_only() -> None:
    rows = [["p-0", "Running", "PASS"], ["p-1", "Failed", "FAIL"], ["p-2", "Pending", "WARN"]]
    coloured = layout(None, ["POD", "PHASE", "RESULT"], rows, 80, True)
    assert "\x1b[32mRunning" in coloured and "\x1b[31mFAIL" in coloured and "\x1b[33mWARN" in coloured
    plain = layout(None, ["POD", "PHASE", "RESULT"], rows, 80, False)
    assert ESCAPES.sub("", coloured) == plain and "\x1b" not in plain


def test_no_color_and_pipes_get_no_style(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = io.StringIO()
    terminal.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert styled(terminal) and not styled(io.StringIO())
    monkeypatch.setenv("NO_COLOR", "")  # set but empty: no-color.org says it does not count
    assert styled(terminal)
    monkeypatch.setenv("NO_COLOR", "1")
    assert not styled(terminal)


def test_piped_tables_stay_wide_unless_columns_is_set(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert table_width() is None
    table("t", STATUS, _status_rows(2))
    assert ELLIPSIS not in capsys.readouterr().out
    monkeypatch.setenv("COLUMNS", "60")
    assert table_width() == 60
    table("t", STATUS, _status_rows(2))
    assert max(cell_len(line) for line in capsys.readouterr().out.splitlines()) <= 60


def test_cells_are_data(capsys: pytest.CaptureFixture[str]) -> None:
    table("t", ["A"], [["tab\there \x1b[31m[red]"]])
    assert capsys.readouterr().out.splitlines()[-1] == "tab\\there \\x1b[31m[red]"  # no value moves or colours text


def test_a_verdict_in_its_colour_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = io.StringIO()
    terminal.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setattr("sys.stdout", terminal)
    judged("FAIL", "busbw 3.1 GB/s is 2 % of the expected 180 GB/s")
    monkeypatch.setenv("NO_COLOR", "1")
    judged("PASS", "ok")
    assert terminal.getvalue().splitlines() == ["\x1b[31mFAIL\x1b[0m: busbw 3.1 GB/s is 2 % of the expected 180 GB/s",
                                                "PASS: ok"]
