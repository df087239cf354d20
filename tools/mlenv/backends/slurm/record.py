"""The Slurm jobs mlenv submitted, kept by cluster name in the records the backend is handed
(``core.registry.Records``; mlenv's are .mlenv/state.json), whether or not the cluster is deployed: status and
clean touch only these, and ``mlenv clean --cluster FILE`` forgets them."""

from __future__ import annotations

from datetime import datetime, timezone

from mlenv.core.capabilities import Handle
from mlenv.core.recorded import SubmittedJob
from mlenv.core.registry import Records

KEEP_JOBS = 50
"""The newest jobs kept per deployment."""


def jobs(records: Records, name: str) -> list[SubmittedJob]:
    """The jobs recorded for the deployment ``name`` (oldest first)."""
    return [job for job in records.jobs_of(name) if job.id.isdigit()]


def remember(records: Records, handle: Handle, job_id: str, run_id: str, script: str, detached: bool,
             restarts: int = 0) -> None:
    """Record a batch job submitted for ``handle``'s cluster file (``status`` shows its run); ``restarts``: the
    --max-restarts of a detached run, whose script may submit the run's next job (``follow``)."""
    job = SubmittedJob(job_id, run_id, script, detached, datetime.now(timezone.utc).isoformat(timespec="seconds"),
                       restarts)
    records.add_job(handle.name, job, KEEP_JOBS)
