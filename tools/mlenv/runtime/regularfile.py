"""Opening a file the user names, which must be a regular file: a directory, a device, a named pipe or a socket is
refused before it is opened, and the opened file is looked at again (it may have been replaced in between), opened
without blocking, so a named pipe or a device is never waited on nor read."""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO

KINDS = {stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
         stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket"}


class NotRegularFile(OSError):
    """The path is no regular file; ``kind`` names what it is (``a directory``, ``a named pipe``, ...)."""

    def __init__(self, path: str | os.PathLike[str], kind: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file ({kind})", os.fspath(path))
        self.kind = kind


def _require_regular(info: os.stat_result, path: str | os.PathLike[str]) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise NotRegularFile(path, KINDS.get(stat.S_IFMT(info.st_mode), "not a file"))


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for binary reading; NotRegularFile when it is no regular file, OSError when it cannot be
    opened."""
    _require_regular(os.stat(path), path)
    handle = open(path, "rb", opener=lambda name, flags: os.open(name, flags | os.O_NONBLOCK))  # noqa: SIM115 - returned
    try:
        _require_regular(os.fstat(handle.fileno()), path)
    except NotRegularFile:
        handle.close()
        raise
    return handle
