"""The Python stack of every rank of this node, at once: ``py-spy dump`` where it can attach (ptrace), else the
standard library's ``faulthandler``, which the runtime arms in every rank it starts (``site/sitecustomize.py``) on
two real-time signals nobody else uses: one dumps the thread that handles it alone, and is sent to the rank's main
thread itself (``tgkill``), so the dump is the main thread's however many threads the rank runs; the other dumps
every thread (at most 100, newest first: the main thread, the oldest, is left out of a larger process's), used where
the first cannot be sent. A signal is sent only to a process that catches it (``SigCgt`` in ``/proc/PID/status``):
any other would die of it. Each rank writes its own file in the run directory. The rank's stack is its main
thread's, never another's: a dump without it is an error that says so.

Frames run outermost first. Ranks with the same stack are grouped, the odd ones out first.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..node.readfs import read_text
from ..records.jsonvalue import JsonObject

STACK_SIGNAL = signal.SIGRTMIN + 6
"""The real-time signal faulthandler dumps every thread on (not USR1/USR2: training code and Slurm use those)."""
STACK_SIGNAL_NAME = "SIGRTMIN+6"
MAIN_STACK_SIGNAL = signal.SIGRTMIN + 7
"""The real-time signal faulthandler dumps the thread that handles it on, alone: sent to the main thread."""
MAX_DUMPED_THREADS = 100
"""How many threads faulthandler dumps at most (CPython's ``MAX_NTHREADS``)."""
FAULTHANDLER_DIR = "MLENV_FAULTHANDLER_DIR"
"""Set by the launcher for the whole job: where the ranks' faulthandler files go."""
FAULTHANDLER_FILE = "MLENV_FAULTHANDLER_FILE"
"""Set by the rank wrapper for the user's process only: its own file, ``rank<N>.txt``."""
METHODS = ("auto", "py-spy", "faulthandler")
PY_SPY_TIMEOUT = 20.0
DUMP_WAIT_SECONDS = 10.0
_FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+) \(most recent call first\):$")
_ALONE = "Stack (most recent call first):"
"""The header of a dump of the handling thread alone (MAIN_STACK_SIGNAL's, handled by the main thread)."""
_LIBRARY = ("site-packages", "dist-packages", "/lib/python3", "<frozen")


class StackError(Exception):
    """A stack that could not be taken, in one line."""


@dataclass(frozen=True)
class Frame:
    function: str
    file: str | None
    line: int | None


@dataclass(frozen=True)
class RankStack:
    """One rank's stack, or why there is none (``state`` ``exited`` when it ended while being sampled)."""

    rank: int
    local_rank: int
    node: int
    host: str
    pid: int
    native: bool
    frames: list[Frame] = field(default_factory=list)
    state: str = "running"
    method: str | None = None
    error: str | None = None

    def to_dict(self) -> JsonObject:
        return asdict(self)


def faulthandler_file(directory: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its faulthandler dumps."""
    return directory / f"rank{rank}.txt"


def alive(pid: int, proc_root: Path) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    stat = read_text(proc_root / str(pid) / "stat")
    return stat is not None and stat.rpartition(")")[2].split()[:1] != ["Z"]


def stopped(pid: int, proc_root: Path) -> bool:
    """Whether ``pid`` is stopped (state ``T``, or ``t`` traced) and so cannot run a signal handler."""
    stat = read_text(proc_root / str(pid) / "stat")
    return stat is not None and stat.rpartition(")")[2].split()[:1] in (["T"], ["t"])


def catches(pid: int, signum: int, proc_root: Path) -> bool:
    """Whether ``pid`` has a handler for ``signum`` (bit ``signum - 1`` of ``SigCgt`` in its status)."""
    return _signal_bit(pid, "SigCgt", signum, proc_root)


def _signal_bit(pid: int, mask: str, signum: int, proc_root: Path) -> bool:
    """Bit ``signum - 1`` of ``mask`` (SigCgt: caught by the process; SigBlk: blocked by its main thread)."""
    for line in (read_text(proc_root / str(pid) / "status") or "").splitlines():
        if line.startswith(f"{mask}:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def _to_main_thread(pid: int, signum: int) -> bool:
    """Send ``signum`` to ``pid``'s main thread itself (``tgkill``; its thread id is the pid), so that the handler
    runs there; False where the C library has no ``tgkill`` (glibc before 2.30), ProcessLookupError when it is gone."""
    try:
        tgkill = ctypes.CDLL(None, use_errno=True).tgkill
    except (AttributeError, OSError):
        return False
    if tgkill(pid, pid, signum) != 0:
        error = ctypes.get_errno()
        raise ProcessLookupError(pid) if error == errno.ESRCH else OSError(error, os.strerror(error))
    return True


def find_py_spy() -> str | None:
    """py-spy on PATH, else next to this Python (a virtual environment's bin/)."""
    return shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))


