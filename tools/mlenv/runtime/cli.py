"""Command line of the in-pod runtime: ``python3 -m mlenv.runtime <command>``.

Exit status: 0 ok, 1 the check or the job failed, 2 bad input (one line on stderr, no traceback);
``logs --follow`` ends with the job's own exit status.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn, cast

from . import restartpolicy, standby
from .control import secret_of
from .doctor import examine, render
from .forensics import flight_dumps
from .gpus import read_node, render_node
from .hang import HANG_EXIT_CODE
from .idle import DEFAULT_IDLE_UTIL, IDLE_EXIT_CODE
from .jobs import POLL_SECONDS, JobError, NodeJob, follow_log, host_jobs, start_recorded, stop_jobs
from .launcher import forwarding_signals, launch
from .launchers import DEFAULT_LAUNCHER, LAUNCHERS
from .nccl import detect_nccl_env
from .ncclog import EXPECTATIONS, LogReport, NcclLogReader, iter_lines, judge
from .nodefault import scheduler_lost
from .observing import observers_for
from .runlayout import (
    LOST_FILE,
    FirstFailure,
    NodeDir,
    absolute_checkpoint_dir,
    attempt_of,
    read_ranks,
    read_state,
    runs_root,
    write_atomic,
    write_json,
)
from .stacks import METHODS, group, sample
from .stacks import render as render_stacks
from .topology import TopologyError, detect_topology, host_name

LOG_WAIT_SECONDS = 60.0


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
    run.add_argument("--max-restarts", type=_count, default=0, metavar="N",
                     help="with --detach: when the job fails (not when it is stopped), start it again on this node, "
                          "up to N times, as attempt K+1 (MLENV_RESTART_COUNT) of the same run")
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
    stacks.add_argument("--native", action="store_true", help="add native frames (py-spy only)")
    stacks.add_argument("--method", choices=METHODS, default="auto",
                        help="py-spy (ptrace), faulthandler (the signal the runtime armed), or auto: py-spy, "
                             "else faulthandler (default)")
    stacks.add_argument("--json", action="store_true", help="print one JSON object")

    policy = commands.add_parser(
        "policy", help="the restart policy's verdict on an ended attempt of a run, as shell assignments (the Slurm "
                       "scripts eval it): node, code, verdict (end, stop, restart, leave-out), left_node, host, why, "
                       "saved, and the run's history for the next attempt")
    policy.add_argument("--run-dir", type=Path, required=True, metavar="DIR", help="the run's directory")
    policy.add_argument("--attempt", type=_count, required=True, metavar="K", help="the attempt that ended")
    policy.add_argument("--exit-code", type=_count, required=True, metavar="CODE", help="how it ended")
    policy.add_argument("--max-restarts", type=_count, default=0, metavar="N", help="the run's --max-restarts")
    policy.add_argument("--hosts", default="", metavar="H0,H1,...", help="the attempt's hosts, in node order")
    policy.add_argument("--failed-file", type=Path, metavar="FILE",
                        help="'<node> <code>' of the first node that failed, where node 0 recorded no first failure")
    policy.add_argument("--failed-first", default="", metavar="H,...",
                        help="the host that failed first, for each earlier attempt (the history this command printed)")
    policy.add_argument("--last-error", default="", metavar="KEY", help="the previous attempt's error (likewise)")
    policy.add_argument("--warned", action="store_true", help="the scheduler's warning came: never restart")
    policy.add_argument("--job-nodes", default="", metavar="NODELIST",
                        help="the job's nodes now (squeue %%N; empty: not running): a host of the attempt no longer "
                             "among them was lost to a node failure")
    policy.add_argument("--node-states", default="", metavar="LINES",
                        help="sinfo -h -N -o '%%N|%%T|%%E' of the attempt's hosts: a host down, failed or drained was "
                             "lost (its node-failure sign is written to the attempt's lost.json)")

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
            _restart(args, env, status)
    return status


def _restart(args: argparse.Namespace, environ: Mapping[str, str], status: int) -> None:
    """A detached attempt ended: start the next one on this node, in the background, where the restart policy
    (restartpolicy.py) allows (every node of the run sees the same first failure, which the control channel spreads,
    and decides alike). A node left out has a standby take its place (node 0 hands it over), else no node
    restarts."""
    attempt = attempt_of(environ)
    rank = detect_topology(environ).node_rank
    run_id = environ.get("MLENV_RUN_ID") or args.run_dir.name
    if not restartpolicy.may_restart(status, attempt, args.max_restarts):
        if rank == 0:
            standby.end_unused(environ, run_id)
        return
    first = FirstFailure.parse(read_state(NodeDir(args.run_dir, attempt, rank)).get("first_failure"))
    verdict = restartpolicy.judge(attempt, restartpolicy.History.of(environ, attempt), first)
    following = {**environ, "MLENV_RESTART_COUNT": str(attempt + 1), **verdict.history.environ()}
    if verdict.stop is not None:
        print(f"mlenv: {verdict.stop}", flush=True)
        if rank == 0:
            standby.end_unused(environ, run_id)
        return
    for left in verdict.left_out:
        taken = _leave_out(left, rank, following, run_id)
        if taken is None:
            return
        following[standby.USED] = str(taken)
    print(f"mlenv: attempt {attempt} failed with exit code {status}: restarting the run, attempt {attempt + 1} of "
          f"at most {args.max_restarts} restarts (MLENV_RESTART_COUNT={attempt + 1})", flush=True)
    args.detach = True
    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    _recorded(args, following, args.launcher, job, args.run_dir)


def _leave_out(left: restartpolicy.LeftOut, rank: int, following: Mapping[str, str], run_id: str) -> int | None:
    """Node ``left.node`` must be left out of the next attempt: the standby the policy names takes its place (node 0
    hands it over; the node itself does not restart) and how many standbys are used then, or None where this node
    does not restart: it is the one left out, or no standby can take the place (then no node restarts)."""
    spares = standby.addresses(following)
    slot, instead = restartpolicy.standby_for(left.node, spares, standby.used(following))
    left_out = f"mlenv: node-{left.node} must be left out of the run ({left.reason})"
    if slot is None:
        print(f"{left_out}: not restarting it ({instead})", flush=True)
        if rank == 0:
            standby.end_unused(following, run_id)
        return None
    message = {"run_id": run_id, "node": left.node, "attempt": int(following["MLENV_RESTART_COUNT"]),
               "used": slot + 1, **{key: following.get(name, "") for key, name in HANDED.items()}}
    error = standby.send(spares[slot], slot, following, message) if rank == 0 else None
    if error is not None:
        print(f"{left_out}: not restarting it: {error}", flush=True)
        return None
    if rank in (0, left.node):
        print(f"{left_out}: the standby on {spares[slot]} takes its place", flush=True)
    return None if rank == left.node else slot + 1


HANDED = {"failed_first": restartpolicy.FAILED_FIRST, "last_error": restartpolicy.LAST_ERROR}
"""What a standby is handed of the run's history (its message's key -> the variable it sets)."""


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
        return _standby(args, environ, launcher, job, run_dir)
    if args.detach or (run_dir is not None and args.exit_file is None and not args.dry_run):
        return _recorded(args, environ, launcher, job, run_dir)
    return launch(job, launcher=launcher, environ=environ, nproc=args.nproc, run_dir=run_dir,
                  dry_run=args.dry_run, node_log=args.exit_file is None or not args.detached_supervisor,
                  expect_transport=args.expect_transport, observers=observers_for(args, environ))


def _launch_argv(args: argparse.Namespace, launcher: str, run_dir: Path) -> list[str]:
    """``python -m mlenv.runtime launch`` with this launch's options (not its mode, nor the job)."""
    return [sys.executable, "-m", "mlenv.runtime", "launch", "--launcher", launcher,
            *(["--nproc", str(args.nproc)] if args.nproc else []), "--run-dir", str(run_dir),
            *(["--expect-transport", args.expect_transport] if args.expect_transport else []),
            *(["--hang-timeout", str(args.hang_timeout)] if args.hang_timeout else []),
            *(["--on-hang", args.on_hang] if args.on_hang else []),
            *(["--idle-seconds", str(args.idle_seconds)] if args.idle_seconds else []),
            *(["--idle-util", str(args.idle_util)] if args.idle_util is not None else []),
            *(["--on-idle", args.on_idle] if args.on_idle else []),
            *(["--max-restarts", str(args.max_restarts)] if args.max_restarts else [])]


