"""``mlenv drill``: how fast a deployment recovers. Ships the runtime with its small training job
(runtime/drilljob.py: in every node's workspace under ``.mlenv/``, none of the user's files), launches it
under its own run id and checkpoint directory with ``--max-restarts 1``, puts one fault into it at a step, and
measures each phase from the runtime's own records: the fault, detected and named (the first failure, the lost node,
the hung run), every rank stopped, the next attempt started, training resumed at the checkpointed step; the steps
recomputed and the exit code. Each phase is judged against its target (``drill.targets`` of the cluster file); a
table, ``--json`` (docs/json.md) and a timeline picture go to runs/<run id>/ (drill.json, timeline.png)."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from mlenv.config.discover import project_root
from mlenv.core.capabilities import LaunchSpec, Preemption
from mlenv.core.remote import RUNTIME_DIR
from mlenv.errors import OperationError, UsageError
from mlenv.ops.doctor import ship_runtime
from mlenv.ops.launch import LaunchResult, launch, run_id
from mlenv.ops.live import refuse_beside_live
from mlenv.ops.plot import write_timeline
from mlenv.ops.target import Target, file_cluster
from mlenv.runtime.records.goodput import Goodput
from mlenv.runtime.records.goodput import describe as goodput_line
from mlenv.runtime.records.jsonvalue import JsonObject
from mlenv.runtime.records.runlayout import RankRecord
from mlenv.runtime.records.runrecord import RunRecord
from mlenv.runtime.records.states import RunState
from mlenv.runtime.supervise.usersignals import handling_user_signals
from mlenv.ui import judged, print_json, say, table, warn

FAULTS = ("rank-exit", "rank-kill", "node-loss", "node-freeze", "hang", "preempt")
ALL = "all"
JOB = f"{RUNTIME_DIR}/mlenv/runtime/drilljob.py"
"""The job in every node's workspace, where shipping puts the runtime: never among the user's files."""
SIGNALLED = {"rank-kill": ("rank", "KILL"), "node-loss": ("node", "KILL"), "node-freeze": ("node", "STOP"),
             "hang": ("rank", "STOP")}
"""The faults the drill puts in from outside: what it signals on the faulty node (the runtime's ``fault``) and how."""
FROM_OUTSIDE = (*SIGNALLED, "preempt")
"""...and those with the preemption: the backend's scheduler takes the node away (Preempts.take_away)."""
NODE_FAULTS = ("node-loss", "node-freeze")
STEPS, STEP_SECONDS, AT_STEP = 60, 0.25, 10
HANG_TIMEOUT = 10.0
"""The launch's --hang-timeout in a hang drill (seconds without output)."""
POLL_SECONDS = 0.5
STEP_LINE = re.compile(r"\bstep (\d+)/\d+ t=([\d.]+)")
RESUMED_LINE = re.compile(r"drill: attempt (\d+) resumed at step (\d+) t=([\d.]+)")
EXITED_LINE = re.compile(r"drill: rank (\d+) exits with 1 at step \d+ t=([\d.]+)")
CHECKPOINTED_LINE = re.compile(r"drill: node (\d+) checkpointed step (\d+) after (\w+) t=([\d.]+)")
PHASES = ("detected", "stopped", "started", "resumed")
TAKEN = (RunState.PREEMPTED, RunState.REQUEUED)
"""A run's (or node's) state once preempted: Kubernetes' pods say preempted, Slurm's batch job requeued."""
PREEMPT_PHASES = ("detected", "checkpointed", "stopped", "started", "resumed")
"""A preemption's: the preempted node's checkpoint on the signal comes after its detection."""


@dataclass(frozen=True)
class Targets:
    """The most seconds from the fault each phase may take (``drill.targets`` of the cluster file)."""

    dead_rank: float = 5.0
    lost_node: float = 20.0
    hang_extra: float = 30.0
    resumed: float = 120.0
    grace: float | None = None
    """The seconds a preemption gives the ranks after its signal (``Preemption.grace``, as the backend took the
    node away): its checkpoint must be committed within half."""

    def of(self, fault: str, phase: str) -> float | None:
        """``phase``'s target for ``fault`` (None: none, only that it happens)."""
        if phase == "resumed":
            return self.resumed
        if phase == "checkpointed":
            return self.grace / 2 if self.grace is not None else None
        if phase != "detected":
            return None
        return self.lost_node if fault in NODE_FAULTS else HANG_TIMEOUT + self.hang_extra if fault == "hang" \
            else self.dead_rank


def targets_of(target: Target) -> Targets:
    """The deployment's cluster file's ``drill.targets`` over the defaults."""
    cluster = file_cluster(target, "drill.targets")
    given = cluster.drill_targets if cluster is not None else {}
    return Targets(**{name: float(value) for name, value in given.items()})


def check(target: Target, fault: str, node: int | None = None) -> list[str]:
    """The faults to drill (``all``: each this backend can), or UsageError (exit 2, nothing started): a live run,
    a node fault on one node, a preemption where the backend cannot preempt the run as its scheduler does, a
    ``node`` the deployment does not have or for a fault that goes in at no node (``rank-exit``)."""
    if fault not in (*FAULTS, ALL):
        raise UsageError(f"--fault {fault}: not a fault the drill knows (one of {', '.join((*FAULTS, ALL))})")
    if node is not None and node >= target.handle.nodes:
        raise UsageError(f"--node {node}: {target.handle.name} has {target.handle.nodes} nodes "
                         f"(0 to {target.handle.nodes - 1})")
    if node is not None and fault == "rank-exit":
        raise UsageError("--node: rank-exit's fault is the job's own (its highest global rank exits), at no node")
    refuse_beside_live(target, "the drill runs only where nothing else does")
    nodes = target.handle.nodes
    cannot = {}
    refused: UsageError | None
    try:
        refused = target.backend.preempts.preemption_refused(target.handle)
    except UsageError as exc:  # a recorded deployment of another shape
        refused = exc
    if refused is not None:
        cannot["preempt"] = str(refused)
    cannot.update({node_fault: f"--fault {node_fault} needs 2 nodes or more (one of them is lost), and "
                               f"{target.handle.name} has {nodes}" for node_fault in NODE_FAULTS if nodes < 2})
    if fault in cannot:
        raise UsageError(cannot[fault])
    for skipped in (cannot if fault == ALL else {}).values():
        warn(f"--fault all: skipped: {skipped}")
    return [each for each in FAULTS if each not in cannot] if fault == ALL else [fault]


@dataclass
class Watch:
    """What the drill saw while the launch ran (a thread beside it): when the job reached the step, the fault
    went in, the failure was recorded and every rank of attempt 0 had ended; the last record of attempt 0."""

    target: Target
    spec: LaunchSpec
    fault: str
    at_step: int
    node: int
    done: threading.Event = field(default_factory=threading.Event)
    fault_at: float | None = None
    detected_at: float | None = None
    detected_as: str | None = None
    """The run's state when the drill first saw the fault in its records."""
    stopped_at: float | None = None
    first: RunRecord | None = None
    preemption: Preemption | None = None
    problem: str | None = None
    ended: bool = False
    interrupted: bool = False

    def run(self) -> None:
        try:
            if self.fault in FROM_OUTSIDE and not self._reached():  # rank-exit: the job's own, at the step
                return
            if self.fault in SIGNALLED:
                self.fault_at = self._signal(*SIGNALLED[self.fault])
            elif self.fault == "preempt":
                self.preemption = self._take_away()
                self.fault_at = self.preemption.at
            self._follow()
        except Exception as exc:  # said in the report, never as a thread's traceback
            self.problem = f"{type(exc).__name__}: {exc}"
        finally:
            self._end_fault()

    def _reached(self) -> bool:
        """Whether the job reached the step (its lines in the launch's local logs) before the launch ended or the
        drill was interrupted."""
        while not self.done.wait(POLL_SECONDS / 2) and not self.interrupted:
            logs = sorted(_local_runs(self.spec.run_id).glob("node-*.log"))
            if max((step for step, _ in _steps(logs)), default=0) >= self.at_step:
                return True
        return False

    def _signal(self, what: str, name: str) -> float:
        access = self.target.backend.access
        node = next(n for n in access.nodes(self.target.handle) if n.ordinal == self.node)
        argv = access.exec_argv(self.target.handle, node, access.runtime(
            self.target.handle, "fault", "--run", self.spec.run_id, "--attempt", "0", "--node", str(self.node),
            "--target", what, "--signal", name))
        # a session of its own: a Ctrl-C meant for the drill never cuts a fault (or its thaw) short
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, start_new_session=True)
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"the fault did not go in on node {self.node}: {done.stderr.strip()[-300:]}")
        return float(json.loads(lines[-1])["at"])

    def _take_away(self) -> Preemption:
        """Preempt the run at the node as the backend's scheduler does."""
        node = next(n for n in self.target.backend.access.nodes(self.target.handle) if n.ordinal == self.node)
        return self.target.backend.preempts.take_away(self.target.handle, node, self.spec.run_id)

    def _follow(self) -> None:
        """Read the run's records until its next attempt shows (or the launch ended, or the drill was interrupted)."""
        jobs = self.target.backend.jobs
        while not self.done.is_set() and not self.interrupted:
            run = jobs.latest_run(self.target.handle, self.spec.run_id)
            now = time.time()
            if run.attempt > 0:
                self.stopped_at = self.stopped_at or now
                return
            self.first = run
            if self.detected_at is None and (run.first_failure or run.node_faults
                                             or run.state in (RunState.HUNG, *TAKEN) or _dead(run) is not None):
                self.detected_at, self.detected_as = now, run.state
            if self.detected_at is not None and self.stopped_at is None and not any(
                    rank.state == RunState.RUNNING for rank in run.ranks if rank.node not in run.node_faults):
                self.stopped_at = now
                self._end_fault()
            self.done.wait(POLL_SECONDS)

    def _end_fault(self) -> None:
        """SIGKILL what the fault froze (a frozen node's share, a stopped rank), once: nothing of it outlives
        attempt 0, and the node takes part in the next attempt. After an interrupt SIGCONT instead (``interrupt``:
        a fault that went in meanwhile is thawed too)."""
        if not self.ended and (self.fault in NODE_FAULTS or self.fault == "hang"):
            self.ended = True
            with contextlib.suppress(Exception):
                self._signal("node" if self.fault in NODE_FAULTS else "rank", "CONT" if self.interrupted else "KILL")

    def interrupt(self) -> None:
        """The drill is interrupted (Ctrl-C, SIGTERM) and its launch is about to stop the nodes: first thaw what the
        fault froze, so that the frozen node's supervisor stops its share as the others do (the run is recorded
        stopped, no node blamed); no fault goes in after this, nothing is killed."""
        self.interrupted = True
        what, how = SIGNALLED.get(self.fault, ("", ""))
        if how == "STOP":
            with contextlib.suppress(Exception):
                self._signal(what, "CONT")