def parse_py_spy(text: str, pid: int, native: bool) -> list[Frame]:
    """The main thread's frames from ``py-spy dump --json``, outermost first (the thread whose id is the pid, else
    the one named MainThread, else the only one: never another); native frames (``--native``) have no source file or
    line."""
    threads = json.loads(text)
    if not isinstance(threads, list) or not threads:
        raise StackError("py-spy found no thread")
    main = next((t for t in threads if t.get("os_thread_id") == pid), None) \
        or next((t for t in threads if t.get("thread_name") == "MainThread"), None) \
        or (threads[0] if len(threads) == 1 else None)
    if main is None:
        raise StackError(f"py-spy did not say which of the process's {len(threads)} threads is its main thread")
    frames = []
    for frame in reversed(main.get("frames") or []):
        python = frame.get("module") is None
        if not python and not native:
            continue
        line = frame.get("line") or None
        frames.append(Frame(str(frame.get("name")), str(frame.get("filename")) if python else None,
                            int(line) if python and line else None))
    return frames


def py_spy_frames(pid: int, native: bool, py_spy: str) -> list[Frame]:
    """``py-spy dump --json --pid PID [--native]``; StackError with py-spy's own words when it cannot."""
    argv = [py_spy, "dump", "--json", "--pid", str(pid), *(["--native"] if native else [])]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PY_SPY_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise StackError(f"py-spy gave no answer within {PY_SPY_TIMEOUT:g}s") from None
    if done.returncode != 0:
        said = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        raise StackError(f"py-spy: {said[0] if said else f'exit status {done.returncode}'}")
    try:
        return parse_py_spy(done.stdout, pid, native)
    except (ValueError, TypeError, AttributeError) as exc:
        raise StackError(f"py-spy: unreadable answer ({exc})") from None


def parse_faulthandler(text: str) -> list[Frame]:
    """The main thread's frames of the last dump in a rank's faulthandler file, outermost first: a dump of the main
    thread alone (``Stack ...``: MAIN_STACK_SIGNAL, which only the main thread is sent), else the main thread's part
    of a dump of every thread, found by the id on the ``mlenv: pid P main thread 0x...`` line the file starts with
    (written when the rank armed it). StackError when the dump lacks the main thread: never another thread's."""
    main = re.search(r"main thread (0x[0-9a-f]+)", text)
    threads: dict[str, list[Frame]] = {}
    current: list[Frame] | None = None
    last = ""  # the dump read last: the main thread alone, or every thread
    for line in text.splitlines():
        if line == _ALONE:
            current, last = threads.setdefault(_ALONE, []), _ALONE
            current.clear()  # a later dump replaces the earlier one
        elif (thread := _THREAD.match(line)) is not None:
            current, last = threads.setdefault(thread[1], []), "threads"
            current.clear()
        elif line == "..." and last == "threads":
            threads["..."] = []  # faulthandler stopped at MAX_DUMPED_THREADS
        elif current is not None and (frame := _FRAME.match(line)) is not None:
            current.append(Frame(frame[3], frame[1], int(frame[2])))
    if not threads:
        raise StackError("the rank's faulthandler file holds no dump")
    if last == _ALONE:
        return list(reversed(threads[_ALONE]))
    if main is None:
        raise StackError("the rank's faulthandler file does not name its main thread")
    if main[1] not in threads:
        shown = len([key for key in threads if key.startswith("0x")])
        cut = f"; faulthandler dumps at most {MAX_DUMPED_THREADS}, the newest first" if "..." in threads else ""
        raise StackError(f"the main thread ({main[1]}) is not in faulthandler's dump ({shown} threads shown{cut})")
    return list(reversed(threads[main[1]]))


