"""Detached runs on this node (``python3 -m mlenv.runtime launch --detach``): starting the node's share through a
recorded supervisor, the next attempt where the restart policy (records/restartpolicy.py) allows it, a spare
host's standby (standby.py) that takes a left-out node's place, and the share of a pod that comes back after a
preemption (``resume``)."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..node.topology import detect_topology, host_name
from ..records import restartpolicy
from ..records.attempts import run_attempts
from ..records.restartpolicy import AttemptEnd
from ..records.runlayout import (
    MOVES_PODS,
    PREEMPTED_MARK,
    RESUME_RUN,
    RUN_SECRETS,
    FirstFailure,
    NodeDir,
    attempt_of,
    attempts,
    read_json,
    read_state,
    resume_file,
    runs_root,
    write_atomic,
)
from ..records.states import LeftOut, RunState
from . import kubemove, standby
from .jobs import BadInput, start_recorded
from .launcher import forwarding_signals
from .proofs import secret_of


def restart(args: argparse.Namespace, environ: Mapping[str, str], status: int) -> None:
    """A detached attempt ended: start the next one on this node, in the background, where the restart policy
    (restartpolicy.py) allows (every node of the run sees the same first failure, which the control channel spreads,
    and decides alike). A node left out has a standby take its place (node 0 hands it over), else no node
    restarts. The nodes this node lost to silence (``lost_nodes``: frozen, cut off; node 0 too, on the others) are
    left out as the policy says: node 0, which holds the rendezvous, never restarts elsewhere, so a run that lost it
    is not restarted."""
    attempt = attempt_of(environ)
    rank = detect_topology(environ).node_rank
    run_id = environ.get("MLENV_RUN_ID") or args.run_dir.name
    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    recorded = read_state(NodeDir(args.run_dir, attempt, rank))
    if restartpolicy.resumes(recorded.get("state"), preemptions(args.run_dir, rank), args.max_preemptions, environ):
        print(f"mlenv: attempt {attempt} was preempted (a pod of the run taken away): resuming the run as attempt "
              f"{attempt + 1} (MLENV_RESTART_COUNT={attempt + 1}) once every node is back", flush=True)
        args.detach = True
        start_node(args, {**environ, "MLENV_RESTART_COUNT": str(attempt + 1)}, args.launcher, job, args.run_dir)
        return
    lost = restartpolicy.silenced([recorded])  # frozen, cut off
    end = AttemptEnd(status, attempt, FirstFailure.parse(recorded.get("first_failure")), lost=lost)

    def go_on(end: AttemptEnd, verdict: restartpolicy.Verdict | None) -> None:
        """This node's part of the verdict on the attempt that ended: the next attempt, started in the
        background (whose end continues the loop), where the policy allows it and a standby takes a left-out
        node's place; the loop ends here."""
        if verdict is None or verdict.stop is not None:
            if verdict is not None:
                print(f"mlenv: {verdict.stop}", flush=True)
            if rank == 0:
                standby.end_unused(environ, run_id)
            return
        refused = restartpolicy.without_rendezvous(end.lost)
        if refused is not None:
            print(f"mlenv: {refused}", flush=True)
            return
        following = {**environ, "MLENV_RESTART_COUNT": str(attempt + 1), **verdict.history.environ()}
        if verdict.left_out and kubemove.enabled(environ) and not standby.addresses(environ):
            _move(verdict.left_out, rank, environ, run_id, attempt, verdict.history.environ())
            return
        for left in verdict.left_out:
            taken = _leave_out(left, rank, following, run_id)
            if taken is None:
                return
            following[standby.USED] = str(taken)
        print(f"mlenv: attempt {attempt} failed with exit code {status}: restarting the run, attempt {attempt + 1} "
              f"of at most {args.max_restarts} restarts (MLENV_RESTART_COUNT={attempt + 1})", flush=True)
        args.detach = True
        start_node(args, following, args.launcher, job, args.run_dir)

    run_attempts(lambda _: end, go_on, attempt, args.max_restarts, restartpolicy.History.of(environ, attempt))


