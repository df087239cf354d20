"""The Slurm jobs mlenv submitted, kept in .mlenv/state.json by cluster name (``state.jobs_of``), whether or not
the cluster is deployed: status and clean touch only these, and ``mlenv clean --cluster FILE`` forgets them."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from mlenv import state
from mlenv.core.capabilities import Handle

KEEP_JOBS = 50
"""The newest jobs kept per deployment."""


def jobs(name: str) -> list[dict[str, Any]]:
    """The jobs recorded for the deployment ``name`` (oldest first)."""
    return [job for job in state.jobs_of(name) if isinstance(job.get("id"), str) and job["id"].isdigit()]


def remember(handle: Handle, job_id: str, run_id: str, script: str) -> None:
    """Record a batch job submitted for ``handle``'s cluster file."""
    job = {"id": job_id, "run": run_id, "script": script,
           "submitted": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    state.add_job(handle.name, job, KEEP_JOBS)


def update_handle(handle: Handle) -> None:
    """Keep what the handle learned (the master's address) in the deployment's record, if it has one."""
    state.update(handle.name, handle=handle)
