"""Terminal output: errors, warnings, tables, progress. rich is imported only when something is drawn.

Everything printed here may quote values from a cluster file or a remote host: control characters in it are
escaped (``errors.shown``), line by line, so that no value can colour, move or reorder the terminal's text. The
output of a job passes elsewhere (``parallel``), untouched.
"""

from __future__ import annotations

import json
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
    """A rich table on stdout; piped output gets a wide fixed width so cells are not folded."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)
    grid = Table(title=None if title is None else Text(shown(title)), header_style="bold", show_edge=False,
                 pad_edge=False)
    for index, column in enumerate(columns):
        grid.add_column(column, no_wrap=index == 0, overflow="fold")
    for row in rows:
        grid.add_row(*(Text(shown(str(cell))) for cell in row))  # data, never rich markup ([host]:22 stays)
    console.print(grid)


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
