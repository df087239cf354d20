"""Terminal output: errors, warnings, tables, progress. rich is imported only when something is drawn.

Everything printed here may quote values from a cluster file or a remote host: control characters in it are
escaped (``errors.shown``), line by line, so that no value can colour, move or reorder the terminal's text. The
output of a job passes elsewhere (``parallel``), untouched.
"""

# rich is imported where used (its console ~270 ms, cells ~16 ms measured on a busy 2-core host, python -X
# importtime): a command that prints only plain lines or JSON never loads it.
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TextIO

from mlenv.errors import shown

ELLIPSIS = "…"
"""Ends a cell cut to fit the terminal."""
COLOURS = {**dict.fromkeys(("PASS", "ok", "Ready", "Running", "running", "Reachable", "succeeded", "Succeeded"), "32"),
           **dict.fromkeys(("WARN", "Pending", "ContainerCreating", "NoWorkspace", "stopped", "hung", "idle",
                            "Unknown", "Terminating", "not created"), "33"),
           **dict.fromkeys(("FAIL", "Failed", "failed", "Missing", "Broken", "Unreachable", "Error",
                            "CrashLoopBackOff"), "31")}
"""The colour (an SGR code) of a table cell that is exactly one of these states or verdicts."""
View = Callable[[int | None, bool], str]
"""Something ``live_view`` draws: (width or None for no limit, styled) -> its text."""


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


def judged(verdict: str, reasons: str) -> None:
    """``VERDICT: reasons`` on stdout, the verdict (PASS, WARN, FAIL) in its colour where ``styled``."""
    colour = COLOURS.get(verdict) if styled(sys.stdout) else None
    word = f"\033[{colour}m{shown(verdict)}\033[0m" if colour else shown(verdict)
    print(f"{word}: {safe_lines(reasons)}")


def print_json(data: Any) -> None:
    """Machine-readable output on stdout."""
    print(json.dumps(data, indent=2, sort_keys=False))


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Within: whatever this process and its children write on stdout (file descriptor 1) goes to stderr, so that
    a command's ``--json`` is all its stdout holds."""
    sys.stdout.flush()
    kept = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(kept, 1)
        os.close(kept)


def styled(stream: TextIO) -> bool:
    """Whether to style (colour, bold) what goes to ``stream``: a terminal, and NO_COLOR unset or empty
    (https://no-color.org)."""
    return not os.environ.get("NO_COLOR") and stream.isatty()


def table_width() -> int | None:
    """How wide a table on stdout may be: $COLUMNS when set, else the terminal's width; None (no limit: piped output
    stays wide and the same everywhere) when stdout is not a terminal."""
    try:
        return max(1, int(os.environ["COLUMNS"]))
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else None
    except (OSError, ValueError):
        return None


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A table on stdout, one line per row, cut to the terminal's width (``layout``)."""
    sys.stdout.write(layout(title, columns, rows, table_width(), styled(sys.stdout)))