def _local_runs(run: str) -> Path:
    return project_root() / "runs" / run


def _steps(logs: Sequence[Path]) -> Iterator[tuple[int, float]]:
    """(step, time) of every step line in ``logs``."""
    for path in logs:
        with contextlib.suppress(OSError):
            for match in STEP_LINE.finditer(path.read_text(errors="replace")):
                yield int(match[1]), float(match[2])


def _epoch(text: str | None) -> float | None:
    return datetime.fromisoformat(text).timestamp() if text else None


def _job_args(fault: str, at_step: int) -> tuple[str, ...]:
    args = ("--steps", str(STEPS), "--step-seconds", str(STEP_SECONDS))
    return (*args, "--exit-at", str(at_step)) if fault == "rank-exit" else \
        (*args, "--checkpoint-on-signal") if fault == "preempt" else args


@dataclass(frozen=True)
class Phase:
    """One phase of a drill: its time in seconds from the fault (None: never seen), the most it may take (None: no
    limit), its verdict and what showed it."""

    phase: str
    seconds: float | None
    target: float | None
    verdict: str
    evidence: str

    def to_json(self) -> JsonObject:
        return {"phase": self.phase, "seconds": self.seconds, "target": self.target, "verdict": self.verdict,
                "evidence": self.evidence}


