"""Waiting on conditions, not on the clock."""

from __future__ import annotations

import time
from pathlib import Path


def sleeping(pid: int) -> bool:
    """Process ``pid`` is asleep in ``time.sleep`` (the kernel's nanosleep: ``/proc/PID/wchan``), as a Python
    program is in its poll loop; never while it starts up, imports or does I/O."""
    try:
        return "nanosleep" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


def wait_until_polling(pid: int, timeout: float = 60.0) -> None:
    """Wait until process ``pid`` has reached its poll loop (:func:`sleeping`); AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not sleeping(pid):
        assert time.monotonic() < deadline, f"process {pid} never reached its poll loop in {timeout:.0f}s"
        time.sleep(0.01)
