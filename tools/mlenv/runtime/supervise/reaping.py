"""What a node's share of a job leaves behind ends with it.

The supervisor makes a cgroup for its share before it starts the launcher, which is put in it as it starts, so
every process of the share is in it however it detached (a double-forked ``setsid`` daemon, a child started with
``env -i``). When the share ends (success, failure, stop) whatever the cgroup still holds gets SIGTERM, then
SIGKILL after the grace (cgroup v2's ``cgroup.kill``, or a frozen v1 freezer cgroup), and the cgroup is removed.
cgroup v2 (also the unified hierarchy beside v1 in a hybrid layout) is used where it is writable, else v1's
freezer. Its name, ``mlenv-<pid namespace>-<supervisor pid>-<start ticks>``, tells whether its supervisor is alive:
the cgroup of a supervisor that is gone is ended and removed by the next supervisor started beside it, or by
``stop``. Only what a cgroup holds is ever signalled, each process checked to be in it through a pidfd.

A root supervisor in a mount namespace of its own whose fresh /sys shows no cgroup (``ip netns exec``: the local
backend's nodes) mounts cgroup v2 there first. Without a writable cgroup (an unprivileged pod) the job's
``MLENV_JOB`` marker finds what is left (a process started with ``env -i`` escapes it). Under Slurm the step's own
process tracking (proctrack) ends what a step leaves behind, and no cgroup is made.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

POLL_SECONDS = 0.1
KILL_WAIT_SECONDS = 5.0
"""After SIGKILL, how long the processes get to be gone (one in uninterruptible sleep may take a while)."""
FOREIGN_EMPTY_SECONDS = 300.0
"""An empty cgroup of a supervisor in another pid namespace is removed once it is this old."""
_NAME = re.compile(r"mlenv-(\d+)-(\d+)-(\d+)")


def marked_processes(marker: bytes, proc_root: str | Path = "/proc") -> list[int]:
    """Live processes (not this one) whose environment carries ``marker`` (``NAME=value``)."""
    found = []
    for entry in Path(proc_root).iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def start_ticks(pid: int, proc_root: str | Path = "/proc") -> int | None:
    """The start time of ``pid`` in clock ticks after boot; None when it is gone (a zombie is)."""
    try:
        text = Path(proc_root, str(pid), "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return None if fields[0] in "ZX" else int(fields[19])


def _pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def cgroup_name(pid: int, ticks: int) -> str:
    """The name of the cgroup of the supervisor ``pid`` started at ``ticks`` (in this pid namespace)."""
    return f"mlenv-{_pid_namespace()}-{pid}-{ticks}"


def owner_alive(name: str) -> bool:
    """Whether the supervisor a cgroup is named after still runs; True for one of another pid namespace (it
    cannot be told from here) and for a name not of this module."""
    match = _NAME.fullmatch(name)
    if match is None or int(match.group(1)) != _pid_namespace():
        return True
    return start_ticks(int(match.group(2))) == int(match.group(3))


@dataclass(frozen=True)
class Cgroup:
    """One cgroup directory of a v2 (``version`` 2) or v1 freezer (1) hierarchy; ``relative`` is its path as
    ``/proc/<pid>/cgroup`` shows it."""

    path: Path
    relative: str
    version: int

    def join(self) -> None:
        """Put the calling process in the cgroup: run in the launcher's child before exec (``preexec_fn``). A
        failure leaves it outside, which the caller sees (``holds``)."""
        with contextlib.suppress(OSError):
            fd = os.open(self.path / "cgroup.procs", os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def procs(self) -> list[int]:
        """Every process in the cgroup and the cgroups below it."""
        return procs_of(self.path)

    def holds(self, pid: int) -> bool:
        """Whether ``pid`` is in this cgroup (or one below it)."""
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return False
        for line in lines:
            number, controllers, path = line.split(":", 2)
            ours = number == "0" if self.version == 2 else "freezer" in controllers.split(",")
            if ours and (path == self.relative or path.startswith(self.relative + "/")):
                return True
        return False

    def signal(self, signum: int) -> None:
        """``signum`` to every process the cgroup holds, each checked to be in it after its pidfd was opened (so a
        reused pid is never signalled)."""
        for pid in self.procs():
            self._signal(pid, signum)

    def _signal(self, pid: int, signum: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        except OSError:
            fd = -1  # no pidfds (Linux < 5.3): the check narrows the race to a pid reused meanwhile
        try:
            if self.holds(pid):
                if fd >= 0:
                    signal.pidfd_send_signal(fd, signum)
                else:
                    os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass
        finally:
            if fd >= 0:
                os.close(fd)

    def kill(self) -> None:
        """SIGKILL to everything in it at once: ``cgroup.kill``, else frozen (nothing forks or exits meanwhile)."""
        if self.version == 2 and (self.path / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (self.path / "cgroup.kill").write_text("1")
            return
        freezer, frozen, thawed = (("cgroup.freeze", "1", "0") if self.version == 2
                                   else ("freezer.state", "FROZEN", "THAWED"))
        with contextlib.suppress(OSError):
            (self.path / freezer).write_text(frozen)
        try:
            self.signal(signal.SIGKILL)
        finally:
            with contextlib.suppress(OSError):
                (self.path / freezer).write_text(thawed)

    def end(self, grace: float, note: Callable[[str], None] | None = None) -> int:
        """End everything in the cgroup: SIGTERM, SIGKILL after ``grace`` seconds; how many processes it held."""
        seen = set(self.procs())
        if seen:
            self.signal(signal.SIGTERM)
            seen |= _wait(self, grace)
        if self.procs():
            self.kill()
            seen |= _wait(self, KILL_WAIT_SECONDS, then=self.kill)
        left = self.procs()
        if left and note is not None:
            note(f"{plural(len(left))} in cgroup {self.path} did not end after SIGKILL; the cgroup is kept")
        return len(seen)

    def remove(self) -> bool:
        """Remove the cgroup (and any below it); False while it still holds processes."""
        return remove_cgroup(self.path)


def procs_of(path: Path) -> list[int]:
    """Every process in the cgroup directory ``path`` and the cgroups below it."""
    found: list[int] = []
    for directory, _, _ in os.walk(path):
        with contextlib.suppress(OSError, ValueError):
            found += [int(line) for line in Path(directory, "cgroup.procs").read_text().split()]
    return found


def remove_cgroup(path: Path, settle: float = KILL_WAIT_SECONDS) -> bool:
    """Remove the cgroup directory ``path`` and those below it; False while one still holds processes. A cgroup
    whose processes were just killed lists none but stays busy until the kernel has released them (their parent's
    wait): that is retried for up to ``settle`` seconds."""
    deadline = time.monotonic() + settle
    while True:
        try:
            for directory, _, _ in os.walk(path, topdown=False):
                os.rmdir(directory)
            return True
        except FileNotFoundError:
            return True
        except OSError as error:
            if error.errno != errno.EBUSY or procs_of(path) or time.monotonic() >= deadline:
                return False
        time.sleep(POLL_SECONDS)


def recorded_cgroup(recorded: object, pid: int, ticks: int) -> Path | None:
    """The cgroup a supervisor recorded (state.json's ``cgroup``), when it is named after that supervisor
    (``pid`` started at ``ticks``): never another's."""
    if not isinstance(recorded, str) or Path(recorded).name != cgroup_name(pid, ticks):
        return None
    return Path(recorded)


def _wait(cgroup: Cgroup, seconds: float, then: Callable[[], None] | None = None) -> set[int]:
    """Up to ``seconds`` for the cgroup to be empty (``then`` again each time newcomers are there); every pid seen."""
    seen: set[int] = set()
    deadline = time.monotonic() + seconds
    while (now := cgroup.procs()) and time.monotonic() < deadline:
        seen |= set(now)
        if then is not None:
            then()
        time.sleep(POLL_SECONDS)
    return seen


@dataclass(frozen=True)
class _Mount:
    root: str  # the path inside the hierarchy that is mounted
    point: Path
    version: int


def _mounts(mountinfo: str) -> list[_Mount]:
    """The cgroup v2 mounts, then the v1 freezer mounts, of a ``/proc/self/mountinfo``."""
    found = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, kinds = left.split(), right.split()
        if len(fields) < 5 or len(kinds) < 3:
            continue
        version = 2 if kinds[0] == "cgroup2" else 1 if kinds[0] == "cgroup" and "freezer" in kinds[2].split(",") \
            else 0
        if version:
            found.append(_Mount(_unescape(fields[3]), Path(_unescape(fields[4])), version))
    return sorted(found, key=lambda mount: -mount.version)


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), text)