@dataclass(frozen=True)
class RankSpans:
    """A rank's attempts, each as (start, end, attempt), in seconds from the fault."""

    rank: int
    attempts: list[tuple[float, float, int]]

    def to_json(self) -> JsonObject:
        return {"rank": self.rank, "attempts": [[start, end, attempt] for start, end, attempt in self.attempts]}


@dataclass(frozen=True)
class DrillReport:
    """One drill: the fault put in (where and when), each phase judged, the steps recomputed, the exit code, the
    drill's own problem (None: none), its verdict, where its timeline picture is, each rank's attempts and the
    run's goodput."""

    fault: str
    run_id: str
    run_dir: Path
    at_step: int
    node: int | None
    fault_at: str | None
    """ISO 8601, to the millisecond (None: never seen)."""
    phases: list[Phase]
    resumed_step: int | None
    last_step: int | None
    lost_steps: int | None
    exit_code: int
    problem: str | None
    verdict: str
    ranks: list[RankSpans]
    goodput: Goodput | None

    @property
    def timeline(self) -> Path:
        """The timeline picture of the drill."""
        return self.run_dir / "timeline.png"

    def to_json(self) -> JsonObject:
        """``drill --json``'s entry of ``drills`` and runs/<run id>/drill.json (docs/json.md)."""
        return {"fault": self.fault, "run_id": self.run_id, "run_dir": str(self.run_dir), "at_step": self.at_step,
                "node": self.node, "fault_at": self.fault_at, "phases": [phase.to_json() for phase in self.phases],
                "resumed_step": self.resumed_step, "last_step": self.last_step, "lost_steps": self.lost_steps,
                "exit_code": self.exit_code, "problem": self.problem, "verdict": self.verdict,
                "timeline": str(self.timeline), "ranks": [spans.to_json() for spans in self.ranks],
                "goodput": self.goodput.to_json() if self.goodput is not None else None}


