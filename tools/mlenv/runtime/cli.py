"""Command line of the in-pod runtime: ``python3 -m mlenv.runtime <command>``.

Exit status: 0 ok, 1 the check or the job failed, 2 bad input (one line on stderr, no traceback);
``logs --follow`` ends with the job's own exit status.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from .doctor import examine, render, torch_fix
from .fabric.nccl import detect_nccl_env
from .fabric.ncclog import EXPECTATIONS, LogReport, NcclLogReader, iter_lines, judge
from .forensics.stacks import METHODS
from .launchers import DEFAULT_LAUNCHER, LAUNCHABLE, LAUNCHERS, missing_modules
from .node.topology import TopologyError, detect_topology
from .records.restartpolicy import IDLE_EXIT_CODE
from .records.runlayout import (
    absolute_checkpoint_dir,
    write_atomic,
)
from .supervise import slurmsteps
from .supervise.control import SILENCE_SECONDS
from .supervise.detached import restart, resume, start_node, wait_as_standby
from .supervise.faults import SIGNALS, TARGETS, inject
from .supervise.jobs import BadInput, JobError
from .supervise.launcher import launch
from .supervise.nodejobs import show_gpus, show_jobs, show_logs, show_stacks, stop
from .watch.assemble import observers_for
from .watch.hang import HANG_EXIT_CODE
from .watch.idle import DEFAULT_IDLE_UTIL

LOG_WAIT_SECONDS = 60.0


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors in one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of 0 or more, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}")
    return value


def _rank(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a rank (0, 1, ...), got {text!r}")
    return int(text)


def _hang_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected a percentage from 0 to 100, got {text!r}")
    return value


def _run_id(text: str) -> str:
    if not text or "/" in text or text in (".", ".."):
        raise argparse.ArgumentTypeError(f"expected the name of a run directory, got {text!r}")
    return text


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
        usage="%(prog)s [-h] [--launcher {torchrun,deepspeed}] [--nproc N] [--run-dir DIR] [--dry-run | --detach] "
        "-- SCRIPT [ARGS...]",
    )
    run.add_argument("--launcher", choices=LAUNCHERS, help=f"default: $MLENV_LAUNCHER or {DEFAULT_LAUNCHER}")
    run.add_argument("--nproc", type=_positive_int, metavar="N",
                     help="processes on this node (default: $MLENV_PROCS_PER_NODE, else one per GPU, else 1)")
    run.add_argument("--run-dir", type=Path, metavar="DIR",
                     help="the run's directory: this node's records, output.log and hostfile go to "
                          "DIR/attempt-<K>/node<R>/ (default: $MLENV_RUN_DIR)")
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the added variables and the command")
    mode.add_argument("--detach", action="store_true",
                      help="run in the background (needs a run directory); docs/runs.md has its files")
    run.add_argument("--expect-transport", choices=EXPECTATIONS, metavar="{rdma,sockets,any}",
                     help="what NCCL's output must prove; a contradiction fails the job "
                          "(default: rdma in rdma mode, else any)")
    run.add_argument("--hang-timeout", type=_hang_seconds, metavar="SECONDS",
                     help="no rank output on any node (any bytes: a progress bar's updates count) for this long: "
                          "capture every rank's stack into the run directory, tell the attached user, state hung")
    run.add_argument("--on-hang", choices=["stop"],
                     help=f"with --hang-timeout: also stop the job (exit code {HANG_EXIT_CODE}, as timeout)")
    run.add_argument("--idle-seconds", type=_hang_seconds, metavar="SECONDS",
                     help="every GPU of the job (CUDA_VISIBLE_DEVICES) under --idle-util for this long: say so on "
                          "every node and record it in state.json (idle)")
    run.add_argument("--idle-util", type=_percent, metavar="PERCENT",
                     help=f"with --idle-seconds: a GPU under this utilization is idle (default: {DEFAULT_IDLE_UTIL:g})")
    run.add_argument("--on-idle", choices=["stop", "warn"],
                     help=f"with --idle-seconds: stop the job (exit code {IDLE_EXIT_CODE}, never restarted), or only "
                          "warn (the default)")
    run.add_argument("--on-straggler", choices=["warn", "exclude"],
                     help="a rank (or node) that enters collectives last and holds the job back is named; exclude "
                          "also gives its node the node-fault sign straggler (left out at the next restart)")
    run.add_argument("--node-silence", type=_hang_seconds, metavar="SECONDS",
                     help=f"a node heard nothing from for this long is lost: stopped and judged unreachable "
                          f"(default: {SILENCE_SECONDS:g})")
    run.add_argument("--max-restarts", type=_count, default=0, metavar="N",
                     help="with --detach: when the job fails (not when it is stopped), start it again on this node, "
                          "up to N times, as attempt K+1 (MLENV_RESTART_COUNT) of the same run")
    run.add_argument("--max-preemptions", type=_count, metavar="N",
                     help="with --detach, in a pod: how many times the run resumes after a pod of it was taken away "
                          "(default: every time)")
    run.add_argument("--standby", type=_count, metavar="SLOT",
                     help="with --detach, on a spare host: wait (on MASTER_PORT + 2 + SLOT) until node 0 hands this "
                          "host a node that must be left out of the run, then run that node's share from the next "
                          "attempt on")
    run.add_argument("--exit-file", type=Path, help=argparse.SUPPRESS)  # the recorded supervisor's
    run.add_argument("--detached-supervisor", action="store_true", help=argparse.SUPPRESS)  # stdout is the log
    run.add_argument("job", nargs=argparse.REMAINDER, help="the script and its arguments, after --")

    runs_help = "where the runs are (default: $MLENV_RUNS_ROOT, else .mlenv/runs)"
    jobs = commands.add_parser("jobs", help="this host's jobs and their states (running, succeeded, failed, ...)")
    jobs.add_argument("--runs-root", type=Path, metavar="DIR", help=runs_help)
    jobs.add_argument("--json", action="store_true", help="print a JSON list")

    stop = commands.add_parser("stop", help="stop this host's running detached jobs (a finished run is left as it is)")
    stop.add_argument("--runs-root", type=Path, metavar="DIR", help=runs_help)
    stop.add_argument("--run", type=_run_id, metavar="ID", help="only this run (default: every run)")
    stop.add_argument("--grace", type=_seconds, default=10.0, metavar="SECONDS",
                      help="time between SIGTERM and SIGKILL (default: %(default)s)")

    logs = commands.add_parser("logs", help="print this node's log of a detached job")
    logs.add_argument("--runs-root", type=Path, metavar="DIR", help=runs_help)
    logs.add_argument("--run", type=_run_id, metavar="ID", help="default: the newest run with a job of this host")
    logs.add_argument("--rank", type=_rank, metavar="N", help="only the lines of global rank N (exit 2: not here)")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="print new lines until the job ends, then exit with its exit status")
    logs.add_argument("--wait", type=_seconds, default=LOG_WAIT_SECONDS, metavar="SECONDS",
                      help="with --follow, how long to wait for a job that is just starting (default: %(default)s)")

    launchable = commands.add_parser("launchable", help="whether this node can launch SCRIPT: one JSON line (the "
                                                        "script, the launcher's modules missing from this Python)")
    launchable.add_argument("--launcher", choices=LAUNCHERS, default=DEFAULT_LAUNCHER)
    launchable.add_argument("script", metavar="SCRIPT")

    doctor = commands.add_parser("doctor", help="check what this node sees: RDMA, GID, memlock, /dev/shm, master")
    doctor.add_argument("--sysfs-root", default="/sys", help="sysfs mount (default: %(default)s)")
    doctor.add_argument("--proc-root", default="/proc", help="procfs mount (default: %(default)s)")
    doctor.add_argument("--rendezvous", type=_seconds, metavar="SECONDS",
                        help="node 0 listens on the rendezvous port this long, the others connect to it")
    doctor.add_argument("--json", action="store_true", help="print one JSON line: checks, facts and the clock")

    gpus = commands.add_parser("gpus", help="this node's GPUs, Xid/ECC events since the run started, its ranks")
    gpus.add_argument("--runs-root", type=Path, metavar="DIR", help=runs_help)
    gpus.add_argument("--proc-root", type=Path, default=Path("/proc"), help="procfs mount (default: %(default)s)")
    gpus.add_argument("--kmsg", type=Path, default=Path("/dev/kmsg"),
                      help="the kernel log, read for Xid events (default: %(default)s)")
    gpus.add_argument("--json", action="store_true", help="print one JSON object")

    stacks = commands.add_parser("stacks", help="the Python stack of every rank of this node's latest run")
    stacks.add_argument("--runs-root", type=Path, metavar="DIR", help=runs_help)
    stacks.add_argument("--run", type=_run_id, metavar="ID", help="default: the newest run with a job of this host")
    stacks.add_argument("--native", action="store_true", help="add native frames (py-spy only)")
    stacks.add_argument("--method", choices=METHODS, default="auto",
                        help="py-spy (ptrace), faulthandler (the signal the runtime armed), or auto: py-spy, "
                             "else faulthandler (default)")
    stacks.add_argument("--json", action="store_true", help="print one JSON object")

    attempts = commands.add_parser(
        "slurm-attempts", help="run a Slurm run's attempts, each one srun step (its script execs this): again while "
                               "the restart policy allows, on a spare or in a batch job without a node it leaves out")
    attempts.add_argument("--run-dir", type=Path, required=True, metavar="DIR", help="the run's directory")
    attempts.add_argument("--attempt", type=_count, default=0, metavar="K", help="the attempt mlenv asked for")
    attempts.add_argument("--max-restarts", type=_count, default=0, metavar="N", help="the run's --max-restarts")
    attempts.add_argument("--job-nodelist", default="", metavar="NODELIST", help="the job's nodes (SLURM_JOB_NODELIST)")
    attempts.add_argument("--nodelist", default="", metavar="H0,H1,...",
                          help="the run's nodes in node-rank order (srun --nodelist, placed by SLURM_PROCID)")
    attempts.add_argument("--allocation", default="", metavar="H,...",
                          help="with --nodelist: the allocation's nodes, whose spares take a left-out node's place")
    attempts.add_argument("--exclude", default="", metavar="H,...", help="the nodes left out before")
    attempts.add_argument("--script", metavar="FILE",
                          help="a batch job's script ($0): submitted again to go on without a node left out")
    attempts.add_argument("--export", default="", metavar="VARS", help="with --script: its sbatch --export")
    attempts.add_argument("--warning", metavar="SIGNAL", help="the scheduler's warning signal (USR1, 10)")
    attempts.add_argument("--grace", type=_count, default=0, metavar="SECONDS",
                          help="with --requeues: the ranks' time to checkpoint after the warning")
    attempts.add_argument("--requeues", type=_count, metavar="N",
                          help="requeue the job after the warning, at most N times (none: never)")
    attempts.add_argument("--requeues-by", default="", metavar="WORDS", help="what allows --requeues, as said")
    attempts.add_argument("--secrets", action="store_true",
                          help="stdin holds the forwarded secrets, every attempt's srun's stdin")
    attempts.add_argument("srun", nargs=argparse.REMAINDER, metavar="-- SRUN...", help="one attempt's srun")

    resuming = commands.add_parser("resume", help="a pod back after a preemption: resume this node's share of the "
                                                  "detached run $MLENV_RESUME_RUN as its next attempt (its PID 1 runs "
                                                  "this)")
    resuming.add_argument("--runs-root", type=Path, metavar="DIR", help=runs_help)

    fault = commands.add_parser("fault", help="signal this node's share of a run, or one of its ranks, from outside "
                                              "(mlenv drill): prints the signal, the pids and when")
    fault.add_argument("--runs-root", type=Path, metavar="DIR", help=runs_help)
    fault.add_argument("--run", type=_run_id, required=True, metavar="ID", help="the run")
    fault.add_argument("--attempt", type=_count, metavar="K", help="default: the newest attempt")
    fault.add_argument("--node", type=_count, required=True, metavar="R", help="the node rank")
    fault.add_argument("--target", choices=TARGETS, required=True,
                       help="node: its supervisor and every process of its share; rank: its highest global rank")
    fault.add_argument("--signal", choices=sorted(SIGNALS), required=True)

    check = commands.add_parser("nccl-log-check", help="tell from NCCL_DEBUG=INFO output what NCCL used")
    check.add_argument("files", nargs="+", metavar="FILE", help="log files ('-' for stdin)")
    check.add_argument("--json", action="store_true", help='print {"verdict", "reason", "nodes", "ranks", ...}')
    check.add_argument("--expect", choices=EXPECTATIONS, default="any",
                       help="exit 1 unless the log proves it (rdma, sockets; default: any, report only)")
    return parser


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Run one command; returns the exit status."""
    env = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    status = _run(args, env)
    if args.command == "launch" and args.exit_file:  # the recorded supervisor: how the job ended
        write_atomic(args.exit_file, f"{status}\n")
        if args.detached_supervisor:
            restart(args, env, status)
    return status


