"""The ``mlenv`` command line: parses arguments and prints; the work happens in the modules it imports lazily.

``mlenv --help`` lists the commands from COMMANDS alone: their options and code (commands.py) are imported only
to run one, or for its own help."""

# Imported where used: mlenv.errors (~24 ms with what it imports), mlenv.ui (~43 ms) and mlenv.cli.commands, none of
# which --help needs (tests/unit/test_cli_imports.py holds it to click and this module).
from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from functools import wraps
from gettext import gettext
from typing import Any, NoReturn, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

COMMANDS = {
    "list": "List the clusters in clusters/: backend, nodes x GPUs, RDMA, storage mode.",
    "validate": "Check a cluster file (schema, semantics, and what its backend would send); print OK or every problem.",
    "render": "Print what deploy sends for a cluster (validated), exactly as deploy --dry-run does.",
    "deploy": "Deploy a cluster's environment and wait until every node is ready (re-running converges).",
    "use": "Make the deployment NAME (its name, cluster name or cluster file) the current one.",
    "status": "Nodes of the current deployment (or --cluster, or --all): node, phase, ready, GPUs, IP, jobs; and its "
              "latest run (or run RUN_ID, from mlenv runs).",
    "runs": "Every run of the current deployment (or --cluster, or --all), newest first: id, script, state, exit "
            "code, attempts, start, duration, nodes and the first failure. mlenv logs/stacks/status RUN_ID show one.",
    "stacks": "Python stack of every rank of the latest run (or of run RUN_ID while it runs; of --pod N's), grouped: "
              "the odd ones out first.",
    "top": "Live GPU state of every node (or --pod N): GPUs, Xid/ECC events, the job's ranks' CPU, RSS, last output.",
    "sync": "Copy workspace/ to the workspace of every node, in parallel and incrementally (plus the runtime).",
    "exec": "Run COMMAND on every node (or --pod N) in parallel, output prefixed [node-N] (--json: each node's exit "
            "code and output at the end).",
    "shell": "Interactive shell on node 0 (or --pod N), in its workspace; stdin not a terminal: runs what it reads.",
    "logs": "The latest run's output (or run RUN_ID's, from mlenv runs) on every node (or --pod N): every rank's "
            "lines whole, tagged [node-N rR]; every attempt of a restarted run, each under its header.",
    "stop": "Stop the running job on every node; the environment stays (a finished run is left as it is).",
    "clean": "Delete everything the deployment created; data volumes are kept unless --delete-data. Twice is fine: "
             "with nothing (left) to delete it says so and exits 0.",
    "launch": "Start SCRIPT on every node at once through the runtime; fail-fast, logs in runs/.",
    "nccl-test": "The fabric gate: all-reduce busbw per size, NCCL's transport per rank, PASS at >= 80 % of the "
                 "expected bandwidth (RDMA asked and sockets used: FAIL); results and a plot under runs/. Exit 1 on "
                 "FAIL, or with --pairs when a node is named slow. --read FILE judges an nccl-tests output instead "
                 "(exit 1 on FAIL, and on UNKNOWN under --expect).",
    "drill": "How fast the deployment recovers: a small built-in training job (its own run and checkpoints) under "
             "--max-restarts 1, one fault at a step, each phase timed from the runtime's records (detected and named, "
             "every rank stopped, next attempt started, training resumed at the checkpointed step) against "
             "drill.targets; a table or --json, and runs/<id>/timeline.png. Exit 1 when a phase FAILs; 2 with a run "
             "live (nothing started).",
    "nodes": "Where the deployment's nodes run now (a pod's Kubernetes node), and the nodes excluded from its next "
             "runs (by nccl-test --pairs --exclude-bad or restarts), and why.",
    "doctor": "Preflight checklist for a cluster: PASS/WARN/FAIL, the evidence and the fix; exit 1 on any FAIL.",
    "discover": "Write clusters/NAME.yaml from the logged-in cluster: GPU nodes, storage classes, RDMA networks; TODO "
                "comments mark what a person must decide.",
    "demo": "Local 2-node cluster -> sync -> DeepSpeed training -> all-reduce bench -> summary -> clean.",
}
"""Every command with the first paragraph of its help: what ``mlenv --help`` shortens to one line (commands.py
adds the rest of each command's help: its docstring)."""


