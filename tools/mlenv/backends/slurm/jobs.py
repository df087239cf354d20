"""What Slurm says about jobs: squeue while they are known to it, ``scontrol show job`` for how they ended
(no accounting needed: sacct works only where accounting is configured), and pending reasons in plain words."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from mlenv.backends.slurm.login import Login
from mlenv.errors import OperationError
from mlenv.runtime.node.nodelist import expand_nodelist

LIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
                         "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"})
GONE = "GONE"
"""The state of a job Slurm no longer knows (purged MinJobAge after it ended)."""
SQUEUE_FORMAT = "%i|%T|%r|%N|%M"
_FIELD = re.compile(r"(\S+?)=(.*?)(?= \S+?=|$)")

REASONS: dict[str, tuple[str, bool]] = {
    "Resources": ("waiting for enough free nodes", False),
    "Priority": ("jobs of higher priority come first", False),
    "None": ("about to start", False),
    "BeginTime": ("its start time has not come yet", False),
    "Dependency": ("waiting for the jobs it depends on", False),
    "JobHeldUser": ("held by its user (scontrol release)", False),
    "JobHeldAdmin": ("held by an administrator", False),
    "PartitionDown": ("the partition is down", False),
    "PartitionInactive": ("the partition is inactive", False),
    "ReqNodeNotAvail": ("a requested node is down, drained or reserved", False),
    "NodeDown": ("a node it needs is down", False),
    "Reservation": ("waiting for its reservation to start", False),
    "PartitionNodeLimit": ("it asks for more nodes than the partition allows: lower the node count or pick "
                           "another partition", True),
    "PartitionTimeLimit": ("its slurm.time is above the partition's time limit", True),
    "PartitionConfig": ("it asks for more than the partition offers (nodes, GPUs or memory)", False),
    "InvalidAccount": ("slurm.account is not valid for you", True),
    "InvalidQOS": ("slurm.qos is not valid for you", True),
    "BadConstraints": ("no node has the features of slurm.constraint", True),
}
"""Slurm's pending reason -> (plain words, whether it never goes away by itself)."""


@dataclass(frozen=True)
class JobInfo:
    """A job as Slurm knows it now."""

    id: str
    state: str
    reason: str | None = None
    nodelist: str | None = None
    elapsed: str | None = None
    exit_code: int | None = None
    """For ended jobs: the script's exit code, or 128 + the signal that ended it."""

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def hosts(self) -> list[str]:
        """The job's nodes, in Slurm's order (empty while it has none)."""
        return expand_nodelist(self.nodelist) if self.nodelist else []

    @property
    def permanent(self) -> bool:
        """Pending for a reason that never goes away by itself."""
        return self.state == "PENDING" and REASONS.get(self.reason or "", ("", False))[1]

    def reason_words(self) -> str:
        """Slurm's reason, and what it means."""
        words = REASONS.get(self.reason or "", ("", False))[0]
        return f"{self.reason}{': ' + words if words else ''}"

    def words(self) -> str:
        """The state, with its reason in plain words (pending) or its exit code (ended)."""
        if self.state == "PENDING":
            return f"PENDING ({self.reason_words()})"
        if self.live or self.exit_code is None:
            return self.state
        return f"{self.state} (exit code {self.exit_code})"


def exit_code(field: str) -> int | None:
    """``ExitCode=3:0`` -> 3; ``0:15`` (ended by signal 15) -> 143."""
    code, _, signal = field.partition(":")
    if not (code.isdigit() and signal.isdigit()):
        return None
    return 128 + int(signal) if int(signal) else int(code)


def parse_squeue(text: str) -> dict[str, JobInfo]:
    """``squeue -h -o SQUEUE_FORMAT`` lines by job id."""
    jobs = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) == 5:
            job_id, state, reason, nodelist, elapsed = fields
            jobs[job_id] = JobInfo(job_id, state, reason or None, nodelist or None, elapsed or None)
    return jobs


def parse_scontrol(text: str) -> dict[str, str]:
    """``scontrol show job -o ID`` as fields: JobState, Reason, ExitCode, NodeList, StdOut..."""
    return dict(_FIELD.findall(text.strip()))


def ended(login: Login, job_id: str) -> JobInfo:
    """How a job that left squeue ended, from ``scontrol show job`` (GONE once Slurm has purged it)."""
    result = login.run(["scontrol", "show", "job", "-o", job_id])
    if result.returncode != 0:
        return JobInfo(job_id, GONE)
    fields = parse_scontrol(result.stdout.decode(errors="replace"))
    nodelist = fields.get("NodeList")
    return JobInfo(job_id, fields.get("JobState", GONE), fields.get("Reason"),
                   None if nodelist in (None, "(null)") else nodelist, fields.get("RunTime"),
                   exit_code(fields.get("ExitCode", "")))


def query(login: Login, job_ids: Iterable[str], exit_codes: bool = True) -> dict[str, JobInfo]:
    """Every job of ``job_ids`` as Slurm knows it, in one squeue call (plus, with ``exit_codes``, one scontrol
    call for each that ended)."""
    wanted = list(dict.fromkeys(job_ids))
    if not wanted:
        return {}
    result = login.run(["squeue", "-h", "-t", "all", f"--jobs={','.join(wanted)}", "-o", SQUEUE_FORMAT])
    stderr = result.stderr.decode(errors="replace")
    if result.returncode != 0 and "Invalid job id" not in stderr:
        raise OperationError(f"squeue failed on {login.where}: {stderr.strip() or result.returncode}")
    known = parse_squeue(result.stdout.decode(errors="replace")) if result.returncode == 0 else {}
    return {job_id: known[job_id] if job_id in known and (known[job_id].live or not exit_codes)
            else ended(login, job_id) if exit_codes else JobInfo(job_id, GONE) for job_id in wanted}


def state(login: Login, job_id: str) -> JobInfo:
    """One job, as :func:`query` sees it."""
    return query(login, [job_id])[job_id]