def _run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    try:
        return int(_COMMANDS[args.command](args, environ))
    except (BadInput, TopologyError) as err:
        print(f"mlenv.runtime {args.command}: error: {err}", file=sys.stderr)
        return 2
    except (JobError, OSError) as err:  # e.g. a run directory that cannot be written
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
        removed = [f"unset {name}\n" for name in result.unset] if args.shell else []
        print("".join([*removed, *(f"{prefix}{k}={shlex.quote(v)}\n" for k, v in result.env.items())]), end="")
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
    launcher = args.launcher or environ.get("MLENV_LAUNCHER", DEFAULT_LAUNCHER)
    if launcher not in LAUNCHERS:
        raise BadInput(f"MLENV_LAUNCHER={launcher!r} is not one of {', '.join(LAUNCHERS)}")
    if not Path(job[0]).is_file():
        raise BadInput(f"no such script: {job[0]} (relative to {Path.cwd()})")
    environ = absolute_checkpoint_dir(environ, Path.cwd())  # the same directory for a script that changes its own
    run_dir = args.run_dir or (Path(environ["MLENV_RUN_DIR"]) if environ.get("MLENV_RUN_DIR") else None)
    if args.standby is not None:
        return wait_as_standby(args, environ, launcher, job, run_dir)
    if args.detach or (run_dir is not None and args.exit_file is None and not args.dry_run):
        return start_node(args, environ, launcher, job, run_dir)
    return launch(job, launcher=launcher, environ=environ, nproc=args.nproc, run_dir=run_dir,
                  dry_run=args.dry_run, node_log=args.exit_file is None or not args.detached_supervisor,
                  expect_transport=args.expect_transport, observers=observers_for(args, environ),
                  node_silence=args.node_silence)