def drill_one(target: Target, fault: str, at_step: int, targets: Targets, node: int | None = None) -> DrillReport:
    """Launch the job, put ``fault`` in at ``at_step`` on ``node`` (None: the last), and report each phase
    (``--json``'s ``drills`` entry)."""
    name = target.handle.name
    spec = LaunchSpec("torchrun", JOB, _job_args(fault, at_step), run_id=run_id(f"{name}-drill"), max_restarts=1,
                      hang_timeout=HANG_TIMEOUT if fault == "hang" else None,
                      on_hang="stop" if fault == "hang" else None)
    watch = Watch(target, spec, fault, at_step, target.handle.nodes - 1 if node is None else node)
    thread = threading.Thread(target=watch.run, name="drill", daemon=True)

    def interrupted(_signum: int, _frame: object) -> None:
        watch.interrupt()
        raise KeyboardInterrupt

    thread.start()
    try:
        with handling_user_signals(interrupted):  # the launch's own SIGTERM handling leaves this one in place
            result = launch(target, spec, keep=(watch.node,) if fault in NODE_FAULTS else ())
    finally:
        watch.done.set()
        thread.join(timeout=90)
    if result.outcome.interrupted:  # every node stopped: no report, no further drill
        raise KeyboardInterrupt
    return report(fault, at_step, targets, watch, result, target.backend.jobs.latest_run(target.handle, spec.run_id))


