"""Detached jobs: this node's share of a job started in the background, then listed, followed and stopped.

A run directory holds, for each attempt K and node R, ``attempt-<K>/node<R>/`` (runlayout.py, docs/runs.md):
``output.log``, ``record.json`` (pid of the supervisor, which leads its own session and process group when
detached, host, run id, argv, start time, attempt), ``ranks.json``, ``state.json`` and, once the job has ended,
``exit`` (its exit status). Runs may live on a filesystem that several hosts share,
so callers act only on the records of their own host, and only on processes that really are the job's: the
supervisor must have the recorded start time, and every process of the job carries ``MLENV_JOB=<record>`` in
its environment (inherited from the supervisor), so a reused PID is never taken for the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, NamedTuple

from ..node.readfs import read_int
from ..records.runlayout import NodeDir, latest_node_dirs, read_ranks, read_state, write_atomic
from ..records.states import Ending, FaultSign, NodeFault, RunState, exit_state
from ..records.timeline import node_attempts
from .reaping import procs_of, recorded_cgroup, remove_cgroup
from .supervisor import JOB_VARIABLE

POLL_SECONDS = 0.2
KILL_WAIT_SECONDS = 5.0
GONE_REASON = "gone without an exit status"
"""The reason of a node's share whose supervisor is gone without writing its exit status (state failed)."""


class JobError(Exception):
    """A job operation that cannot be done (exit status 1)."""


class BadInput(Exception):
    """Input the user can fix; reported in one line with exit status 2."""


def job_marker(files: NodeDir) -> bytes:
    """``MLENV_JOB=<record>``, as it appears in the environment of the job's processes."""
    return f"{JOB_VARIABLE}={files.record.resolve()}".encode()


@dataclass(frozen=True)
class Record:
    """What ``launch --detach`` wrote about the job it started."""

    run_id: str
    node_rank: int
    host: str
    pid: int  # the detached supervisor: session and process group leader
    start_ticks: int  # its start time in clock ticks after boot (/proc/<pid>/stat), which PID reuse cannot fake
    started_at: str  # ISO 8601, UTC
    argv: tuple[str, ...]
    attempt: int = 0

    @classmethod
    def load(cls, path: Path) -> Record | None:
        """The record in ``path``; None when it is missing or not a record."""
        try:
            data = json.loads(path.read_text())
            return cls(str(data["run_id"]), int(data["node_rank"]), str(data["host"]), int(data["pid"]),
                       int(data["start_ticks"]), str(data["started_at"]), tuple(map(str, data["argv"])),
                       int(data.get("attempt", 0)))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "argv": list(self.argv)}


@dataclass(frozen=True)
class NodeJob:
    """A node's job and what became of it."""

    files: NodeDir
    record: Record
    state: RunState
    exit_code: int | None

    def to_dict(self) -> dict[str, object]:
        """The JSON shape of one job in ``jobs --json``: the record, state, exit code, the node's ranks, the
        first failure of the job as this node knows it, and the node's share of every attempt (its goodput's)."""
        recorded = read_state(self.files)
        return {**self.record.to_dict(), "state": self.state, "exit_code": self.exit_code,
                "reason": recorded.get("reason") or (GONE_REASON if self.lost else None),
                "first_failure": recorded.get("first_failure"), "node_fault": self.node_fault(recorded),
                "transport": recorded.get("transport"), "stacks": recorded.get("stacks"), "idle": recorded.get("idle"),
                "stragglers": recorded.get("stragglers"), "lost_nodes": recorded.get("lost_nodes"),
                "ranks": [rank.to_dict() for rank in read_ranks(self.files)],
                "attempts": [share.to_dict() for share in node_attempts(self.files.run_dir, self.files.node)],
                "run_dir": str(self.files.run_dir), "node_dir": str(self.files.path), "log": str(self.files.log)}

    def node_fault(self, recorded: Mapping[str, object]) -> object:
        """This node's own fault sign (faultsigns.py): an in-node check's refusal, or ``unreachable`` when its
        supervisor is gone without an exit status; None without one."""
        if self.lost:
            return NodeFault(FaultSign.UNREACHABLE, f"the node's supervisor (pid {self.record.pid}) is gone without "
                                                    "an exit status").to_dict()
        return recorded.get("node_fault")

    @property
    def lost(self) -> bool:
        return self.state is RunState.FAILED and self.exit_code is None

    def describe(self) -> str:
        return f"node {self.record.node_rank} of run {self.record.run_id} (pid {self.record.pid})"


@dataclass(frozen=True)
class Stopped:
    """How a job ended under ``stop``."""

    job: NodeJob
    signal: signal.Signals  # the last signal it needed: SIGTERM or SIGKILL
    left: int  # processes still alive after SIGKILL (0 when it is really gone)


class _Stat(NamedTuple):
    """What ``/proc/<pid>/stat`` says about a process."""

    state: str  # R, S, D, Z (zombie), ...
    group: int
    start_ticks: int  # clock ticks after boot