STANDBY_FD = "MLENV_STANDBY_FD"
"""In the standby's background process: its listening socket, opened (and checked) by the command that started it."""


def _standby(
    args: argparse.Namespace, environ: Mapping[str, str], launcher: str, job: list[str], run_dir: Path | None
) -> int:
    """A spare host's standby of a detached run (runtime/standby.py): started in the background, listening, until
    node 0 hands it a node (it then runs that node's share, detached, from the next attempt on) or ends it."""
    if run_dir is None or not args.detach:
        raise BadInput("launch --standby needs --detach and a run directory (--run-dir DIR or MLENV_RUN_DIR)")
    run_dir = run_dir.absolute()
    run_id = environ.get("MLENV_RUN_ID") or run_dir.name
    marker = standby.pid_file(run_dir, args.standby)
    if STANDBY_FD not in environ:  # the command run on the spare host: listen, then wait in the background
        listener = standby.listen(environ, args.standby)
        marker.parent.mkdir(parents=True, exist_ok=True)
        argv = [*_launch_argv(args, launcher, run_dir), "--detach", "--standby", str(args.standby), "--", *job]
        env = {**environ, STANDBY_FD: str(listener.fileno()), standby.MARKER: str(marker)}
        with marker.with_suffix(".log").open("ab") as log:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       env=env, start_new_session=True, pass_fds=(listener.fileno(),))
        listener.close()
        write_atomic(marker, json.dumps({"run_id": run_id, "slot": args.standby, "pid": process.pid,
                                         "port": standby.port(environ, args.standby)}) + "\n")
        print(f"mlenv: standby {args.standby} of run {run_id} on {host_name(environ)}: waiting on port "
              f"{standby.port(environ, args.standby)} for a node to take over (pid {process.pid})")
        return 0
    with socket.socket(fileno=int(environ[STANDBY_FD])) as listener:
        message = standby.wait(listener, run_id, secret_of(environ) or "")
    if message is None:
        print(f"mlenv: run {run_id} needs this standby no more", flush=True)
        return 0
    node, attempt = int(message["node"]), int(message["attempt"])
    print(f"mlenv: taking node-{node}'s place in run {run_id} from attempt {attempt} on", flush=True)
    env = {name: value for name, value in environ.items() if name not in (STANDBY_FD, standby.MARKER)}
    env.update({"MLENV_NODE_RANK": str(node), "MLENV_RESTART_COUNT": str(attempt),
                standby.USED: str(message["used"]),
                **{name: str(message.get(key, "")) for key, name in HANDED.items()}})
    args.standby = None
    return _recorded(args, env, launcher, job, run_dir)


