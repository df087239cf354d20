"""Terminal output: errors, warnings, tables, progress. rich is imported only when something is drawn."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

PIPE_WIDTH = 200


def error(message: str) -> None:
    """One problem per line on stderr."""
    for line in message.splitlines():
        print(f"error: {line}" if not line.startswith("error:") else line, file=sys.stderr)


def warn(message: str) -> None:
    """A WARNING line on stderr."""
    print(f"WARNING: {message}", file=sys.stderr)


def info(message: str) -> None:
    """Progress and summaries go to stderr so stdout stays machine-readable."""
    print(message, file=sys.stderr)


def print_json(data: Any) -> None:
    """Machine-readable output on stdout."""
    print(json.dumps(data, indent=2, sort_keys=False))


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A rich table on stdout; piped output gets a wide fixed width so cells are not folded."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)
    grid = Table(title=title, header_style="bold", show_edge=False, pad_edge=False)
    for index, column in enumerate(columns):
        grid.add_column(column, no_wrap=index == 0, overflow="fold")
    for row in rows:
        grid.add_row(*(Text(str(cell)) for cell in row))  # cells are data, never rich markup ([host]:22 stays)
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