class _Process(NamedTuple):
    pid: int
    stat: _Stat
    environ: frozenset[bytes]


def start_recorded(
    argv: Sequence[str], files: NodeDir, *, run_id: str, host: str, environ: Mapping[str, str],
    detached: bool, proc_root: str | Path = "/proc",
) -> tuple[subprocess.Popen[bytes], Record]:
    """Start ``argv`` (the supervisor, which writes the exit file) and write its record. ``detached``: in a
    session of its own, stdin from /dev/null and output appended to the node log; else in this process's
    session with this process's stdout (the caller waits for it)."""
    files.path.mkdir(parents=True, exist_ok=True)
    previous = node_job(files, proc_root)
    if previous is not None and previous.state is RunState.RUNNING:
        raise JobError(f"{previous.describe()} is still running; stop it first")
    files.exit.unlink(missing_ok=True)
    env = {**environ, "MLENV_RUN_ID": run_id, JOB_VARIABLE: str(files.record.resolve())}
    if detached:
        with files.log.open("ab") as log:
            process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       env=env, start_new_session=True)
    else:
        process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, env=env)
    stat = _stat(process.pid, proc_root)  # our child: readable until we wait for it, even after it ended
    if stat is None:
        raise JobError(f"cannot read the start time of the job's process {process.pid}")
    record = Record(run_id, files.node, host, process.pid, stat.start_ticks,
                    datetime.now(timezone.utc).isoformat(timespec="milliseconds"), tuple(argv), files.attempt)
    write_atomic(files.record, json.dumps(record.to_dict(), indent=2) + "\n")
    return process, record


def read_exit(path: Path) -> int | None:
    """The exit status in an exit file; None while there is none."""
    return read_int(path)


def node_job(files: NodeDir, proc_root: str | Path = "/proc") -> NodeJob | None:
    """The job recorded in ``files``, with its state; None without a readable record. A job gone without an
    exit status is ``failed`` (lost)."""
    record = Record.load(files.record)
    if record is None:
        return None
    code = read_exit(files.exit)
    if code is None and is_running(record, files, proc_root):
        hung = read_state(files).get("state") == RunState.HUNG  # a watchdog's verdict on a job still running
        return NodeJob(files, record, RunState.HUNG if hung else RunState.RUNNING, None)
    if code is None:
        code = read_exit(files.exit)  # it may have ended since the first look
    return NodeJob(files, record, ended_state(read_state(files).get("state"), code), code)


def ended_state(recorded: object, code: int | None) -> RunState:
    """The state of a node's share that ended with ``code`` (None: its supervisor gone without an exit status): the
    one its state.json records, else (killed before writing it) the one the exit code alone says."""
    state = RunState.parse(recorded) if code is not None else None
    return state if state is not None and state is not RunState.RUNNING else exit_state(code, Ending.CODE_ONLY)


def host_jobs(root: Path, host: str, run_id: str | None = None, proc_root: str | Path = "/proc") -> list[NodeJob]:
    """The jobs of ``host`` under the runs root (only run ``run_id`` when given), oldest first."""
    runs = [root / run_id] if run_id else sorted(root.glob("*"))  # nothing when the root is not there (yet)
    jobs = [job for files in _node_files(runs) if (job := node_job(files, proc_root)) and job.record.host == host]
    return sorted(jobs, key=lambda job: (job.record.started_at, job.record.run_id, job.record.node_rank))


def _node_files(runs: Iterable[Path]) -> Iterator[NodeDir]:
    for run in runs:
        yield from latest_node_dirs(run)


def stop_jobs(jobs: Sequence[NodeJob], grace: float, proc_root: str | Path = "/proc") -> list[Stopped]:
    """SIGTERM each job's live supervisor, which stops its job in order and records it as stopped (every process
    of a job without one), SIGKILL what is left after ``grace`` seconds; record the exit status of the jobs whose
    supervisor could not (killed before writing it). A finished job (its exit status written) is not touched: its
    supervisor ended what it left behind."""
    processes = _processes(proc_root)
    targets = [job for job in jobs if read_exit(job.files.exit) is None and _members(job, processes, proc_root)]
    supervised = [job for job in targets if is_running(job.record, job.files, proc_root)]
    for job in supervised:  # once: not also to its ranks, which it would then take for failed
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(job.record.pid, signal.SIGTERM)
    _signal_all([job for job in targets if job not in supervised], signal.SIGTERM, proc_root)
    survivors = _wait_until_gone(targets, grace, proc_root)
    _signal_all(survivors, signal.SIGKILL, proc_root)
    left = _wait_until_gone(survivors, KILL_WAIT_SECONDS, proc_root, resend=signal.SIGKILL)
    processes = _processes(proc_root)
    stopped = []
    for job in targets:
        last = signal.SIGKILL if job in survivors else signal.SIGTERM
        remaining = len(_members(job, processes, proc_root)) if job in left else 0
        if not remaining and (cgroup := _cgroup(job)) is not None and not is_running(job.record, job.files, proc_root):
            remove_cgroup(cgroup)  # its supervisor is gone
        if not remaining and read_exit(job.files.exit) is None:
            write_atomic(job.files.exit, f"{128 + last}\n")
            ending = Ending.KILLED if last is signal.SIGKILL else Ending.STOP
            write_atomic(job.files.state, json.dumps({**read_state(job.files), "state": exit_state(128 + last, ending),
                                                      "reason": f"stopped by {last.name}"}) + "\n")
        stopped.append(Stopped(job, last, remaining))
    return stopped