def _recorded(
    args: argparse.Namespace, environ: Mapping[str, str], launcher: str, job: list[str], run_dir: Path | None
) -> int:
    """Start this node's share through a supervisor (this same command, which writes the exit file) recorded in
    the run directory, so jobs, logs and stop know it: detached, or followed to its end."""
    if run_dir is None:
        raise BadInput("launch --detach needs a run directory: --run-dir DIR or MLENV_RUN_DIR")
    rank = detect_topology(environ).node_rank
    files = NodeDir(run_dir.absolute(), attempt_of(environ), rank)
    supervisor = [*_launch_argv(args, launcher, files.run_dir), "--exit-file", str(files.exit),
                  *(["--detached-supervisor"] if args.detach else []), "--", *job]
    process, record = start_recorded(supervisor, files, run_id=environ.get("MLENV_RUN_ID") or files.run_dir.name,
                                     host=host_name(environ), environ=environ, detached=args.detach)
    if args.detach:
        print(f"mlenv: node {rank} started in the background: pid {record.pid}, log {files.log}")
        return 0
    with forwarding_signals(process):
        status = process.wait()
    return 128 - status if status < 0 else status


def _jobs(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    root, host = args.runs_root or runs_root(environ), host_name(environ)
    found = host_jobs(root, host)
    if args.json:
        print(json.dumps([job.to_dict() for job in found], indent=2))
    elif not found:
        print(f"no jobs of {host} under {root}")
    else:
        rows = [("RUN", "NODE", "STATE", "PID", "STARTED", "LOG")]
        rows += [(j.record.run_id, str(j.record.node_rank), _state(j), str(j.record.pid), j.record.started_at,
                  str(j.files.log)) for j in found]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        print("".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + f"  {row[-1]}\n"
                      for row in rows), end="")
    return 0