def layout(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], width: int | None,
           style: bool) -> str:
    """rich's table layout (heavy head, no outer edge; bold header, italic title, states in colour when ``style``),
    drawn here (rich takes ~3 ms a row: most of ``status``'s time on 256 pods). Each row is one line; when the
    table is wider than ``width``, the padding goes first, then cells are cut with … from the last column leftwards
    (the details first), never below their header's width, which stays whole."""
    cells = [[shown(str(cell)) for cell in row] for row in rows]  # values from files and hosts: escaped
    heads = [shown(str(column)) for column in columns]
    title = None if title is None else shown(title)
    measure = _measure([title or "", *heads, *(cell for row in cells for cell in row)])
    natural = [max(measure(cells[i]) for cells in [heads, *cells]) for i in range(len(heads))]
    least = [measure(head) for head in heads]
    pad, widths = 1, _fitted(natural, natural, width, 1)
    if widths is None:
        pad, widths = 0, _fitted(natural, least, width, 0) or least
    last = len(heads) - 1
    total = sum(widths) + last * (2 * pad + 1)

    def line(row: Sequence[str], bar: str, head: bool = False) -> str:
        parts = []
        for i, (cell, w) in enumerate(zip(row, widths, strict=True)):
            text = _cut(cell, w, measure)
            text += " " * (w - measure(text))
            colour = ("1" if head else COLOURS.get(cell)) if style else None
            if colour:
                text = f"\033[{colour}m{text}\033[0m"
            parts.append((" " * pad if i else "") + text + (" " * pad if i < last else ""))
        return bar.join(parts)

    lines = []
    if title:
        size = measure(title)
        shown_title = (" " * ((total - size) // 2) + title + " " * (total - size - (total - size) // 2)
                       if size <= total else _cut(title, width, measure) if width is not None else title)
        lines.append(f"\033[3m{shown_title}\033[0m" if style else shown_title)
    lines += [line(heads, "┃", head=True), "╇".join("━" * (w + pad * ((i > 0) + (i < last)))
                                                       for i, w in enumerate(widths))]
    lines += [line(row, "│") for row in cells]
    return "\n".join(lines) + "\n"


def cut(line: str, width: int | None) -> str:
    """``line`` escaped (``errors.shown``) and, with a ``width``, cut to it with …."""
    text = shown(line)
    return text if width is None else _cut(text, width, _measure([text]))


def _measure(texts: Sequence[str]) -> Callable[[str], int]:
    """How many terminal cells a text of ``texts`` takes: its length when all are ASCII, else rich's count (wide
    and combining characters)."""
    if all(text.isascii() for text in texts):
        return len
    from rich.cells import cell_len

    return cell_len


def _fitted(natural: Sequence[int], least: Sequence[int], width: int | None, pad: int) -> list[int] | None:
    """Column widths that fit ``width`` with ``pad`` spaces either side of each bar: ``natural`` cut from the last
    column leftwards, none below ``least``; None when even that is too wide."""
    widths = list(natural)
    if width is None:
        return widths
    excess = sum(widths) + (len(widths) - 1) * (2 * pad + 1) - width
    for i in reversed(range(len(widths))):
        if excess <= 0:
            break
        taken = min(excess, widths[i] - least[i])
        widths[i] -= taken
        excess -= taken
    return widths if excess <= 0 else None


def _cut(text: str, width: int, measure: Callable[[str], int]) -> str:
    """``text``, or as much of it as fits ``width`` with … at its end."""
    if measure(text) <= width:
        return text
    if width < 1:
        return ""
    if measure is len:
        return text[:width - 1] + ELLIPSIS
    kept = text
    while kept and measure(kept) + 1 > width:
        kept = kept[:-1]
    return kept + ELLIPSIS


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
def live_view() -> Iterator[Callable[[str | View], None]]:
    """Yields ``update(view)``: a line of text, or a ``View`` drawn at the terminal's width (every line whole or cut,
    never folded), live on a terminal's stderr; elsewhere (CI logs, pipes) only the last state is printed, once,
    at full width."""
    from rich.console import Console
    from rich.live import Live

    console = Console(stderr=True)
    if console.is_terminal:
        with Live(console=console, refresh_per_second=4) as live:
            yield lambda view: live.update(_Drawn(view, styled(sys.stderr)))
        return
    last: list[str | View] = []
    try:
        yield last.append
    finally:
        if last:
            sys.stderr.write(_drawn(last[-1], None, False))


def _drawn(view: str | View, width: int | None, style: bool) -> str:
    """``view``'s text (a line of text is escaped), ending with a line break."""
    text = safe_lines(view) if isinstance(view, str) else view(width, style)
    return text if text.endswith("\n") else text + "\n"


class _Drawn:
    """A view as rich's Live shows it: drawn at the console's width each time it refreshes."""

    def __init__(self, view: str | View, style: bool) -> None:
        self.view, self.style = view, style

    def __rich_console__(self, console: Any, options: Any) -> Iterator[Any]:
        from rich.text import Text

        text = _drawn(self.view, options.max_width, self.style).rstrip("\n")
        yield Text.from_ansi(text, no_wrap=True, overflow="ellipsis")