def faulthandler_frames(pid: int, dump: Path, proc_root: Path, wait: float = DUMP_WAIT_SECONDS) -> list[Frame]:
    """Have ``pid``'s faulthandler dump its main thread (MAIN_STACK_SIGNAL to that thread; else STACK_SIGNAL, every
    thread; a signal only when it catches it) and read what it wrote to ``dump``."""
    if not catches(pid, STACK_SIGNAL, proc_root):
        raise StackError(f"pid {pid} does not catch {STACK_SIGNAL_NAME}: faulthandler is not armed in it")
    before = dump.stat().st_size if dump.exists() else 0
    alone = catches(pid, MAIN_STACK_SIGNAL, proc_root) and not _signal_bit(pid, "SigBlk", MAIN_STACK_SIGNAL, proc_root)
    if not (alone and _to_main_thread(pid, MAIN_STACK_SIGNAL)):
        os.kill(pid, STACK_SIGNAL)
    deadline = time.monotonic() + wait
    size = before
    while time.monotonic() < deadline:
        now = dump.stat().st_size if dump.exists() else 0
        if now > before and now == size:  # it grew, and has stopped growing: the dump is complete
            with dump.open("rb") as handle:
                head = handle.read(200).decode(errors="replace").splitlines()[:1]
                handle.seek(before)
                return parse_faulthandler("\n".join([*head, handle.read().decode(errors="replace")]))
        if not alive(pid, proc_root):
            raise ProcessLookupError(pid)
        size = now
        time.sleep(0.1)
    raise StackError(f"pid {pid} wrote no faulthandler dump to {dump} within {wait:g}s")


def sample_rank(rank: Mapping[str, object], *, native: bool, method: str, dumps: Path | None,
                proc_root: Path = Path("/proc")) -> RankStack:
    """The stack of one rank (a RankRecord's fields) by ``method``: ``auto`` tries py-spy, then faulthandler."""
    pid = int(str(rank["pid"]))
    base = RankStack(int(str(rank["rank"])), int(str(rank["local_rank"])), int(str(rank["node"])),
                     str(rank["host"]), pid, native)
    if stopped(pid, proc_root):  # SIGSTOP, or a debugger: neither py-spy nor faulthandler would answer
        return RankStack(**{**asdict(base), "error": "the process is stopped (SIGSTOP, or a debugger holds it): "
                                                     "no stack to take"})
    errors = []
    py_spy = find_py_spy() if method in ("auto", "py-spy") else None
    if method in ("auto", "py-spy"):
        if py_spy is None:
            errors.append("py-spy is not installed (pip install py-spy==0.4.3)")
        else:
            try:
                return RankStack(**{**asdict(base), "frames": py_spy_frames(pid, native, py_spy), "method": "py-spy"})
            except StackError as err:
                errors.append(str(err))
    if method in ("auto", "faulthandler") and alive(pid, proc_root):
        if dumps is None:
            errors.append("no faulthandler directory for this run")
        else:
            try:
                frames = faulthandler_frames(pid, faulthandler_file(dumps, base.rank), proc_root)
                return RankStack(**{**asdict(base), "native": False, "frames": frames, "method": "faulthandler"})
            except ProcessLookupError:
                pass
            except (StackError, OSError) as err:
                errors.append(str(err))
    if not alive(pid, proc_root):
        return RankStack(**{**asdict(base), "state": "exited"})
    return RankStack(**{**asdict(base), "error": "; ".join(errors) or "no way to take the stack"})