def _state(job: NodeJob) -> str:
    return f"{job.state} ({job.exit_code})" if job.exit_code is not None else job.state


def _stop(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    root = args.runs_root or runs_root(environ)
    found = host_jobs(root, host_name(environ), args.run)
    stopped = stop_jobs(found, args.grace)
    standbys = standby.stop(root, args.run)
    if standbys:
        print(f"stopped {standbys} standby{'' if standbys == 1 else 's'} of detached runs")
    if not stopped and not standbys:
        print(_nothing_to_stop(found))
    for result in stopped:
        if result.left:
            print(f"{result.job.describe()}: {result.left} processes still alive after SIGKILL")
        elif result.signal.name == "SIGKILL":
            print(f"stopped {result.job.describe()}: killed with SIGKILL after {args.grace:g} s")
        else:
            print(f"stopped {result.job.describe()}: ended after SIGTERM")
    return 1 if any(result.left for result in stopped) else 0


def _nothing_to_stop(jobs: Sequence[NodeJob]) -> str:
    """``nothing to stop``, naming the newest run here when it has finished (its supervisors ended what it left)."""
    newest = [job for job in jobs if jobs and job.record.run_id == jobs[-1].record.run_id]
    states = sorted({job.state for job in newest if job.exit_code is not None})
    return f"run {newest[0].record.run_id} already finished ({', '.join(states)}): nothing to stop" if states \
        else "nothing to stop"


def _logs(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    root, host = args.runs_root or runs_root(environ), host_name(environ)
    deadline = time.monotonic() + (args.wait if args.follow else 0)
    while (job := _node_job(host_jobs(root, host, args.run), environ)) is None:
        if time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        elif args.run:
            raise BadInput(f"no job of {host} in run {args.run} under {root}")
        else:
            raise JobError(f"no job of {host} under {root}")
    out: IO[bytes] = sys.stdout.buffer
    if args.rank is not None:
        known = sorted(rank.rank for rank in read_ranks(job.files))
        if args.rank not in known:
            raise BadInput(f"rank {args.rank} is not on node {job.record.node_rank} of run {job.record.run_id} "
                           f"(its ranks: {', '.join(map(str, known)) or 'none yet'})")
        out = cast(IO[bytes], RankLines(out, job.record.node_rank, args.rank))
    _earlier_attempts(job.files, out)
    if not args.follow:
        with job.files.log.open("rb") as log:
            shutil.copyfileobj(log, out)
        out.flush()
        return 0
    try:
        code = follow_log(job, out)
    except KeyboardInterrupt:
        return 130  # stopped following; the job goes on
    if code is None:
        print(f"mlenv: {job.describe()} is gone without an exit status", file=sys.stderr)
        return 1
    return code


def _earlier_attempts(newest: NodeDir, out: IO[bytes]) -> None:
    """After a restart (attempt > 0): this node's log of every earlier attempt, each under a header naming it, then
    the newest attempt's header (its lines follow)."""
    for attempt in range(newest.attempt + 1) if newest.attempt else ():
        files = NodeDir(newest.run_dir, attempt, newest.node)
        if not files.log.is_file():
            continue
        sys.stdout.buffer.write(f"mlenv: ==== attempt {attempt} (MLENV_RESTART_COUNT={attempt}) of run "
                                f"{newest.run_dir.name}, node {newest.node} ====\n".encode())
        sys.stdout.buffer.flush()
        if attempt < newest.attempt:
            with files.log.open("rb") as log:
                shutil.copyfileobj(log, out)
            out.flush()


class RankLines(io.RawIOBase):
    """A writer that passes on only the whole lines of one rank (``[node-R rN] ...``)."""

    def __init__(self, out: IO[bytes], node: int, rank: int) -> None:
        self.out, self.prefix, self.pending = out, f"[node-{node} r{rank}] ".encode(), b""

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        *lines, self.pending = (self.pending + bytes(data)).split(b"\n")
        self.out.write(b"".join(line + b"\n" for line in lines if line.startswith(self.prefix)))
        return len(data)

    def flush(self) -> None:
        self.out.flush()


def _node_job(jobs: list[NodeJob], environ: Mapping[str, str]) -> NodeJob | None:
    """This node's job in the newest run of ``jobs``: the one of this node's rank when the host has several
    (nodes sharing a machine), else the first."""
    if not jobs:
        return None
    newest = [job for job in jobs if job.files.run_dir == jobs[-1].files.run_dir]
    try:
        rank = detect_topology(environ).node_rank
    except TopologyError:
        return newest[0]
    return next((job for job in newest if job.record.node_rank == rank), newest[0])


def _doctor(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    for root in (args.sysfs_root, args.proc_root):
        if not Path(root).is_dir():
            raise BadInput(f"{root} is not a directory")
    report = examine(environ, sysfs_root=args.sysfs_root, proc_root=args.proc_root,
                     rendezvous_seconds=args.rendezvous)
    if args.json:
        print(json.dumps({**report, "clock": time.time()}), flush=True)  # the clock read as late as possible
    else:
        print(render(report), end="")
    return 1 if any(check["status"] == "FAIL" for check in report["checks"]) else 0


def _gpus(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    host = host_name(environ)
    job = _node_job(host_jobs(args.runs_root or runs_root(environ), host), environ)
    found = read_node(host, run=job.files if job else None, kmsg=args.kmsg, proc_root=args.proc_root)
    print(json.dumps(found.to_dict()) if args.json else render_node(found), flush=True)
    return 0


def _stacks(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    host = host_name(environ)
    job = _node_job(host_jobs(args.runs_root or runs_root(environ), host), environ)
    if job is None:
        found: dict[str, object] = {"run": None, "host": host}
    else:
        ranks = [r.to_dict() for r in read_ranks(job.files) if r.state == "running"]
        taken = sample(ranks, native=args.native, method=args.method, dumps=job.files.stacks / "faulthandler",
                       workspace=Path.cwd())
        found = {"run": job.record.run_id, "started_at": job.record.started_at, "node": job.record.node_rank,
                 "host": host, "state": job.state,
                 "ranks": [stack.to_dict() for stack in taken],
                 "flight_dumps": [str(path) for path in flight_dumps(job.files.path)]}
    if args.json:
        print(json.dumps(found), flush=True)
    elif job is None:
        print(f"no run of {host}")
    else:
        print(render_stacks(group(found["ranks"])))  # type: ignore[arg-type]
    return 0


def _policy(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """The restart policy's verdict for a run's script (restartpolicy.py ``for_script``), as shell assignments."""
    history = restartpolicy.History(tuple(args.failed_first.split(",")[:args.attempt]) if args.attempt else (),
                                    args.last_error)
    hosts = [host for host in args.hosts.split(",") if host]
    lost = scheduler_lost(hosts, args.job_nodes, args.node_states)
    if lost:
        write_json(args.run_dir / f"attempt-{args.attempt}" / LOST_FILE,
                   {str(node): fault.to_dict() for node, fault in sorted(lost.items())})
    answer = restartpolicy.for_script(args.run_dir, args.attempt, args.exit_code, args.max_restarts, hosts,
                                      args.failed_file, history, args.warned, lost)
    print(" ".join(f"{name}={shlex.quote(str(value))}" for name, value in answer.items()))
    return 0


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
    "policy": _policy,
    "gpus": _gpus,
    "stacks": _stacks,
    "doctor": _doctor,
    "jobs": _jobs,
    "stop": _stop,
    "logs": _logs,
}
