"""Commands on every node at once, through the backend's exec: exec, logs and an interactive shell."""

from __future__ import annotations

import contextlib
import io
import json
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial

from mlenv.core.capabilities import Handle, Jobs, Node, NodeAccess
from mlenv.errors import UsageError
from mlenv.parallel import run_parallel
from mlenv.runtime.records.jsonvalue import JsonObject
from mlenv.ui import info, print_json

NODE_TAG = re.compile(r"^\[node-(?P<node>\d+)(?: r\d+)?\] ?")
UNKNOWN_RANK = 2
"""A node's ``logs --rank N`` when rank N did not run there."""


def select_nodes(backend: NodeAccess, handle: Handle, only: int | None) -> list[Node]:
    """Every node, or just node ``only``, which may be a spare (UsageError naming the valid ordinals when it does
    not exist)."""
    nodes = backend.nodes(handle)
    if only is None:
        return nodes
    chosen = [n for n in nodes if n.ordinal == only]
    if not chosen:
        spares = backend.spares(handle)
        chosen = [n for n in spares if n.ordinal == only]
        if not chosen:
            named = ", ".join([*(str(n.ordinal) for n in nodes), *(f"{n.ordinal} (spare)" for n in spares)])
            raise UsageError(f"pod {only} does not exist: {handle.name} has pods {named} (--pod N / POD=N)")
    return chosen


@dataclass(frozen=True)
class NodeAnswer:
    """What one node's runtime command printed: its last JSON object (None: none), the other lines, exit code."""

    node: Node
    data: JsonObject | None
    exit_code: int
    output: Sequence[str] = field(default_factory=list)

    @property
    def error(self) -> str:
        """Why there is no answer, in one line: the node's last words, else its exit code."""
        said = [line.strip() for line in self.output if line.strip()]
        return said[-1] if said else f"no answer (exit code {self.exit_code})"


def runtime_json(backend: NodeAccess, handle: Handle, nodes: Sequence[Node], *args: str) -> dict[int, NodeAnswer]:
    """The runtime's ``ARGS`` (a command printing one JSON object) on every node of ``nodes`` at once; a node that
    cannot be reached answers with its error while the others answer."""
    commands = {n.ordinal: backend.exec_argv(handle, n, backend.runtime(handle, *args)) for n in nodes}
    lines: dict[int, list[str]] = {}
    result = run_parallel(commands, echo=False, on_line=lambda node, line: lines.setdefault(node, []).append(line))
    answers = {}
    for node in nodes:
        said = lines.get(node.ordinal, [])
        data = next((found for line in reversed(said) if line.startswith("{")
                     for found in [_object(line)] if found is not None), None)
        answers[node.ordinal] = NodeAnswer(node, data, result.exit_codes.get(node.ordinal, 1),
                                           [line for line in said if not line.startswith("{")])
    return answers


def _object(line: str) -> JsonObject | None:
    try:
        found = json.loads(line)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def exit_code(code: int) -> int:
    """A process's exit code as a shell gives it: 128+N for one ended by signal N (negative in Python)."""
    return 128 - code if code < 0 else code


def exec_all(backend: NodeAccess, handle: Handle, argv: Sequence[str], only: int | None = None,
             as_json: bool = False) -> int:
    """Run ``argv`` on every node (or node ``only``) at once; 0 when all succeeded. A node that failed is named
    (its exec tool's own error, e.g. kubectl's, says what went wrong but not on which pod or host). With
    ``as_json`` the nodes' lines are not shown as they come: each node's exit code and output, as JSON at the end."""
    nodes = select_nodes(backend, handle, only)
    commands = {n.ordinal: backend.exec_argv(handle, n, argv, stop_on_stdin_eof=True) for n in nodes}
    said: dict[int, list[str]] = {n.ordinal: [] for n in nodes}
    result = run_parallel(commands, keep_stdin=True, echo=not as_json,
                          on_line=(lambda ordinal, line: said[ordinal].append(line)) if as_json else None)
    for node in nodes:
        code = result.exit_codes.get(node.ordinal, 0)
        if code and node.ordinal not in result.stopped:
            how = f"exit status {code}" if code > 0 else f"ended by signal {-code}"
            info(f"node-{node.ordinal} ({node.name}): {how}")
    if as_json:
        print_json({"ok": result.exit_code == 0, "command": list(argv), "exit_code": exit_code(result.exit_code),
                    "nodes": [{"node": n.ordinal, "pod": n.name, "exit_code": exit_code(result.exit_codes[n.ordinal]),
                               "output": said[n.ordinal]} for n in nodes]})
    return result.exit_code