def report(fault: str, at_step: int, targets: Targets, watch: Watch, result: LaunchResult,
           final: RunRecord) -> DrillReport:
    """The drill's phases, each in seconds from the fault with its target and verdict, from what ``watch`` saw,
    the launch's ``result`` and the run's newest attempt (``final``)."""
    run_dir = _local_runs(result.run_id)
    logs = [*sorted(run_dir.glob("node-*.log")), *sorted(run_dir.glob("attempt-*/node-*.log"))]
    first = watch.first
    fault_at = watch.fault_at
    if fault == "rank-exit":
        exits = [float(m[2]) for path in logs for m in EXITED_LINE.finditer(_read(path))]
        fault_at = min(exits, default=None)
    detected, named = watch.detected_at, _named(first)
    if fault == "preempt":  # the records' own word, read at the end: the whole attempt may end between two looks
        said_at, nodes = _preempted(final)
        detected = min((t for t in (detected, said_at) if t is not None), default=None)
        named = f"{watch.preemption.said if watch.preemption else 'nothing taken away'}: " + (
            f"recorded preempted on {', '.join(f'node-{node}' for node in nodes)}" if nodes
            else f"the run recorded {watch.detected_as}" if watch.detected_as in TAKEN else named)
        targets = replace(targets, grace=watch.preemption.grace if watch.preemption else None)
    dead = _dead(first)
    if dead is not None and fault in ("rank-exit", "rank-kill"):  # the supervisor's own record of the death
        detected = _epoch(dead.ended_at) or detected
    stopped = watch.stopped_at
    if first is not None:
        ends = [_epoch(r.ended_at) for r in first.ranks if r.node not in first.node_faults]
        if ends and all(ends):
            stopped = max(e for e in ends if e is not None)
            if fault not in ("rank-exit", "rank-kill") and detected is not None:  # seen late by polling: the
                detected = min(detected, *(e for e in ends if e is not None))  # stop it caused came first
    shares = [share.ended_at for share in final.timeline if share.attempt == 0]
    if (first is None or first.state is RunState.RUNNING) and shares and None not in shares:  # attempt 0 read before
        stopped = max(end for end in shares if end is not None)  # it ended: its nodes' own records of its end
    restarted = final.attempt > 0
    started = min((t for r in final.ranks if (t := _epoch(r.started_at))), default=None) if restarted else None
    # the job's own lines say which attempt a step belongs to (a requeued batch job writes every attempt to one
    # output): those before the next attempt's resumption are attempt 0's
    resumes = sorted((float(m[3]), int(m[2])) for path in logs for m in RESUMED_LINE.finditer(_read(path))
                     if int(m[1]) > 0)
    resumed_at, resumed_step = resumes[0] if resumes else (None, None)
    steps = list(_steps(logs))
    after = sorted(t for _, t in steps if resumed_at is not None and t >= resumed_at)
    resumed = after[0] if after and resumed_step else None
    last = max((step for step, t in steps if resumed_at is None or t < resumed_at), default=None)
    lost = last - resumed_step if last is not None and resumed_step is not None else None
    saved_at, saved = _checkpoint(logs, watch.node)
    times = {"detected": detected, "checkpointed": saved_at, "stopped": stopped, "started": started,
             "resumed": resumed}
    evidence = {"detected": named, "checkpointed": saved, "stopped": "every rank of attempt 0 ended" + (
        f" (node {', '.join(map(str, sorted(first.node_faults)))} lost)" if first and first.node_faults else ""),
        "started": f"attempt {final.attempt}" if restarted else "no next attempt",
        "resumed": f"at step {resumed_step} (checkpointed), {lost} steps recomputed"
        if resumed_step is not None else "never resumed from a checkpoint"}
    phases = []
    for phase in PREEMPT_PHASES if fault == "preempt" else PHASES:
        at = times[phase]
        seconds = round(at - fault_at, 2) if at is not None and fault_at is not None else None
        limit = targets.of(fault, phase)
        passed = seconds is not None and (limit is None or seconds <= limit)
        phases.append(Phase(phase, seconds, limit, "PASS" if passed else "FAIL", evidence[phase]))
    ok = all(p.verdict == "PASS" for p in phases) and result.exit_code == 0 and watch.problem is None
    return DrillReport(fault, result.run_id, run_dir, at_step, None if fault == "rank-exit" else watch.node,
                       datetime.fromtimestamp(fault_at, timezone.utc).isoformat(timespec="milliseconds")
                       if fault_at is not None else None, phases, resumed_step, last, lost, result.exit_code,
                       watch.problem, "PASS" if ok else "FAIL", _spans(first, final, fault_at), result.goodput)


def _preempted(final: RunRecord) -> tuple[float | None, list[int]]:
    """When the first node recorded attempt 0 preempted (its share's end), and the nodes that did."""
    shares = [share for share in final.timeline if share.attempt == 0 and share.state in TAKEN]
    return min((share.ended_at for share in shares if share.ended_at is not None), default=None), \
        sorted(share.node for share in shares)