def _own(version: int, proc_cgroup: str) -> str | None:
    """This process's cgroup in the v2 hierarchy or v1's freezer hierarchy, from ``/proc/self/cgroup``."""
    for line in proc_cgroup.splitlines():
        number, controllers, path = line.split(":", 2)
        if (number == "0" and version == 2) or (version == 1 and "freezer" in controllers.split(",")):
            return path
    return None


def _where(mount: _Mount, own: str) -> tuple[Path, str] | None:
    """The directory of cgroup ``own`` under ``mount``, and ``own``; None when the mount does not show it."""
    root = mount.root.rstrip("/")
    if own != root and not own.startswith(root + "/"):
        return None
    return mount.point / own[len(root):].lstrip("/"), own.rstrip("/")


def make_cgroup(name: str) -> tuple[Cgroup | None, str]:
    """A new cgroup ``name`` below this process's own, on the first writable hierarchy (v2, else v1's freezer);
    else None and why there is none, in words."""
    try:
        found = hierarchies(Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text())
        if not found and _mount_private_cgroup2():
            found = hierarchies(Path("/proc/self/mountinfo").read_text(), Path("/proc/self/cgroup").read_text())
    except OSError as err:
        return None, f"cannot read this process's cgroups ({err.strerror})"
    why = "no cgroup v2 or v1 freezer hierarchy is mounted here"
    for own in found:
        cgroup = Cgroup(own.path / name, f"{own.relative.rstrip('/')}/{name}", own.version)
        try:
            cgroup.path.mkdir()
        except OSError as err:
            why = f"{own.path} is not writable ({err.strerror})"
            continue
        if own.version == 1 or any((cgroup.path / file).exists() for file in ("cgroup.kill", "cgroup.freeze")):
            return cgroup, ""
        cgroup.remove()
        why = f"{own.path} can neither kill nor freeze a cgroup (Linux before 5.2)"
    return None, why