def _move(left_out: tuple[LeftOut, ...], rank: int, environ: Mapping[str, str], run_id: str,
          attempt: int, handed: Mapping[str, str]) -> None:
    """Nodes ``left_out`` must be left out of a run whose pods may move (kubemove.py): node 0 has the pod's mover
    keep the StatefulSet's pods off their Kubernetes nodes, which makes every pod again; each new pod resumes the
    run as attempt ``attempt`` + 1 (:func:`resume`). No node restarts where it is."""
    names = ", ".join(f"node-{out.node} ({out.reason})" for out in left_out)
    if rank != 0:
        print(f"mlenv: {names} must be left out of the run: node 0 moves the pods; this node's share resumes as "
              f"attempt {attempt + 1} in its new pod", flush=True)
        return
    try:
        away = kubemove.move(environ, left_out, run_id, attempt, handed)
    except kubemove.MoveError as exc:
        print(f"mlenv: {names} must be left out of the run: not restarting it: the pods were not moved: {exc}",
              flush=True)
        return
    print(f"mlenv: {names} must be left out of the run: the pods of {environ[MOVES_PODS]} are kept off "
          f"{', '.join(away)} and made again; the run resumes as attempt {attempt + 1} once every pod is back",
          flush=True)


def preemptions(run_dir: Path, rank: int) -> int:
    """How many attempts of the run ended preempted on this node."""
    return sum(read_state(NodeDir(run_dir, attempt, rank)).get("state") == RunState.PREEMPTED
               for attempt in attempts(run_dir))


RUN_VARIABLES = ("MLENV_RUN_ID", "MLENV_CHECKPOINT_DIR", "MLENV_RUN_DIR", "PYTHONPATH", "PYTHONUNBUFFERED",
                 restartpolicy.FAILED_FIRST, restartpolicy.LAST_ERROR)
"""The variables of a run's start that a node resuming it needs again (never a secret: those come back with the
pod's environment, from the run's Secret on Kubernetes)."""


def keep_for_resume(args: argparse.Namespace, environ: Mapping[str, str], launcher: str, job: list[str],
                    files: NodeDir) -> None:
    """Record how this node started its share of the detached run (resume_file), for its pod's return."""
    saved = {"argv": [*_launch_argv(args, launcher, files.run_dir), "--detach", "--", *job], "cwd": str(Path.cwd()),
             "env": {name: environ[name] for name in RUN_VARIABLES if name in environ},
             "max_preemptions": args.max_preemptions}
    resume_file(files.run_dir, files.node).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(resume_file(files.run_dir, files.node), json.dumps(saved, indent=2) + "\n")


def _secrets(directory: str | None) -> dict[str, str]:
    """The run Secret's variables: a file each (not Kubernetes' ``..data`` links); none where there is none."""
    try:
        return {entry.name: entry.read_text() for entry in Path(directory).iterdir()
                if not entry.name.startswith(".") and entry.is_file()} if directory else {}
    except OSError:
        return {}


def resume(environ: Mapping[str, str], runs: Path | None) -> int:
    """A pod back after a preemption (its PID 1 runs this): start this node's share of the run that
    ``MLENV_RESUME_RUN`` names (a file of the run's Secret, ``MLENV_RUN_SECRETS``, with the variables the share
    needs again) as its next attempt, where the restart policy says it resumes; else say why not."""
    environ = {**environ, **_secrets(environ.get(RUN_SECRETS))}
    run_id = environ.get(RESUME_RUN, "")
    rank = detect_topology(environ).node_rank
    run_dir = (runs or runs_root(environ)).absolute() / run_id
    saved = read_json(resume_file(run_dir, rank)) if run_id else None
    mine = [attempt for attempt in attempts(run_dir) if NodeDir(run_dir, attempt, rank).path.is_dir()]
    if not isinstance(saved, dict) or not isinstance(saved.get("argv"), list) or not mine:
        print(f"mlenv: nothing to resume on node {rank}" + (f" (run {run_id} never ran here)" if run_id else ""))
        return 0
    handed = kubemove.moved(environ, run_id, mine[-1])
    if handed is not None:
        print(f"mlenv: node {rank} is back in a new pod after the run moved off a faulty node: resuming run "
              f"{run_id} as attempt {mine[-1] + 1}", flush=True)
        return _resumed(saved, environ, mine[-1] + 1, handed)
    ended = read_state(NodeDir(run_dir, mine[-1], rank)).get("state")
    limit = saved.get("max_preemptions")
    if not restartpolicy.resumes(ended, preemptions(run_dir, rank), limit if isinstance(limit, int) else None,
                                 environ):
        print(f"mlenv: run {run_id} is not resumed on node {rank}: its attempt {mine[-1]} here is {ended or 'unknown'}"
              + (f" (at most {limit} preemptions)" if ended == RunState.PREEMPTED else ""))
        return 0
    print(f"mlenv: node {rank} is back after a preemption: resuming run {run_id} as attempt {mine[-1] + 1}",
          flush=True)
    return _resumed(saved, environ, mine[-1] + 1, {})