def _checkpoint(logs: Sequence[Path], node: int) -> tuple[float | None, str]:
    """When ``node`` checkpointed on the signal (its job's line in ``logs``), and what it said."""
    for path in logs:
        for match in CHECKPOINTED_LINE.finditer(_read(path)):
            if int(match[1]) == node:
                return float(match[4]), f"node {node} checkpointed step {match[2]} after {match[3]}"
    return None, f"node {node} said no checkpoint after the signal"


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _dead(run: RunRecord | None) -> RankRecord | None:
    """The rank of attempt 0 that failed first (its own failure, not a stop), as its supervisor recorded it: the
    run's first failure, else the earliest to end failed (node 0 may not have named it yet when the drill last read
    attempt 0)."""
    ranks = sorted((r for r in (run.ranks if run is not None else ()) if r.state == RunState.FAILED and r.ended_at),
                   key=lambda r: r.ended_at or "")
    failure = run.first_failure if run is not None else None
    return next((r for r in ranks if failure is None or r.rank == failure.rank), None)


def _named(run: RunRecord | None) -> str:
    """Who was named, and why, as the records say it."""
    dead = _dead(run)
    if run is None:
        return "nothing recorded"
    if run.first_failure is not None:
        failure = run.first_failure
        return f"rank {failure.rank} (node-{failure.node}) {failure.reason}"
    if run.node_faults:
        return "; ".join(f"node-{node} {fault.sign}: {fault.evidence}"
                         for node, fault in sorted(run.node_faults.items()))
    if run.stacks:
        return f"hung: every rank's stack in {run.stacks}"
    if dead is not None:
        how = f"killed by {dead.signal}" if dead.signal else f"exited with {dead.exit_code}"
        return f"rank {dead.rank} (node-{dead.node}, pid {dead.pid}) {how}"
    return f"nothing named (the run read {run.state})"


def _spans(first: RunRecord | None, final: RunRecord, fault_at: float | None) -> list[RankSpans]:
    """Each rank's attempts, in seconds from the fault, by rank."""
    zero = fault_at or 0.0
    rows: dict[int, list[tuple[float, float, int]]] = {}
    runs = [run for run in (first, final if final.attempt > 0 else None) if run is not None]
    for run in runs:
        for rank in run.ranks:
            start, end = _epoch(rank.started_at), _epoch(rank.ended_at) or time.time()
            if start is not None:
                rows.setdefault(rank.rank, []).append((round(start - zero, 2), round(end - zero, 2), run.attempt))
    return [RankSpans(rank, spans) for rank, spans in sorted(rows.items())]


def run_drill(target: Target, fault: str, at_step: int = AT_STEP, as_json: bool = False,
              node: int | None = None) -> int:
    """Drill ``fault`` (or each, ``all``) on ``target``, at ``node`` (None: the last); print the table or JSON; 1
    when a phase FAILed."""
    faults = check(target, fault, node)
    targets = targets_of(target)
    drills = []
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        failed = ship_runtime(target.backend.access, target.handle)
        if failed:
            raise OperationError(f"cannot copy the drill's job to the nodes: {'; '.join(failed)}")
        for name in faults:
            drill = drill_one(target, name, at_step, targets, None if name == "rank-exit" else node)
            marks = [("FAULT", 0.0), *((p.phase.upper(), p.seconds) for p in drill.phases if p.seconds is not None)]
            write_timeline(drill.timeline, [(row.rank, row.attempts) for row in drill.ranks], marks)
            (drill.run_dir / "drill.json").write_text(json.dumps(drill.to_json(), indent=2) + "\n")
            drills.append(drill)
    ok = all(drill.verdict == "PASS" for drill in drills)
    if as_json:
        print_json({"ok": ok, "cluster": target.handle.name, "drills": [drill.to_json() for drill in drills]})
    else:
        _print(drills)
    return 0 if ok else 1


def _print(drills: Sequence[DrillReport]) -> None:
    for drill in drills:
        table(f"drill {drill.fault} at step {drill.at_step} (run {drill.run_id}, exit {drill.exit_code})",
              ["PHASE", "SECONDS", "TARGET", "VERDICT", "EVIDENCE"],
              [[p.phase, "-" if p.seconds is None else f"{p.seconds:.2f}",
                "-" if p.target is None else f"<= {p.target:g}", p.verdict, p.evidence] for p in drill.phases])
        if drill.goodput:
            say(goodput_line(drill.goodput))
        if drill.problem:
            say(f"the drill itself: {drill.problem}")
        judged(drill.verdict, f"{drill.fault}: lost work {drill.lost_steps} steps; timeline {drill.timeline}")