def _launchable(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    print(json.dumps({"kind": LAUNCHABLE, "python": sys.executable, "script": Path(args.script).is_file(),
                      "missing": missing_modules(args.launcher), "fix": torch_fix(environ)}))
    return 0


def _doctor(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    for root in (args.sysfs_root, args.proc_root):
        if not Path(root).is_dir():
            raise BadInput(f"{root} is not a directory")
    report = examine(environ, sysfs_root=args.sysfs_root, proc_root=args.proc_root,
                     rendezvous_seconds=args.rendezvous)
    if args.json:
        print(json.dumps({**report.to_json(), "clock": time.time()}), flush=True)  # the clock read as late as possible
    else:
        print(render(report), end="")
    return 1 if report.failed else 0


def _resume(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    return resume(environ, args.runs_root)


def _nccl_log_check(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    report = _read_logs(args.files)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        for rank in report.ranks:
            print(rank.summary())
            print("".join(f"  NCCL WARN {w}\n" for w in rank.warnings), end="")
        for node in report.nodes:
            print(node.line())
        print(f"verdict: {report.verdict}")
    passed, message = judge(report, args.expect)
    if not passed:
        print(f"error: {message}", file=sys.stderr)
        return 1
    if args.expect != "any":
        print(f"mlenv: {message}", file=sys.stderr)
    return 0


def _read_logs(names: Sequence[str]) -> LogReport:
    """Every line of the log files (stdin for ``-``), read in bounded chunks."""
    reader = NcclLogReader()
    for name in names:
        try:
            with open(sys.stdin.fileno(), "rb", closefd=False) if name == "-" else open(name, "rb") as stream:
                for number, line in enumerate(iter_lines(stream), 1):
                    reader.feed(line, f"{name}:{number}")
        except OSError as err:
            raise BadInput(f"cannot read {name}: {err.strerror}") from None
    return reader.report()


_COMMANDS = {
    "topology": _topology,
    "nccl-env": _nccl_env,
    "launch": _launch,
    "nccl-log-check": _nccl_log_check,
    "gpus": show_gpus,
    "stacks": show_stacks,
    "fault": inject,
    "doctor": _doctor,
    "launchable": _launchable,
    "jobs": show_jobs,
    "stop": stop,
    "logs": show_logs,
    "resume": _resume,
    "slurm-attempts": slurmsteps.run,
}
