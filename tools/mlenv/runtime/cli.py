"""Command line of the in-pod runtime: ``python3 -m mlenv.runtime <command>``.

Exit status: 0 ok, 1 the check or the job failed, 2 bad input (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from .launcher import LAUNCHERS, launch
from .nccl import detect_nccl_env
from .ncclog import CONTRADICTS, contradicts, parse_nccl_log
from .topology import TopologyError, detect_topology


class BadInput(Exception):
    """Input the user can fix; reported in one line with exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = _Parser(
        prog="python3 -m mlenv.runtime",
        description="mlenv's in-pod runtime: topology, NCCL settings, job launch, NCCL transport check.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    topology = commands.add_parser("topology", help="print this node's rank, node count and master")
    topology.add_argument("--json", action="store_true", help="print one JSON object")

    nccl = commands.add_parser("nccl-env", help="print the NCCL/Gloo variables this node needs")
    nccl.add_argument("--sysfs-root", default="/sys", help="sysfs mount (default: %(default)s)")
    nccl.add_argument("--proc-root", default="/proc", help="procfs mount (default: %(default)s)")
    nccl.add_argument("--master-addr", help="its route picks the socket interface (default: the topology's)")
    output = nccl.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help='print {"env": {...}, "warnings": [...]}')
    output.add_argument("--shell", action="store_true", help="print export lines for eval")
    nccl.add_argument("--explain", action="store_true", help="explain each decision on stderr")

    run = commands.add_parser(
        "launch",
        help="start the job on this node (run it on every node)",
        usage="%(prog)s [-h] [--launcher {torchrun,deepspeed}] [--nproc N] [--run-dir DIR] [--dry-run] "
        "-- SCRIPT [ARGS...]",
    )
    run.add_argument("--launcher", choices=LAUNCHERS, help="default: $MLENV_LAUNCHER or torchrun")
    run.add_argument("--nproc", type=_positive_int, metavar="N",
                     help="processes on this node (default: $MLENV_PROCS_PER_NODE, else one per GPU, else 1)")
    run.add_argument("--run-dir", type=Path, metavar="DIR",
                     help="write node<R>.log and the hostfile there (default: $MLENV_RUN_DIR)")
    run.add_argument("--dry-run", action="store_true", help="print the added variables and the command")
    run.add_argument("job", nargs=argparse.REMAINDER, help="the script and its arguments, after --")

    check = commands.add_parser("nccl-log-check", help="tell from NCCL_DEBUG=INFO output what NCCL used")
    check.add_argument("files", nargs="+", metavar="FILE", help="log files ('-' for stdin)")
    check.add_argument("--json", action="store_true", help='print {"verdict": ..., "ranks": [...]}')
    check.add_argument("--expect", choices=sorted(CONTRADICTS), help="exit 1 if the log shows the other")
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run one command; returns the exit status."""
    env = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    try:
        return int(_COMMANDS[args.command](args, env))
    except (BadInput, TopologyError) as err:
        print(f"mlenv.runtime {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # e.g. a run directory that cannot be written
        print(f"mlenv.runtime {args.command}: failed: {err}", file=sys.stderr)
        return 1


def _topology(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    found = detect_topology(environ).to_dict()
    lines = (f"{name}={'' if value is None else value}" for name, value in found.items())
    print(json.dumps(found) if args.json else "\n".join(lines))
    return 0


def _nccl_env(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    for root in (args.sysfs_root, args.proc_root):
        if not Path(root).is_dir():
            raise BadInput(f"{root} is not a directory")
    master = args.master_addr or _master_addr(environ)
    result = detect_nccl_env(
        environ, sysfs_root=args.sysfs_root, proc_root=args.proc_root, master_addr=master
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        prefix = "export " if args.shell else ""
        print("".join(f"{prefix}{k}={shlex.quote(v)}\n" for k, v in result.env.items()), end="")
    warnings = [] if args.json else [f"warning: {w}" for w in result.warnings]
    notes = result.explain if args.explain else warnings
    print("".join(f"{note}\n" for note in notes), end="", file=sys.stderr)
    return 0


def _master_addr(environ: Mapping[str, str]) -> str | None:
    try:
        return detect_topology(environ).master_addr
    except TopologyError:
        return None


def _launch(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not job:
        raise BadInput("no job given: launch [options] -- SCRIPT [ARGS...]")
    launcher = args.launcher or environ.get("MLENV_LAUNCHER", "torchrun")
    if launcher not in LAUNCHERS:
        raise BadInput(f"MLENV_LAUNCHER={launcher!r} is not one of {', '.join(LAUNCHERS)}")
    if not Path(job[0]).is_file():
        raise BadInput(f"no such script: {job[0]} (relative to {Path.cwd()})")
    run_dir = args.run_dir or (Path(environ["MLENV_RUN_DIR"]) if environ.get("MLENV_RUN_DIR") else None)
    return launch(
        job, launcher=launcher, environ=environ, nproc=args.nproc, run_dir=run_dir, dry_run=args.dry_run
    )


def _nccl_log_check(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    report = parse_nccl_log(line for name in args.files for line in _read_lines(name))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        for rank in report.ranks:
            print(rank.summary())
            print("".join(f"  NCCL WARN {w}\n" for w in rank.warnings), end="")
        print(f"verdict: {report.verdict}")
    if args.expect and contradicts(report.verdict, args.expect):
        print(f"error: expected {args.expect}, the log shows {report.verdict}", file=sys.stderr)
        return 1
    return 0


def _read_lines(name: str) -> list[str]:
    """Lines of a log file, or of stdin for ``-``."""
    try:
        return sys.stdin.readlines() if name == "-" else Path(name).read_text(errors="replace").splitlines()
    except OSError as err:
        raise BadInput(f"cannot read {name}: {err.strerror}") from None


_COMMANDS = {
    "topology": _topology,
    "nccl-env": _nccl_env,
    "launch": _launch,
    "nccl-log-check": _nccl_log_check,
}