def _mount_private_cgroup2(point: Path = Path("/sys/fs/cgroup"), netns: Path = Path("/run/netns")) -> bool:
    """Mount cgroup v2 at ``point`` where a root process sees no cgroup because ``ip netns exec`` started it (its
    network namespace is one of ``netns``'s): that gave it a mount namespace of its own, with a fresh /sys, whose
    mounts never reach the host's (``/`` made a slave). So its share gets a cgroup too (the local backend's nodes).
    Nothing is mounted as another user, outside such a namespace, or over anything."""
    try:
        own = os.stat("/proc/self/ns/net")
        named = any((entry.stat().st_dev, entry.stat().st_ino) == (own.st_dev, own.st_ino)
                    for entry in netns.iterdir())
        if os.geteuid() != 0 or not named or not point.is_dir() or point.is_mount() or any(point.iterdir()):
            return False
    except OSError:
        return False
    mounted = subprocess.run(["mount", "-t", "cgroup2", "cgroup2", str(point)], capture_output=True, check=False)
    return mounted.returncode == 0


def hierarchies(mountinfo: str, proc_cgroup: str) -> list[Cgroup]:
    """This process's own cgroup on each mounted hierarchy it can use, cgroup v2 first, then v1's freezer, from
    ``/proc/self/mountinfo`` and ``/proc/self/cgroup``."""
    found = []
    for mount in _mounts(mountinfo):
        own = _own(mount.version, proc_cgroup)
        where = _where(mount, own) if own is not None else None
        if where is not None:
            found.append(Cgroup(*where, mount.version))
    return found


