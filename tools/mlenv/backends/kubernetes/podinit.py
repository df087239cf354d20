"""PID 1 of mlenv's pods (``python3 -c SOURCE GRACE MARK``): idle until the pod is deleted, then hand the SIGTERM on.

A container's PID 1 ignores signals it has no handler for, so with ``sleep infinity`` a deleted pod's job got no
warning: the kernel SIGKILLed it after the grace period. This init passes SIGTERM to every other process of the
pod (the runtime's node supervisors, which stop their ranks, and the ranks) and waits until they are gone, at most
GRACE seconds. Before, it writes the file MARK (on the pod's own /dev/shm): the pod's supervisors, which the pod
template tells where it is (``MLENV_PREEMPTED_MARK``), record the stop as a preemption, not a user's stop. It also
reaps the orphans a PID 1 inherits. When the pod starts where a detached run was preempted (its Secret, mounted at
RUN_SECRET_DIR, names the run: ``MLENV_RESUME_RUN``), it first has the runtime that sync shipped to the workspace
resume this node's share of it (``python3 -m mlenv.runtime resume``, which decides). Standard library only: it runs
before sync shipped anything, so the pod template carries its source (:func:`command`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STOP = {signal.SIGTERM, signal.SIGINT}
SIGNAL = "SIGTERM"
"""What every other process of the pod gets when it is deleted: the ranks' checkpoint signal."""
WAKE = STOP | {signal.SIGCHLD}
POLL_SECONDS = 0.2
MARK = "/dev/shm/mlenv-pod-taken-away"  # noqa: S108 - the pod's own emptyDir, no one else's
"""What this init writes when its pod is deleted or evicted (the pod's own memory volume: gone with the pod)."""
RUN_SECRET_DIR = "/mlenv-run"  # noqa: S105 - a directory, no secret
"""Where the pod template mounts the run's Secret (backends/kubernetes/resume.py): a file per variable."""
RESUME = "MLENV_RESUME_RUN"
"""The file there that names the detached run to resume (runtime/records/runlayout.py RESUME_RUN; this file cannot
import it)."""


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _others() -> list[int]:
    """The live processes of this PID namespace but this one."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if (entry / "stat").read_text().rpartition(")")[2].split()[0] != "Z":
                alive.append(int(entry.name))
    return alive


def _resume() -> None:
    """Where a detached run is to be resumed and the workspace holds the runtime: start the runtime's ``resume``
    (before the signals are blocked: a child inherits the mask), its output in the container's."""
    shipped = Path.cwd() / ".mlenv"
    if not (Path(RUN_SECRET_DIR) / RESUME).is_file() or not (shipped / "mlenv" / "runtime").is_dir():
        return
    with contextlib.suppress(OSError):
        subprocess.Popen([sys.executable, "-m", "mlenv.runtime", "resume"], stdin=subprocess.DEVNULL,
                         env={**os.environ, "PYTHONPATH": str(shipped)}, start_new_session=True)


def main(grace: float, mark: str) -> int:
    """Resume a preempted detached run's share here where there is one, wait for SIGTERM (or SIGINT), write
    ``mark``, signal everyone else, wait up to ``grace`` seconds for them to end."""
    _resume()
    signal.pthread_sigmask(signal.SIG_BLOCK, WAKE)
    while True:
        woken = signal.sigtimedwait(WAKE, 60)
        _reap()
        if woken is not None and woken.si_signo in STOP:
            break
    with contextlib.suppress(OSError):
        Path(mark).write_text(f"{time.time()}\n")
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, getattr(signal, SIGNAL))
    deadline = time.monotonic() + grace
    while _others() and time.monotonic() < deadline:
        signal.sigtimedwait({signal.SIGCHLD}, POLL_SECONDS)
        _reap()
    return 0


def command(grace: int) -> list[str]:
    """The container command that runs this file as PID 1 with ``grace`` seconds, writing :data:`MARK`."""
    return ["python3", "-c", Path(__file__).read_text(encoding="utf-8"), str(grace), MARK]


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]), sys.argv[2]))
