"""ui.table lays plain tables out itself, exactly as rich does (rich takes ~3 ms a row); everything else is rich's."""

from __future__ import annotations

import io
import random
import string

import pytest
from mlenv.errors import shown
from mlenv.ui import PIPE_WIDTH, _plain_table, table
from rich.console import Console
from rich.table import Table
from rich.text import Text


def _rich(title: str | None, columns: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    grid = Table(title=title, header_style="bold", show_edge=False, pad_edge=False)
    for index, column in enumerate(columns):
        grid.add_column(column, no_wrap=index == 0, overflow="fold")
    for row in rows:
        grid.add_row(*(Text(cell) for cell in row))
    Console(file=out, width=PIPE_WIDTH).print(grid)
    return out.getvalue()


def test_plain_tables_are_what_rich_prints() -> None:
    draw = random.Random(22)  # noqa: S311 - test data, not secrets
    compared = 0
    for _ in range(300):
        columns = ["".join(draw.choices(string.ascii_uppercase, k=draw.randint(1, 9)))
                   for _ in range(draw.randint(1, 7))]
        rows = [["".join(draw.choices(string.ascii_letters + " -_.:[]/", k=draw.randint(0, 14))) for _ in columns]
                for _ in range(draw.randint(0, 6))]
        title = draw.choice([None, "", "T", "bench256 (kubernetes, tcp, namespace ml, current)"])
        mine = _plain_table(title, columns, rows, PIPE_WIDTH, styled=False)
        if mine is not None:
            assert mine == _rich(title, columns, rows), (title, columns, rows)
            compared += 1
    assert compared > 250


@pytest.mark.parametrize(("title", "cell"), [("t", "naïve"), ("t", "tab\there"), ("t", "x" * 300), ("long " * 9, "x")])
def test_rich_lays_out_the_rest(title: str, cell: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _plain_table(title, ["A"], [[cell]], PIPE_WIDTH, styled=False) is None
    table(title, ["A"], [[cell]])
    assert capsys.readouterr().out == _rich(title, ["A"], [[shown(cell)]])  # a tab shows as \t: no value moves text