def reports_errors(func: F) -> F:
    """Turn mlenv errors into one-line messages and exit codes (2 bad input, 1 failed, 130 interrupted); never a
    traceback. A command run with ``--json`` also prints them on stdout as ``{"ok": false, "errors": [...]}``
    (docs/json.md)."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from mlenv.errors import MlenvError, OperationError
        from mlenv.ui import error

        try:
            return func(*args, **kwargs)
        except MlenvError as exc:
            error(str(exc))
            _exit_failed(exc.errors(), exc.exit_code, bool(kwargs.get("as_json")))
        except KeyboardInterrupt:
            error("interrupted")
            _exit_failed(OperationError("interrupted").errors(), 130, bool(kwargs.get("as_json")))

    return wrapper  # type: ignore[return-value]


def _exit_failed(errors: Sequence[Mapping[str, object]], exit_code: int, as_json: bool) -> NoReturn:
    """Exit with ``exit_code``; with ``as_json`` the ``errors`` (said on stderr already) go to stdout as JSON."""
    if as_json:
        from mlenv.ui import print_json

        print_json({"ok": False, "errors": errors})
    sys.exit(exit_code)


class _Commands(click.Group):
    """The group of mlenv's commands (COMMANDS), each made only when asked for by name, with what every command
    shares at its end: a usage error of a command run with ``--json`` is JSON too, and a reader that closed stdout
    (``mlenv logs | head -1``) ends it quietly with exit 0, as ``head`` expects of a writer."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command ``cmd_name``; the first one asked for makes them all (commands.py), so that click also has
        the commands to suggest from when a name is mistyped."""
        if not self.commands:
            from mlenv.cli.commands import MADE

            for made in MADE.values():
                self.add_command(made)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's list of the commands, each shortened from its first paragraph as click does, with no command
        made (nor commands.py imported)."""
        limit = formatter.width - 6 - max(map(len, COMMANDS))
        with formatter.section(gettext("Commands")):
            formatter.write_dl([(name, click.Command(name, help=COMMANDS[name]).get_short_help_str(limit))
                                for name in self.list_commands(ctx)])

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        with _quiet_when_stdout_goes():  # mlenv --help | head -1
            return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        words = list(ctx.args)  # the command's arguments, as typed (its name apart)
        with _quiet_when_stdout_goes():
            try:
                return super().invoke(ctx)
            except click.UsageError as exc:
                if exc.ctx is None or not _wants_json(exc.ctx.command, words):
                    raise
                from mlenv.errors import UsageError

                exc.show()
                _exit_failed(UsageError(exc.format_message()).errors(), exc.exit_code, True)


@contextmanager
def _quiet_when_stdout_goes() -> Iterator[None]:
    """Exit 0 at once, saying nothing, when stdout's reader has gone (BrokenPipeError); what is still buffered is
    written here, not at exit."""
    try:
        try:
            yield
        finally:
            sys.stdout.flush()
    except BrokenPipeError:
        with suppress(OSError, ValueError):  # stdout may be no file (click's test runner)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to write at exit
        sys.exit(0)


def _wants_json(command: click.Command, words: list[str]) -> bool:
    """Whether ``command`` has --json and ``words`` give it (before any ``--``)."""
    given = words[:words.index("--")] if "--" in words else words
    return "--json" in given and any(param.name == "as_json" for param in command.params)


def _terminal_width() -> int:
    """What shutil.get_terminal_size says ($COLUMNS, else the terminal, else 80), without importing shutil, which
    click would otherwise import to format every help text."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(1).columns or 80
    except (ValueError, OSError):
        return 80


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100,
                               "terminal_width": _terminal_width()})
@click.version_option(package_name="mlenv")
def main() -> None:
    """mlenv: one YAML file per GPU cluster -> a working multi-node training environment.

    Clusters are named (clusters/NAME.yaml) or given as a path.
    """