def clean_stale(cgroup: Cgroup, note: Callable[[str], None]) -> None:
    """End and remove the cgroups beside ``cgroup`` that supervisors now gone left behind; remove the empty ones
    of supervisors in other pid namespaces (whose liveness cannot be told from here) made long enough ago that
    their launcher would be in them (rmdir fails on a cgroup that holds a process: nothing is killed)."""
    with contextlib.suppress(OSError):
        for entry in cgroup.path.parent.iterdir():
            match = _NAME.fullmatch(entry.name)
            if match and int(match.group(1)) != _pid_namespace() \
                    and time.time() - entry.stat().st_mtime > FOREIGN_EMPTY_SECONDS:
                remove_cgroup(entry, settle=0)
    for sibling in _siblings(cgroup):
        ended = sibling.end(0, note)
        removed = sibling.remove()
        if removed or ended:
            note(f"{'removed' if removed else 'kept'} cgroup {sibling.path} of a supervisor that is gone"
                 + (f" (ended {plural(ended)} left in it)" if ended else ""))


def _siblings(cgroup: Cgroup) -> Iterable[Cgroup]:
    with contextlib.suppress(OSError):
        for entry in cgroup.path.parent.iterdir():
            if entry != cgroup.path and _NAME.fullmatch(entry.name) and not owner_alive(entry.name):
                yield Cgroup(entry, f"{cgroup.relative.rsplit('/', 1)[0]}/{entry.name}", cgroup.version)


def end_marked(marker: bytes, grace: float) -> int:
    """Without a cgroup: SIGTERM, then SIGKILL after ``grace`` seconds, to the live processes carrying ``marker``;
    how many there were."""
    seen = set(marked_processes(marker))
    for signum, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT_SECONDS)):
        deadline = time.monotonic() + wait
        while (pids := marked_processes(marker)) and time.monotonic() < deadline:
            seen |= set(pids)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signum)
            time.sleep(POLL_SECONDS)
    return len(seen)


def plural(count: int) -> str:
    return f"{count} process{'' if count == 1 else 'es'}"


@dataclass
class Reaper:
    """A supervisor's means to end what its share leaves behind: its cgroup, or (None) the job's marker."""

    cgroup: Cgroup | None

    @classmethod
    def start(cls, environ: Mapping[str, str], note: Callable[[str], None]) -> Reaper:
        """Before the launcher starts: this supervisor's cgroup, the stale ones beside it removed; under Slurm or
        without a writable cgroup none (the latter said once, in ``note``)."""
        if environ.get("SLURM_JOB_ID"):
            return cls(None)  # the step's proctrack ends what it leaves behind; its cgroups are slurmstepd's
        cgroup, why = make_cgroup(cgroup_name(os.getpid(), start_ticks(os.getpid()) or 0))
        if cgroup is None:
            note(f"no writable cgroup here ({why}): what the ranks leave behind is found by its MLENV_JOB variable "
                 "only (a process started with env -i is missed)")
        else:
            clean_stale(cgroup, note)
        return cls(cgroup)

    def preexec(self) -> Callable[[], None] | None:
        """What the launcher's child runs before exec: it joins the cgroup (None without one)."""
        return None if self.cgroup is None else self.cgroup.join

    def started(self, pid: int, running: bool, note: Callable[[str], None]) -> None:
        """The launcher ``pid`` started: without the cgroup (it could not join it), the marker it is."""
        if self.cgroup is not None and running and not self.cgroup.holds(pid):
            note(f"the launcher could not join cgroup {self.cgroup.path}: what the ranks leave behind is found by its "
                 "MLENV_JOB variable only (a process started with env -i is missed)")
            self.cgroup.remove()
            self.cgroup = None

    def end(self, marker: bytes, grace: float, note: Callable[[str], None]) -> None:
        """After the share ended: end what is left of it (SIGTERM, SIGKILL after ``grace``), say how many, remove
        the cgroup."""
        ended = end_marked(marker, grace) if self.cgroup is None else self.cgroup.end(grace, note)
        if ended:
            note(f"ended {plural(ended)} the ranks left behind")
        self.close()

    def close(self) -> None:
        """Remove the cgroup (kept while something in it would not die)."""
        if self.cgroup is not None and self.cgroup.remove():
            self.cgroup = None

    def __enter__(self) -> Reaper:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
