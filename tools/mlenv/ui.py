"""Terminal output: errors, warnings, tables, progress. rich is imported only when something is drawn.

Everything printed here may quote values from a cluster file or a remote host: control characters in it are
escaped (``errors.shown``), line by line, so that no value can colour, move or reorder the terminal's text. The
output of a job passes elsewhere (``parallel``), untouched.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from mlenv.errors import shown

PIPE_WIDTH = 200


def safe_lines(message: str) -> str:
    """``message`` with every line's control characters escaped; the line breaks stay."""
    return "\n".join(shown(line) for line in message.split("\n"))


def error(message: str) -> None:
    """One problem per line on stderr."""
    for line in safe_lines(message).splitlines():
        print(f"error: {line}" if not line.startswith("error:") else line, file=sys.stderr)


def warn(message: str) -> None:
    """A WARNING line on stderr."""
    print(f"WARNING: {safe_lines(message)}", file=sys.stderr)


def info(message: str) -> None:
    """Progress and summaries go to stderr so stdout stays machine-readable."""
    print(safe_lines(message), file=sys.stderr)


def say(message: str) -> None:
    """A line of a report on stdout, escaped as ``info`` escapes."""
    print(safe_lines(message))


def print_json(data: Any) -> None:
    """Machine-readable output on stdout."""
    print(json.dumps(data, indent=2, sort_keys=False))


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A table on stdout in rich's layout (heavy head, no outer edge); piped output gets a wide fixed width so
    cells are not folded. Plain ASCII tables that fit are laid out here (rich takes ~3 ms a row: most of
    ``status``'s time on 256 pods), anything else by rich."""
    cells = [[shown(str(cell)) for cell in row] for row in rows]  # values from files and hosts: escaped
    title = None if title is None else shown(title)
    terminal = sys.stdout.isatty()
    width = os.get_terminal_size(sys.stdout.fileno()).columns if terminal else PIPE_WIDTH
    text = _plain_table(title, [str(c) for c in columns], cells, width, terminal)
    if text is not None:
        sys.stdout.write(text)
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console() if terminal else Console(width=PIPE_WIDTH)
    grid = Table(title=None if title is None else Text(title), header_style="bold", show_edge=False, pad_edge=False)
    for index, column in enumerate(columns):
        grid.add_column(column, no_wrap=index == 0, overflow="fold")
    for row in cells:
        grid.add_row(*(Text(cell) for cell in row))  # cells are data, never rich markup ([host]:22 stays)
    console.print(grid)


def _plain_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]], width: int,
                 styled: bool) -> str | None:
    """What rich prints for this table (bold header, italic title when ``styled``), or None when rich must lay
    it out: a cell or title that is not plain printable ASCII, or a table wider than ``width``."""
    texts = [title or "", *columns, *(cell for row in rows for cell in row)]
    if not all(text.isascii() and text.isprintable() for text in texts):
        return None
    widths = [max(len(cells[i]) for cells in [columns, *rows]) for i in range(len(columns))]
    last = len(columns) - 1
    padded = [(1 if i else 0) + w + (1 if i < last else 0) for i, w in enumerate(widths)]
    total = sum(padded) + last
    if total > width or len(title or "") > total:
        return None

    def line(cells: Sequence[str], bar: str, style: str = "") -> str:
        parts = [(" " if i else "") + cell.ljust(w) + (" " if i < last else "")
                 for i, (cell, w) in enumerate(zip(cells, widths, strict=True))]
        return bar.join(f"\033[{style}m{part}\033[0m" if style else part for part in parts)

    lines = []
    if title:
        left = (total - len(title)) // 2
        centred = " " * left + title + " " * (total - len(title) - left)
        lines.append(f"\033[3m{centred}\033[0m" if styled else centred)
    lines += [line(columns, "┃", "1" if styled else ""), "╇".join("━" * w for w in padded)]
    lines += [line(row, "│") for row in rows]
    return "\n".join(lines) + "\n"


@contextmanager
def spinner(message: str) -> Iterator[None]:
    """A live spinner on stderr while something runs (just the message when stderr is not a terminal)."""
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        info(message)
        yield
        return
    with console.status(message):
        yield


@contextmanager
def live_view() -> Iterator[Callable[[Any], None]]:
    """Yields ``update(renderable)``: a rich Live display on a terminal's stderr; elsewhere (CI logs, pipes)
    only the last state is printed, once."""
    from rich.console import Console
    from rich.live import Live

    console = Console(stderr=True)
    if console.is_terminal:
        with Live(console=console, refresh_per_second=4) as live:
            yield live.update
        return
    last: list[Any] = []
    try:
        yield last.append
    finally:
        if last:
            console.print(last[-1])
