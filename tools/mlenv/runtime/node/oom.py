"""Whether the kernel's OOM killer ended a process: the cgroup's OOM kill count grew (cgroup v2 ``memory.events``,
v1 ``memory.oom_control``), or the kernel log, where it can be read, says it killed that pid."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .readfs import read_text

_KILLED = re.compile(rb"(?:Killed process|oom-kill:.*?task_memcg.*?pid=|Memory cgroup out of memory: Killed process)"
                     rb"\s*(\d+)")


def oom_kills(proc_root: str | Path = "/proc", cgroup_root: str | Path = "/sys/fs/cgroup") -> int | None:
    """The OOM kills counted in this process's memory cgroup; None when it cannot be read."""
    for line in (read_text(Path(proc_root, "self", "cgroup")) or "").splitlines():
        number, controllers, path = [*line.split(":", 2), "", ""][:3]
        if number == "0" and not controllers:
            count = _count(Path(cgroup_root, path.lstrip("/"), "memory.events"))
        elif "memory" in controllers.split(","):
            count = _count(Path(cgroup_root, "memory", path.lstrip("/"), "memory.oom_control"))
        else:
            continue
        if count is not None:
            return count
    return None


def _count(path: Path) -> int | None:
    for line in (read_text(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def kernel_killed(pid: int, kmsg: str | Path = "/dev/kmsg") -> bool:
    """Whether the readable part of the kernel log says the OOM killer killed ``pid`` (False when unreadable)."""
    try:
        descriptor = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        while True:
            try:
                record = os.read(descriptor, 8192)
            except BlockingIOError:
                return False
            except OSError:  # EPIPE: the record we were at was overwritten; go on with the next
                continue
            if not record:
                return False
            if any(int(found) == pid for found in _KILLED.findall(record)):
                return True
    finally:
        os.close(descriptor)