def stop_all(jobs: Jobs, handle: Handle, as_json: bool = False) -> int:
    """Stop every job of ``handle`` (``Jobs.stop``); with ``as_json`` what each node said, as JSON."""
    if not as_json:
        return jobs.stop(handle)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = exit_code(jobs.stop(handle))
    nodes, other = said_by_node(out.getvalue())
    print_json({"ok": code == 0, "exit_code": code, "said": other,
                "nodes": [{"node": node, "output": lines} for node, lines in sorted(nodes.items())]})
    return code


def said_by_node(text: str) -> tuple[dict[int, list[str]], list[str]]:
    """The lines of ``text`` (what a fan-out printed) by the node that tagged them (``[node-N]``, ``[node-N rR]``),
    untagged; and the lines no node tagged."""
    nodes: dict[int, list[str]] = {}
    other: list[str] = []
    for line in text.splitlines():
        match = NODE_TAG.match(line)
        if match is None:
            other.append(line)
        else:
            nodes.setdefault(int(match["node"]), []).append(line[match.end():])
    return nodes, other


def logs_all(backend: NodeAccess, handle: Handle, only: int | None = None, follow: bool = False,
             rank: int | None = None, jobs: Jobs | None = None, run_id: str | None = None,
             as_json: bool = False) -> int:
    """Print (or follow, through every attempt) the logs of the latest run, or of ``run_id``, on every node (or
    node ``only``), prefixed ``[node-N]`` (``as_json``: one JSON object a line, ``json_line``); with ``rank`` only
    the lines of that global rank, from the node it ran on (UsageError when no node of the run has it)."""
    run = partial(run_parallel, keep_stdin=follow, echo=not as_json, on_line=json_line if as_json else None)
    which = f"run {run_id}" if run_id is not None else "the latest run"
    if rank is None:
        nodes = select_nodes(backend, handle, only)
        argvs = {n.ordinal: backend.logs_argv(handle, n, follow, None, run_id) for n in nodes}
    elif jobs is not None:  # the records say where it ran
        where = jobs.rank_nodes(handle) if run_id is None else {
            found.rank: found.node for found in jobs.latest_run(handle, run_id).ranks}
        if rank not in where:
            known = ", ".join(map(str, sorted(where))) or "none"
            raise UsageError(f"rank {rank} is not in {which} of {handle.name} (its ranks: {known})")
        (node,) = select_nodes(backend, handle, where[rank])
        argvs = {node.ordinal: backend.logs_argv(handle, node, follow, rank, run_id)}
    else:  # every node's logs, filtered there; the nodes without the rank end with 2 and say nothing
        nodes = select_nodes(backend, handle, only)
        argvs = {n.ordinal: backend.logs_argv(handle, n, follow, rank, run_id) for n in nodes}
        result = run(argvs)
        codes = [code for code in result.exit_codes.values() if code != UNKNOWN_RANK]
        if not codes:
            raise UsageError(f"rank {rank} is not in {which} of {handle.name}")
        return 0 if result.interrupted and follow else next((code for code in codes if code), 0)
    result = run(argvs)
    return 0 if result.interrupted and follow else result.exit_code


RANK_LINE = re.compile(r"\[node-\d+ r(\d+)\] (.*)", re.DOTALL)
"""A rank's line as its node's supervisor tags it."""


def json_line(ordinal: int, line: str) -> None:
    """``logs --json``: one line of node ``ordinal``'s log as ``{"node", "rank", "line"}`` (``rank`` null for the
    node's own lines: its launcher's, mlenv's), on stdout at once."""
    tagged = RANK_LINE.fullmatch(line)
    shown = {"node": ordinal, "rank": int(tagged[1]) if tagged else None, "line": tagged[2] if tagged else line}
    sys.stdout.write(json.dumps(shown) + "\n")
    sys.stdout.flush()


def interactive(backend: NodeAccess, handle: Handle, ordinal: int) -> int:
    """An interactive shell (bash when the node has it) on node ``ordinal``, in its workspace; where stdin is no
    terminal (a pipe, a file), a shell that runs what it reads, without prompts or job control."""
    (node,) = select_nodes(backend, handle, ordinal)
    terminal = sys.stdin.isatty()
    if not terminal:
        info(f"stdin is not a terminal: a shell on node-{ordinal} runs what it reads, without a prompt "
             "(mlenv exec runs a command on every node)")
    how = "-i" if terminal else "-s"
    shell = ["sh", "-c", f"command -v bash >/dev/null 2>&1 && exec bash {how} || exec sh {how}"]
    argv = backend.exec_argv(handle, node, shell, interactive=terminal)
    # Ctrl-C belongs to the shell: a handler (unlike SIG_IGN) is not inherited by the command
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        return subprocess.call(argv)
    finally:
        signal.signal(signal.SIGINT, previous)
