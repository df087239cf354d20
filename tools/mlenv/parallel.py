"""Run one local command per node at once and stream every line as it arrives, prefixed ``[node-N]``; fail-fast
and Ctrl-C stop every command (its whole process group). A rank's line that its node's supervisor updates in place
(a progress bar: ``\\r`` and the rank's tag again before each state) shows its latest state on stdout before it ends,
and only its last state once it has. Knows nothing of backends."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlenv.errors import OperationError
from mlenv.runtime.launchers import STOPPING, TEARDOWN

STOP_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL when stopping a command."""
READER_GRACE = 2.0
"""Seconds to wait, after the commands ended, for the rest of their output."""

LineHandler = Callable[[int, str], None]


WARNING = re.compile(r"^(?:\[node-\d+(?: r\d+)?\] )?(?:\[?[WE]\d{4} [\d:.]+(?: +\d+)? (?P<where>[^\]]+)\] ?"
                     r"(?P<said>.*)|(?P<python>\S+:\d+: \w*Warning: .*))$")
"""A warning as torch (glog: ``[W1127 20:05:04.798 20756 socket.cpp:752] [c10d] ...``, the process id not always
there) or Python writes it, in a node's tag or none: what it says, without the tag, time and process id, is the
same in every process."""


def node_line(ordinal: int, line: str) -> str:
    """``[node-N] line``; a line the node's runtime tagged already (``[node-N rR]`` a rank's, ``[node-N]`` its
    launcher's) as it is."""
    return line if line.startswith((f"[node-{ordinal} r", f"[node-{ordinal}] ")) else f"[node-{ordinal}] {line}"


def warning_said(line: str) -> str | None:
    """What the warning ``line`` says (the same in every rank and on every node), or None for any other line."""
    match = WARNING.match(line)
    if match is None:
        return None
    return match["python"] or f"{match['where'].split(':')[0]} {match['said']}"


TRACEBACK = "Traceback (most recent call last):"


@dataclass
class Teardown:
    """Keeps what a launcher says as its node's supervisor stops it off the terminal: once a node said that it
    stops its launcher (launchers.STOPPING), a traceback of that launcher (its ``[node-N]`` lines) is held back
    until its last line, and shown only when that is not torchrun's for the signal (launchers.TEARDOWN). A rank's
    lines, mlenv's and any other traceback are shown."""

    stopping: set[int] = field(default_factory=set)
    held: dict[int, list[str]] = field(default_factory=dict)  # node -> the traceback held back so far

    def shown(self, ordinal: int, line: str) -> list[str]:
        """The lines of node ``ordinal`` to show now that it said ``line``."""
        tag = f"[node-{ordinal}] "
        if line.startswith(STOPPING):
            self.stopping.add(ordinal)
            return []
        if ordinal not in self.stopping or not line.startswith(tag):
            return [line]
        text, held = line[len(tag):], self.held.get(ordinal)
        if held is None:
            if text != TRACEBACK:
                return [line]
            self.held[ordinal] = [line]
            return []
        held.append(line)
        if text[:1].isspace():  # a frame: the traceback goes on
            return []
        del self.held[ordinal]
        return [] if TEARDOWN.match(text) else held

    def rest(self, ordinal: int) -> list[str]:
        """What is still held back of node ``ordinal`` once it has ended (a traceback cut short): shown."""
        return self.held.pop(ordinal, [])


@dataclass(frozen=True)
class FanoutResult:
    """Exit code per node (negative: ended by that signal), the node that failed first, if any, and the
    nodes that were stopped before they ended on their own."""

    exit_codes: Mapping[int, int]
    first_failure: int | None
    stopped: frozenset[int] = frozenset()
    interrupted: bool = False

    @property
    def exit_code(self) -> int:
        """0 when every node succeeded, 130 after Ctrl-C, else the first failing node's code (at least 1)."""
        if self.interrupted:
            return 130
        if self.first_failure is None:
            return 0
        code = self.exit_codes[self.first_failure]
        return code if code > 0 else 1


