"""Wait while a job is pending, showing Slurm's reason live (a terminal's stderr; elsewhere the last state once)."""

from __future__ import annotations

import time

from mlenv.backends.slurm import jobs
from mlenv.backends.slurm.jobs import JobInfo
from mlenv.backends.slurm.login import Login
from mlenv.errors import OperationError
from mlenv.ui import live_view

POLL_SECONDS = 0.25
"""Between two squeue calls while waiting."""
STARTING = frozenset({"PENDING", "CONFIGURING"})


class CannotStart(OperationError):
    """The job is pending for a reason that never goes away by itself."""

    def __init__(self, info: JobInfo, what: str) -> None:
        super().__init__(f"{what} cannot start: {info.words()}")
        self.info = info


def wait_started(login: Login, job_id: str, what: str, timeout: float | None = None) -> JobInfo:
    """Poll until the job is no longer pending (running, or already ended); CannotStart for a reason that never
    goes away, OperationError after ``timeout`` seconds (None: no limit)."""
    started = time.monotonic()
    info = jobs.state(login, job_id)
    if info.state not in STARTING:
        return info
    with live_view() as update:
        while info.state in STARTING:
            elapsed = time.monotonic() - started
            update(f"{what}: {info.words()} ({elapsed:.0f}s)")
            if info.permanent:
                raise CannotStart(info, what)
            if timeout is not None and elapsed >= timeout:
                raise OperationError(f"{what} is still {info.words()} after {timeout:.0f}s; it stays queued")
            time.sleep(POLL_SECONDS)
            info = jobs.state(login, job_id)
        update(f"{what}: {info.words()} after {time.monotonic() - started:.0f}s")
    return info