def sample(ranks: Sequence[Mapping[str, object]], *, native: bool = False, method: str = "auto",
           dumps: Path | None = None, proc_root: Path = Path("/proc"),
           workspace: Path | None = None) -> list[RankStack]:
    """Every rank's stack, all at once, by global rank; files under ``workspace`` named relative to it (the same
    script is the same file on every node, wherever the node keeps its workspace)."""
    if not ranks:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(ranks))) as pool:
        found = list(pool.map(lambda r: sample_rank(r, native=native, method=method, dumps=dumps,
                                                    proc_root=proc_root), ranks))
    if workspace is not None:
        found = [replace(stack, frames=[replace(frame, file=_relative(frame.file, workspace))
                                        for frame in stack.frames]) for stack in found]
    return sorted(found, key=lambda stack: stack.rank)


def _relative(file: str | None, workspace: Path) -> str | None:
    if file is None or not os.path.isabs(file):
        return file
    try:
        return str(Path(file).relative_to(workspace.resolve()))
    except ValueError:
        return file


def _key(stack: Mapping[str, object]) -> str:
    if stack.get("state") == "exited":
        return "exited"
    if stack.get("error"):
        return f"error: {stack['error']}"
    return json.dumps(stack.get("frames"))


def group(stacks: Iterable[Mapping[str, object]]) -> list[dict[str, object]]:
    """Ranks with identical stacks together, ``{"ranks", "frames"}`` (plus ``state``/``error`` when they have no
    stack); the odd ones out (smallest groups) first."""
    groups: dict[str, list[Mapping[str, object]]] = {}
    for stack in stacks:
        groups.setdefault(_key(stack), []).append(stack)
    ordered = sorted(groups.values(), key=lambda members: (len(members), min(_rank(m) for m in members)))
    result = []
    for members in ordered:
        first = members[0]
        entry: dict[str, object] = {"ranks": sorted(_rank(m) for m in members), "frames": first.get("frames") or [],
                                    "nodes": sorted({_node(m) for m in members})}
        if first.get("state") == "exited":
            entry["state"] = "exited"
        elif first.get("error"):
            entry["error"] = first["error"]
        result.append(entry)
    return result


def _rank(stack: Mapping[str, object]) -> int:
    return int(str(stack["rank"]))


def _node(stack: Mapping[str, object]) -> int:
    return int(str(stack["node"]))


def ranges(numbers: Sequence[int]) -> str:
    """``0-2,4-7``."""
    spans: list[list[int]] = []
    for number in sorted(numbers):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _own(frame: Mapping[str, object]) -> bool:
    """A frame of the user's own code (not the standard library's or an installed package's)."""
    file = frame.get("file")
    return isinstance(file, str) and not any(part in file for part in _LIBRARY) and "/mlenv/runtime/" not in file


def summary(frames: Sequence[Mapping[str, object]]) -> str:
    """``train.py:88 step → all_reduce``: the innermost frame of the user's code, then the innermost function."""
    if not frames:
        return "no Python frame"
    own = [frame for frame in frames if _own(frame)]
    anchor = own[-1] if own else frames[-1]
    where = f"{os.path.basename(str(anchor['file']))}:{anchor['line']} " if anchor.get("file") else ""
    text = f"{where}{anchor['function']}"
    python = [frame for frame in frames if frame.get("file")]  # native frames (--native) have no file
    innermost = python[-1] if python else frames[-1]
    return text if innermost is anchor else f"{text} → {innermost['function']}"


def render(groups: Sequence[Mapping[str, object]]) -> str:
    """One line per group, the odd ones out first, each followed by its frames (outermost first)."""
    lines = []
    for entry in groups:
        numbers = [int(n) for n in entry["ranks"]]  # type: ignore[attr-defined]
        nodes = ", ".join(f"node-{n}" for n in entry["nodes"])  # type: ignore[attr-defined]
        head = f"{'rank' if len(numbers) == 1 else 'ranks'} {ranges(numbers)} ({nodes}): "
        frames = list(entry.get("frames") or [])  # type: ignore[call-overload]
        if entry.get("state") == "exited":
            lines.append(head + "exited while being sampled")
            continue
        if entry.get("error"):
            lines.append(head + f"no stack: {entry['error']}")
            continue
        lines.append(head + summary(frames))
        lines += [f"    {frame['function']} ({frame['file'] or '?'}:{frame['line'] or '?'})" for frame in frames]
    return "\n".join(lines)
