"""Error types shared by every layer; the CLI maps them to exit codes (2 bad input, 1 failed)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One actionable problem in a user's input, rendered as ``file:line:col: path: message``."""

    file: str
    line: int | None
    column: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class MlenvError(Exception):
    """Base class for errors the CLI reports without a traceback."""

    exit_code = 1


class ConfigError(MlenvError):
    """Bad input: one or more problems in a cluster file or in command-line arguments."""

    exit_code = 2

    def __init__(self, problems: list[Problem] | str) -> None:
        if isinstance(problems, str):
            problems = [Problem("mlenv", None, None, "", problems)]
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class UsageError(MlenvError):
    """Bad command-line usage that is not tied to a file (unknown cluster, bad option combination)."""

    exit_code = 2


class OperationError(MlenvError):
    """An operation against a cluster or the local machine failed."""

    exit_code = 1
