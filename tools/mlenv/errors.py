"""Error types shared by every layer; the CLI maps them to exit codes (2 bad input, 1 failed).

``shown`` and ``show_value`` make user text safe for one-line messages: every message that quotes a file
name, a key or a value from the user should pass it through one of them.
"""

from __future__ import annotations

import json
from typing import NamedTuple

from mlenv.runtime.records.jsonvalue import JsonObject

_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def shown(text: str, *, ascii_only: bool = False) -> str:
    """``text`` fit for one line of output: control, format, invisible, unassigned and non-ASCII space characters
    (Unicode Cc, Cf, Cs, Co, Cn, Zl, Zp, Zs but the ASCII space) are escaped as in Python (``per\\u200b_node``,
    ``a\\nb``), so nothing can start a new line or hide. With ``ascii_only`` every non-ASCII character is escaped
    too, for names that are ASCII when right (keys, field paths), where a look-alike letter would fool the eye."""
    if text.isprintable() and (not ascii_only or text.isascii()):
        return text
    return "".join(char if char.isprintable() and (not ascii_only or char.isascii()) else _escape(char)
                   for char in text)


def show_value(value: object) -> str:
    """A short, JSON-quoted, one-line rendering of a user's value for error messages."""
    text = shown(json.dumps(value, ensure_ascii=False, default=str))
    return text if len(text) <= 60 else text[:57] + "..."


NO_FILE = "mlenv"
"""The file of a problem that is in no file (a command-line argument): messages start ``mlenv: ...``."""


class Problem(NamedTuple):
    """One actionable problem in a user's input, rendered as ``file:line:col: path: message`` on one line."""

    file: str
    line: int | None
    column: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = shown(self.file)
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        message = shown(self.message)
        return f"{where}: {shown(self.path, ascii_only=True)}: {message}" if self.path else f"{where}: {message}"

    def to_dict(self) -> JsonObject:
        """The problem as ``--json`` reports it (docs/json.md): file, line, column, field (null where none)."""
        return {"file": None if self.file == NO_FILE else self.file, "line": self.line, "column": self.column,
                "field": self.path or None, "message": self.message}


class MlenvError(Exception):
    """Base class for errors the CLI reports without a traceback."""

    exit_code = 1

    def errors(self) -> list[JsonObject]:
        """The error as ``--json`` reports it: one entry, its message whole, in no file."""
        return [Problem(NO_FILE, None, None, "", str(self)).to_dict()]


class ConfigError(MlenvError):
    """Bad input: one or more problems in a cluster file or in command-line arguments."""

    exit_code = 2

    def __init__(self, problems: list[Problem] | str) -> None:
        if isinstance(problems, str):
            problems = [Problem(NO_FILE, None, None, "", problems)]
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))

    def errors(self) -> list[JsonObject]:
        """Every problem, in the order they are said."""
        return [problem.to_dict() for problem in self.problems]


class UsageError(MlenvError):
    """Bad command-line usage that is not tied to a file (unknown cluster, bad option combination)."""

    exit_code = 2


class OperationError(MlenvError):
    """An operation against a cluster or the local machine failed."""

    exit_code = 1