def _members(job: NodeJob, processes: Iterable[_Process], proc_root: str | Path) -> list[int]:
    """The job's live processes: those carrying its ``MLENV_JOB`` marker, those in its supervisor's cgroup, and
    the supervisor's process group while the supervisor is the recorded one."""
    group = job.record.pid if is_running(job.record, job.files, proc_root) else None
    marker = job_marker(job.files)
    cgroup = _cgroup(job)
    held = set(procs_of(cgroup)) if cgroup is not None else set()
    return [p.pid for p in processes if p.stat.group == group or marker in p.environ or p.pid in held]


def _cgroup(job: NodeJob) -> Path | None:
    """The cgroup the job's supervisor made for it (runtime/supervise/reaping.py), if it recorded one."""
    return recorded_cgroup(read_state(job.files).get("cgroup"), job.record.pid, job.record.start_ticks)


def follow_log(job: NodeJob, out: IO[bytes], proc_root: str | Path = "/proc") -> int | None:
    """Copy the job's log to ``out`` as it grows until its supervisor has ended (after the exit file, a detached
    one may still say that it restarts the run and start the next attempt); the exit status, or None when the job
    is gone without one. The supervisor is looked at before each read, so everything it wrote is copied."""
    with job.files.log.open("rb") as log:
        while True:
            going = is_running(job.record, job.files, proc_root)
            _copy(log, out)
            if not going:
                return read_exit(job.files.exit)
            time.sleep(POLL_SECONDS)


def next_attempt(job: NodeJob, proc_root: str | Path = "/proc") -> NodeJob | None:
    """This node's share of the attempt after ``job``'s, once ``job``'s supervisor has ended: a supervisor that
    restarts the run records the next attempt before it ends (None: the run was not restarted here)."""
    return node_job(NodeDir(job.files.run_dir, job.files.attempt + 1, job.files.node), proc_root)


def _copy(source: IO[bytes], out: IO[bytes]) -> None:
    while chunk := source.read(1 << 16):
        out.write(chunk)
    out.flush()


def _signal_all(jobs: Iterable[NodeJob], signum: signal.Signals, proc_root: str | Path) -> None:
    processes = _processes(proc_root)
    for job in jobs:
        for pid in _members(job, processes, proc_root):
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                continue  # gone meanwhile, or not ours after all


def _wait_until_gone(
    jobs: Sequence[NodeJob], seconds: float, proc_root: str | Path, resend: signal.Signals | None = None
) -> list[NodeJob]:
    """The jobs that still have processes after up to ``seconds``; ``resend`` goes to newcomers meanwhile."""
    deadline = time.monotonic() + seconds
    remaining = list(jobs)
    while remaining and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
        processes = _processes(proc_root)
        remaining = [job for job in remaining if _members(job, processes, proc_root)]
        if resend is not None:
            _signal_all(remaining, resend, proc_root)
    return remaining


def is_running(record: Record, files: NodeDir, proc_root: str | Path = "/proc") -> bool:
    """Whether the recorded pid is still the job's live supervisor: same start time, the job's marker."""
    stat = _stat(record.pid, proc_root)
    return (stat is not None and stat.state not in "ZX" and stat.start_ticks == record.start_ticks
            and job_marker(files) in _environ(record.pid, proc_root))


def _processes(proc_root: str | Path) -> list[_Process]:
    """Every live process but this one (zombies are dead: only their parent's wait is missing)."""
    found = []
    for pid in (int(entry.name) for entry in Path(proc_root).iterdir() if entry.name.isdigit()):
        stat = _stat(pid, proc_root)
        if stat is not None and stat.state not in "ZX" and pid != os.getpid():
            found.append(_Process(pid, stat, frozenset(_environ(pid, proc_root))))
    return found


def _stat(pid: int, proc_root: str | Path) -> _Stat | None:
    """What ``/proc/<pid>/stat`` says; None when the process is gone."""
    try:
        text = Path(proc_root, str(pid), "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name in parentheses may hold spaces
    return _Stat(fields[0], int(fields[2]), int(fields[19]))


def _environ(pid: int, proc_root: str | Path) -> list[bytes]:
    """The environment ``pid`` was started with, one ``NAME=value`` each (empty when it is gone or not ours)."""
    try:
        return Path(proc_root, str(pid), "environ").read_bytes().split(b"\0")
    except OSError:
        return []
