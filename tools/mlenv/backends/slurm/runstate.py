"""A run's state as its nodes recorded it, set right by what Slurm says of the run's batch job and by how the run's
script recorded its newest attempt's end once its step or job is gone: the nodes' records end with each attempt (or
stop where Slurm killed the step: a node lost), the job goes on (requeued, preempted) or ends otherwise (the
script's own exit code, a refused requeue), so ``latest_run.state`` agrees with the scheduler's view of the run, in
an allocation as in a batch job. Pure."""

from __future__ import annotations

from mlenv.backends.slurm.jobs import JobInfo
from mlenv.runtime.records.runlayout import FAILED, NODE_FAILED, PREEMPTED, REQUEUED, RUN_STATES, STOPPED, SUCCEEDED

WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED"})
"""States of a job that has run an attempt and waits to start again."""


def reconcile(recorded: str | None, job: JobInfo | None, stopped: bool = False,
              ended: str | None = None) -> str | None:
    """The run's state from its nodes' ``recorded`` one, its batch ``job`` (None: a run inside an allocation, or
    a job Slurm no longer knows) and how its newest attempt ``ended`` (the script's record, given once the run's step
    or job is gone): ``stopped`` once the job of a run ``mlenv stop`` ``stopped`` has ended, ``requeued`` while the
    job waits after an attempt, ``preempted`` when Slurm preempted it; else the attempt's end as its script recorded
    it (the nodes' records stop where the step was killed: a node lost, a requeue), ``failed`` for a node failure;
    ``failed`` when the job ended with a failure although every rank succeeded (a requeue refused, or capped)."""
    if recorded is None:
        return recorded
    if stopped and job is not None and not job.live:
        return STOPPED
    if job is not None and job.state in WAITING:
        return REQUEUED
    if job is not None and job.state == "PREEMPTED":
        return PREEMPTED
    if ended is not None:
        return FAILED if ended == NODE_FAILED else ended if ended in RUN_STATES else recorded
    if job is not None and recorded == SUCCEEDED and not job.live and job.exit_code not in (None, 0):
        return FAILED
    return recorded
