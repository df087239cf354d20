"""The in-node side of a remote exec (``kubectl exec``, ``ssh``): a small ``sh`` script that goes to the workspace,
puts the runtime shipped by sync on PYTHONPATH, reads forwarded secrets from stdin, and runs the command.

Every script takes the workspace as ``$1`` and the command as the remaining arguments, so values stay separate
arguments and never become shell text. Secrets arrive on stdin, one value per line in the order of their names,
so they appear on no command line, in no file and in no log.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from mlenv.errors import UsageError

RUNTIME_DIR = ".mlenv"
"""Where sync ships the runtime inside the workspace (``<workspace>/.mlenv/mlenv/runtime``) and where runs live."""
PACKAGE = Path(__file__).resolve().parents[1]
"""The local mlenv package, whose ``__init__.py`` and ``runtime/`` the nodes get."""
RUNTIME_PATH = f'export PYTHONPATH="$1/{RUNTIME_DIR}${{PYTHONPATH:+:$PYTHONPATH}}"'
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_RUN = 'exec "$@"'
_RUN_UNTIL_STDIN_EOF = (
    'exec 3<&0; "$@" </dev/null 3<&- & job=$!; '
    '{ cat <&3 >/dev/null; kill -TERM "$job"; } >/dev/null 2>&1 & watcher=$!; exec 3<&-; '
    'wait "$job"; code=$?; kill "$watcher" 2>/dev/null; exit "$code"'
)
"""The job is stopped (SIGTERM) when the session's stdin closes: the local side went away. The watcher reads the
session's stdin through fd 3, because background jobs of ``sh`` get /dev/null otherwise."""


def runtime_files() -> list[tuple[Path, str]]:
    """Every file of the runtime that the nodes get, with its path there (under the shipped root, ``mlenv/...``):
    ``mlenv/__init__.py`` and each ``.py`` under ``mlenv/runtime/`` (its sub-packages and ``site/`` too), in a stable
    order. The one list of what shipping copies: ``mlenv sync`` stages it, Slurm's submit tars it."""
    runtime = PACKAGE / "runtime"
    files = [PACKAGE / "__init__.py",
             *sorted(path for path in runtime.rglob("*.py") if "__pycache__" not in path.relative_to(runtime).parts)]
    return [(path, path.relative_to(PACKAGE.parent).as_posix()) for path in files]


def secret_names(texts: Iterable[str]) -> tuple[str, ...]:
    """The variable names in ``texts`` (``--env`` values: names separated by commas or spaces), each once; the one
    rule for a forwarded secret's name (UsageError otherwise)."""
    names = [name for text in texts for name in text.replace(",", " ").split()]
    for name in names:
        if not NAME.fullmatch(name):
            raise UsageError(f"--env: expected a variable name like HF_TOKEN, got {name!r}")
    return tuple(dict.fromkeys(names))


def read_secrets(names: Sequence[str]) -> str:
    """Shell that exports each of ``names`` from one line of stdin (``read`` takes one byte at a time from a
    pipe, so nothing after the values is consumed)."""
    return "".join(f'IFS= read -r {name} || exit 125; export {name}; ' for name in secret_names(names))


def script(*, stop_on_stdin_eof: bool = False, secrets: Sequence[str] = ()) -> str:
    """The ``sh -c`` script for a command run in the workspace ``$1``."""
    run = _RUN_UNTIL_STDIN_EOF if stop_on_stdin_eof else _RUN
    return f'cd "$1" || exit 127; {RUNTIME_PATH}; shift; {read_secrets(secrets)}{run}'


def secrets_input(names: Sequence[str], values: dict[str, str]) -> bytes:
    """What the local side writes first to the command's stdin for ``script(secrets=names)``."""
    lines = []
    for name in names:
        value = values[name]
        if "\n" in value or "\r" in value or "\0" in value:
            raise UsageError(f"--env {name}: the value has a line break or NUL byte, which cannot be forwarded")
        lines.append(value)
    return "".join(f"{line}\n" for line in lines).encode()
