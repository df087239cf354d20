"""A batch run's state as its nodes recorded it, set right by what Slurm says of the run's batch job: the nodes'
records end with each attempt, the job goes on (requeued, preempted) or ends otherwise (the script's own exit code,
a refused requeue), so ``latest_run.state`` agrees with squeue's view of the run's job. Pure."""

from __future__ import annotations

from mlenv.backends.slurm.jobs import JobInfo
from mlenv.runtime.records.runlayout import FAILED, PREEMPTED, REQUEUED, STOPPED, SUCCEEDED

WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED"})
"""States of a job that has run an attempt and waits to start again."""


def reconcile(recorded: str | None, job: JobInfo | None, stopped: bool = False) -> str | None:
    """The run's state from its nodes' ``recorded`` one and its batch ``job`` (None: a run inside an allocation, or
    a job Slurm no longer knows): ``stopped`` once the job of a run ``mlenv stop`` ``stopped`` has ended,
    ``requeued`` while the job waits after an attempt, ``preempted`` when Slurm preempted it, ``failed`` when the
    job ended with a failure although every rank succeeded (a requeue refused, or capped)."""
    if recorded is None or job is None:
        return recorded
    if stopped and not job.live:
        return STOPPED
    if job.state in WAITING:
        return REQUEUED
    if job.state == "PREEMPTED":
        return PREEMPTED
    if recorded == SUCCEEDED and not job.live and job.exit_code not in (None, 0):
        return FAILED
    return recorded
