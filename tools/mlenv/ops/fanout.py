"""Commands on every node at once, through the backend's exec: exec, logs and an interactive shell."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Sequence

from mlenv.backends.base import Backend, Handle, Node
from mlenv.errors import UsageError
from mlenv.parallel import run_parallel

UNKNOWN_RANK = 2
"""A node's ``logs --rank N`` when rank N did not run there."""


def select_nodes(backend: Backend, handle: Handle, only: int | None) -> list[Node]:
    """Every node, or just node ``only`` (UsageError naming the valid ordinals when it does not exist)."""
    nodes = backend.nodes(handle)
    if only is None:
        return nodes
    chosen = [n for n in nodes if n.ordinal == only]
    if not chosen:
        raise UsageError(f"pod {only} does not exist: {handle.name} has pods "
                         f"{', '.join(str(n.ordinal) for n in nodes)} (--pod N / POD=N)")
    return chosen


def exec_all(backend: Backend, handle: Handle, argv: Sequence[str], only: int | None = None) -> int:
    """Run ``argv`` on every node (or node ``only``) at once; 0 when all succeeded."""
    nodes = select_nodes(backend, handle, only)
    commands = {n.ordinal: backend.exec_argv(handle, n, argv, stop_on_stdin_eof=True) for n in nodes}
    return run_parallel(commands, keep_stdin=True).exit_code


def logs_all(backend: Backend, handle: Handle, only: int | None = None, follow: bool = False,
             rank: int | None = None) -> int:
    """Print (or follow) the logs of every node (or node ``only``), prefixed ``[node-N]``; with ``rank`` only the
    lines of that global rank, from the node it ran on (UsageError when no node of the newest run has it)."""
    if rank is None:
        nodes = select_nodes(backend, handle, only)
        argvs = {n.ordinal: backend.logs_argv(handle, n, follow) for n in nodes}
    elif hasattr(backend, "rank_nodes"):  # ask the nodes' records where the rank ran
        where = backend.rank_nodes(handle)
        if rank not in where:
            known = ", ".join(map(str, sorted(where))) or "none"
            raise UsageError(f"rank {rank} is not in the latest run of {handle.name} (its ranks: {known})")
        (node,) = select_nodes(backend, handle, where[rank])
        argvs = {node.ordinal: backend.logs_argv(handle, node, follow, rank)}  # type: ignore[call-arg]
    else:  # every node's logs, filtered there; the nodes without the rank end with 2 and say nothing
        nodes = select_nodes(backend, handle, only)
        argvs = {n.ordinal: backend.logs_argv(handle, n, follow, rank) for n in nodes}  # type: ignore[call-arg]
        result = run_parallel(argvs, keep_stdin=follow)
        codes = [code for code in result.exit_codes.values() if code != UNKNOWN_RANK]
        if not codes:
            raise UsageError(f"rank {rank} is not in the latest run of {handle.name}")
        return 0 if result.interrupted and follow else next((code for code in codes if code), 0)
    result = run_parallel(argvs, keep_stdin=follow)
    return 0 if result.interrupted and follow else result.exit_code


def interactive(backend: Backend, handle: Handle, ordinal: int) -> int:
    """An interactive shell (bash when the node has it) on node ``ordinal``, in its workspace."""
    (node,) = select_nodes(backend, handle, ordinal)
    shell = ["sh", "-c", "command -v bash >/dev/null 2>&1 && exec bash -i || exec sh -i"]
    argv = backend.exec_argv(handle, node, shell, interactive=True)
    # Ctrl-C belongs to the shell: a handler (unlike SIG_IGN) is not inherited by the command
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        return subprocess.call(argv)
    finally:
        signal.signal(signal.SIGINT, previous)