class _Node:
    """One running command and the thread that streams its output."""

    def __init__(self, ordinal: int, argv: Sequence[str], keep_stdin: bool, preamble: bytes,
                 emit: LineHandler, show: LineHandler) -> None:
        self.ordinal = ordinal
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE if keep_stdin or preamble else subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        if preamble and self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.write(preamble)
                self.process.stdin.flush()
            if not keep_stdin:
                self.process.stdin.close()
        self.reader = threading.Thread(target=self._pump, args=(emit, show), daemon=True)
        self.reader.start()

    def _pump(self, emit: LineHandler, show: LineHandler) -> None:
        """Every whole line to ``emit``; the latest state of an unfinished line updated in place to ``show``."""
        stdout = self.process.stdout
        if stdout is None:
            return
        pending, carriage = bytearray(), -1  # the unfinished line, and where its last \r is
        for chunk in iter(lambda: os.read(stdout.fileno(), 1 << 16), b""):
            start = len(pending)
            pending += chunk
            if pending.find(b"\n", start) >= 0:
                *lines, rest = bytes(pending).split(b"\n")
                for raw in lines:
                    emit(self.ordinal, raw.decode(errors="replace").rstrip("\r"))
                pending, start, carriage = bytearray(rest), 0, -1
            found = pending.rfind(b"\r", start)
            carriage = found if found >= 0 else carriage
            if carriage >= 0:
                show(self.ordinal, pending[carriage + 1:].decode(errors="replace"))
        if pending:
            emit(self.ordinal, pending.decode(errors="replace").rstrip("\r"))

    def signal_group(self, sig: signal.Signals) -> None:
        """Signal the command's process group (the local exec process and everything it started)."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()  # remote commands that watch their stdin stop too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)


def _stop(nodes: Sequence[_Node]) -> set[int]:
    """SIGTERM every node's group, SIGKILL what is left after STOP_GRACE seconds; returns the nodes that
    were still running."""
    running = {n.ordinal for n in nodes if n.process.poll() is None}
    for node in nodes:
        node.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE
    while time.monotonic() < deadline and any(n.process.poll() is None for n in nodes):
        time.sleep(0.05)
    for node in nodes:
        node.signal_group(signal.SIGKILL)
        node.process.wait()
    return running


def _first(line: str, warned: set[str] | None) -> bool:
    """Whether ``line`` is to be shown: not a warning already in ``warned`` (None: every line is), which it joins."""
    said = None if warned is None else warning_said(line)
    if warned is None or said is None:
        return True
    if said in warned:
        return False
    warned.add(said)
    return True


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupted_by_sigterm() -> Iterator[None]:
    """SIGTERM (a killed session, a CI timeout) stops what runs as Ctrl-C does (main thread only), unless the caller
    handles SIGTERM itself (a handler of its own: ``mlenv drill`` thaws its fault first)."""
    if threading.current_thread() is not threading.main_thread() or callable(signal.getsignal(signal.SIGTERM)):
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_parallel(commands: Mapping[int, Sequence[str]], *, fail_fast: bool = False,
                 logs: Mapping[int, Path] | None = None, on_line: LineHandler | None = None,
                 keep_stdin: bool = False, stdin: bytes = b"", echo: bool = True,
                 warnings_once: bool = False) -> FanoutResult:
    """Run ``commands`` (ordinal -> local argv) concurrently, printing each line as ``[node-N] line`` (unless
    ``echo`` is off) and appending it to ``logs[N]``. ``stdin`` is written first to every command; with
    ``keep_stdin`` their stdin then stays open until they end (remote commands that watch it stop when it
    closes). With ``fail_fast`` the first non-zero exit stops the rest. Ctrl-C (or SIGTERM) stops everything
    and is reported as ``interrupted``; a closed stdout stops everything too, and raises BrokenPipeError. What a
    command says once it is being stopped (a launcher's teardown traceback) goes to its log only, as does
    torchrun's traceback for the signal once its node's supervisor stops it (``Teardown``); with ``warnings_once``
    a warning every process repeats (``warning_said``) is shown the first time only."""
    lock = threading.Lock()
    files = {n: path.open("a", encoding="utf-8") for n, path in (logs or {}).items()}
    shown: int | None = None  # the node whose unfinished line stdout shows
    hushed: set[int] = set()  # the nodes being stopped: their lines go to their logs only
    warned: set[str] = set()  # the warnings shown (warnings_once)
    teardown = Teardown()  # what launchers say as they are stopped: not shown
    closed = threading.Event()  # stdout's reader has gone (``mlenv logs | head -1``): everything stops

    def write(text: str) -> None:
        """``text`` on stdout at once, unless its reader has gone."""
        if closed.is_set():
            return
        try:
            sys.stdout.write(text)
            sys.stdout.flush()
        except BrokenPipeError:
            closed.set()

    def display(ordinal: int, line: str) -> None:
        """``line`` on stdout, unless the node is hushed or it is a warning said before."""
        nonlocal shown
        if echo and ordinal not in hushed and _first(line, warned if warnings_once else None):
            last = line[line.rfind("\r") + 1:]  # a line updated in place: its last state, tagged
            if last != line and last.startswith(f"[node-{ordinal} r"):
                write(("\r" if shown == ordinal else "\n" if shown is not None else "") + last + "\n")
            else:
                write(("\n" if shown is not None else "") + node_line(ordinal, line) + "\n")
            shown = None

    def emit(ordinal: int, line: str) -> None:
        with lock:
            for each in teardown.shown(ordinal, line):
                display(ordinal, each)
            if ordinal in files:
                files[ordinal].write(line + "\n")
                files[ordinal].flush()
            if on_line is not None:
                on_line(ordinal, line)

    def show(ordinal: int, state: str) -> None:
        """The latest state of a rank's line that its node updates in place, before the line ends."""
        nonlocal shown
        if echo and ordinal not in hushed and state.startswith(f"[node-{ordinal} r"):
            with lock:
                write(("\r" if shown == ordinal else "\n" if shown is not None else "") + state)
                shown = ordinal

    nodes: list[_Node] = []
    codes: dict[int, int] = {}
    first_failure: int | None = None
    stopped: set[int] = set()
    try:
        with interrupted_by_sigterm():
            for ordinal, argv in commands.items():
                try:
                    nodes.append(_Node(ordinal, argv, keep_stdin, stdin, emit, show))
                except OSError as exc:
                    _stop(nodes)
                    raise OperationError(f"cannot run {argv[0]} for node-{ordinal}: {exc.strerror}") from None
            while len(codes) < len(nodes) and not closed.is_set():
                for node in nodes:
                    code = node.process.poll()
                    if code is None or node.ordinal in codes:
                        continue
                    codes[node.ordinal] = code
                    if code != 0 and first_failure is None:
                        first_failure = node.ordinal
                        if fail_fast:
                            hushed.update(n.ordinal for n in nodes if n.process.poll() is None)
                            stopped = _stop(nodes)
                time.sleep(0.05)
        if closed.is_set():
            stopped = _stop(nodes)
        interrupted = False
    except KeyboardInterrupt:
        hushed.update(n.ordinal for n in nodes)
        stopped = _stop(nodes)
        interrupted = True
    finally:
        deadline = time.monotonic() + READER_GRACE
        for node in nodes:  # output still buffered in the pipes; orphans that keep a pipe open are not awaited
            node.reader.join(timeout=max(0.0, deadline - time.monotonic()))
        with lock:
            for node in nodes:
                for line in teardown.rest(node.ordinal):
                    display(node.ordinal, line)
        for handle in files.values():
            handle.close()
    if closed.is_set():
        raise BrokenPipeError(errno.EPIPE, "stdout's reader has gone")  # the CLI ends quietly (cli._Commands)
    codes.update({n.ordinal: n.process.returncode for n in nodes if n.ordinal not in codes})
    return FanoutResult(codes, first_failure, frozenset(stopped), interrupted)
