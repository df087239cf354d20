"""A supervisor's directories under the temporary directory (its ranks' sockets; an attached launch's work directory
where there is no run directory), which no SIGKILL leaves behind for good.

The supervisor that makes one holds an exclusive lock (``flock``) on it for as long as it lives, and marks it as
mlenv's (``MARK``, holding its pid) once the lock is held. A marked directory whose lock is free outlived its
supervisor (killed outright, crashed): the next supervisor started with the same temporary directory removes it
(``remove_stale``). A directory of a live supervisor (its lock held, in whatever pid namespace), one without the
mark, another user's or a symlink is never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

PREFIX = "mlenv-"
MARK = ".mlenv-supervisor"


@contextlib.contextmanager
def held_tempdir(prefix: str = PREFIX) -> Iterator[Path]:
    """A new directory under the temporary directory, locked and marked while the block runs; removed after it."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    lock = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # unmarked yet: nobody else ever locks it
        (path / MARK).write_text(f"{os.getpid()}\n")
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(lock)  # only once it is gone: a sweep that takes the lock then finds nothing to remove


def remove_stale(note: Callable[[str], None]) -> None:
    """Remove the marked directories under the temporary directory whose supervisor is gone (their lock is free);
    say how many, when any."""
    root = Path(tempfile.gettempdir())
    removed = 0
    for entry in root.glob(f"{PREFIX}*"):
        with contextlib.suppress(OSError):
            found = entry.lstat()
            if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or not (entry / MARK).is_file():
                continue
            lock = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: its supervisor lives
                if (entry / MARK).is_file():  # not removed by its supervisor meanwhile
                    shutil.rmtree(entry)
                    removed += 1
            finally:
                os.close(lock)
    if removed:
        note(f"removed {removed} director{'y' if removed == 1 else 'ies'} of supervisors that are gone from {root}")
