"""A run's state as its nodes recorded it, set right by what Slurm says of the run's batch job and by how the run's
script recorded its newest attempt's end once its step or job is gone: the nodes' records end with each attempt (or
stop where Slurm killed the step: a node lost), the job goes on (requeued, preempted) or ends otherwise (the
script's own exit code, a refused requeue), so ``latest_run.state`` agrees with the scheduler's view of the run, in
an allocation as in a batch job. Pure."""

from __future__ import annotations

from mlenv.backends.slurm.jobs import JobInfo
from mlenv.runtime.records.states import Ending, RunState, exit_state

WAITING = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED"})
"""States of a job that has run an attempt and waits to start again."""


def reconcile(recorded: RunState | None, job: JobInfo | None, stopped: bool = False,
              ended: str | None = None) -> RunState | None:
    """The run's state from its nodes' ``recorded`` one, its batch ``job`` (None: a run inside an allocation, or
    a job Slurm no longer knows) and how its newest attempt ``ended`` (the script's record, given once the run's step
    or job is gone): ``stopped`` once the job of a run ``mlenv stop`` ``stopped`` has ended, ``requeued`` while the
    job waits after an attempt, ``preempted`` when Slurm preempted it; else the attempt's end as its script recorded
    it (the nodes' records stop where the step was killed: a node lost, a requeue), ``failed`` for a node failure;
    else, once the job ended although every rank succeeded, its exit code's state (a requeue refused, or capped:
    ``failed``)."""
    if recorded is None:
        return recorded
    if stopped and job is not None and not job.live:
        return RunState.STOPPED
    if job is not None and job.state in WAITING:
        return RunState.REQUEUED
    if job is not None and job.state == "PREEMPTED":
        return RunState.PREEMPTED
    attempt = RunState.parse(ended)
    if attempt is not None:
        return RunState.FAILED if attempt is RunState.NODE_FAILURE else attempt
    if job is not None and recorded is RunState.SUCCEEDED and not job.live and job.exit_code is not None:
        return exit_state(job.exit_code, Ending.CODE_ONLY)
    return recorded