def _resumed(saved: Mapping[str, Any], environ: Mapping[str, str], attempt: int,
             handed: Mapping[str, str]) -> int:
    """Start this node's share again as it was started (``saved``: keep_for_resume), as attempt ``attempt``, with
    the variables ``handed`` to it."""
    env = {**environ, **{str(k): str(v) for k, v in dict(saved.get("env") or {}).items()}, **handed,
           "MLENV_RESTART_COUNT": str(attempt)}
    return subprocess.run([str(arg) for arg in saved["argv"]], env=env, cwd=str(saved.get("cwd") or "."),
                          check=False).returncode


def _leave_out(left: LeftOut, rank: int, following: Mapping[str, str], run_id: str) -> int | None:
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
    handover = standby.Handover(run_id, left.node, int(following["MLENV_RESTART_COUNT"]), slot + 1,
                                {key: following.get(name, "") for key, name in HANDED.items()})
    error = standby.send(spares[slot], slot, following, handover.to_json()) if rank == 0 else None
    if error is not None:
        print(f"{left_out}: not restarting it: {error}", flush=True)
        return None
    if rank in (0, left.node):
        print(f"{left_out}: the standby on {spares[slot]} takes its place", flush=True)
    return None if rank == left.node else slot + 1


HANDED = {"failed_first": restartpolicy.FAILED_FIRST, "last_error": restartpolicy.LAST_ERROR}
"""What a standby is handed of the run's history (its message's key -> the variable it sets)."""


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
            *(["--on-straggler", args.on_straggler] if args.on_straggler else []),
            *(["--node-silence", str(args.node_silence)] if args.node_silence else []),
            *(["--max-restarts", str(args.max_restarts)] if args.max_restarts else []),
            *(["--max-preemptions", str(args.max_preemptions)] if args.max_preemptions is not None else [])]


STANDBY_FD = "MLENV_STANDBY_FD"
"""In the standby's background process: its listening socket, opened (and checked) by the command that started it."""


def wait_as_standby(
    args: argparse.Namespace, environ: Mapping[str, str], launcher: str, job: list[str], run_dir: Path | None
) -> int:
    """A spare host's standby of a detached run (runtime/supervise/standby.py): started in the background, listening,
    until node 0 hands it a node (it then runs that node's share, detached, from the next attempt on) or ends it."""
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
    node, attempt = message.node, message.attempt
    print(f"mlenv: taking node-{node}'s place in run {run_id} from attempt {attempt} on", flush=True)
    env = {name: value for name, value in environ.items() if name not in (STANDBY_FD, standby.MARKER)}
    env.update({"MLENV_NODE_RANK": str(node), "MLENV_RESTART_COUNT": str(attempt),
                standby.USED: str(message.used), **{name: message.handed.get(key, "") for key, name in HANDED.items()}})
    args.standby = None
    return start_node(args, env, launcher, job, run_dir)


def start_node(
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
    if args.detach and environ.get(PREEMPTED_MARK):  # a pod: it may come back after a preemption
        keep_for_resume(args, environ, launcher, job, files)
    if args.detach:
        print(f"mlenv: node {rank} started in the background: pid {record.pid}, log {files.log}")
        return 0
    with forwarding_signals(process):
        status = process.wait()
    return 128 - status if status < 0 else status
