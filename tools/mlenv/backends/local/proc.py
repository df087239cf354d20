"""Processes of the local backend: every command started in a pod records its PID in the pod directory and
carries the pod directory in its environment, so status can count jobs and clean can stop all of them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

MARKER = "MLENV_POD_DIR"
# $0 is the pod directory, "$@" the command: record the PID (which exec keeps), log the command, run it.
_RECORD = ('mkdir -p "$0/pids" && : > "$0/pids/$$" && '
           'printf "%s exec %s\\n" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*" >> "$0/pod.log"; exec "$@"')


def recorded(pod_dir: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped so that its PID is recorded under ``pod_dir``/pids and the command logged."""
    return ["sh", "-c", _RECORD, str(pod_dir), *argv]


def _in_pod(pid: int, pod_dir: Path) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{MARKER}={pod_dir}".encode() in environ.split(b"\0")


def running(pod_dir: Path) -> list[int]:
    """Recorded PIDs of ``pod_dir`` that still run; records of finished commands are dropped."""
    alive = []
    for record in sorted((pod_dir / "pids").glob("[0-9]*")):
        if _in_pod(int(record.name), pod_dir):
            alive.append(int(record.name))
        else:
            record.unlink(missing_ok=True)
    return alive


JOB = b"MLENV_JOB="
"""In the environment of a run's processes on a node (the runtime's supervisor sets it, its ranks inherit it)."""


def jobs(pod_dirs: Sequence[Path]) -> list[int]:
    """How many jobs run in each of ``pod_dirs``: its recorded commands that still run (an exec, an attached
    launch), and the supervisors of its detached runs (session leaders whose run record names them), which no
    recorded command waits for."""
    wanted = {f"{MARKER}={d}".encode(): index for index, d in enumerate(pod_dirs)}
    counts = [len(running(d)) for d in pod_dirs]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        pod = next((wanted[item] for item in environ if item in wanted), None)
        fields = stat[stat.rindex(")") + 2:].split()
        record = next((item[len(JOB):] for item in environ if item.startswith(JOB)), None)
        if pod is not None and record and fields[0] not in "ZX" and int(fields[3]) == int(entry.name) \
                and _recorded_pid(Path(os.fsdecode(record))) == int(entry.name):
            counts[pod] += 1
    return counts


def _recorded_pid(record: Path) -> int | None:
    """The supervisor's pid a run's record.json holds (None: unreadable)."""
    try:
        pid = json.loads(record.read_text()).get("pid")
    except (OSError, ValueError, AttributeError):
        return None
    return pid if isinstance(pid, int) else None


def _members(pod_dirs: Iterable[Path]) -> set[int]:
    """Every process whose environment names one of ``pod_dirs``: recorded commands and all they started."""
    wanted = {f"{MARKER}={d}".encode() for d in pod_dirs}
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if environ & wanted:
            found.add(int(entry.name))
    return found


def _signal(pids: Iterable[int], sig: signal.Signals, groups: Iterable[int] = ()) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def stop(pod_dirs: Sequence[Path], grace: float = 5.0) -> int:
    """Stop every process of ``pod_dirs`` (SIGTERM to recorded process groups and members, SIGKILL after
    ``grace`` seconds); returns how many there were."""
    groups = [pid for d in pod_dirs for pid in running(d)]
    members = _members(pod_dirs)
    if not groups and not members:
        return 0
    _signal(members, signal.SIGTERM, groups)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _members(pod_dirs):
        time.sleep(0.1)
    _signal(_members(pod_dirs), signal.SIGKILL, groups)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _members(pod_dirs):
        time.sleep(0.1)
    return len(members | set(groups))
