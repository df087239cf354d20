"""The node supervisor: runs the launcher (torchrun, DeepSpeed), whose workers are ``mlenv.runtime.rank`` wrappers,
and knows every rank of this node by its global rank, pid, exit code and signal.

Each rank's output comes through a connection of its own (a unix socket), so lines are whole: they are tagged
``[node-R rN]`` and go to stdout, output.log and the container log, and to the observers. A line a rank updates in
place with ``\\r`` (a progress bar: tqdm writes no newline until its loop ends) is shown on stdout in its latest state,
each state tagged again after its ``\\r``; in the logs and to the observers each finished state is a whole line of
its own. Any bytes from a rank are output (its ``last_output_at``, ``Observer.output``), a whole line or not. The
first rank of the job to fail is named; the job stops on every node (control channel); the node exits with that
rank's own code.
What the ranks leave behind ends with the node's share (reaping.py: the share's cgroup). All work happens in one
thread, around one selector.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from ..node.oom import kernel_killed, oom_kills
from ..rank import SOCKET_VARIABLE, signal_name
from ..records.runlayout import (
    FAILED,
    RUNNING,
    STOPPED,
    SUCCEEDED,
    USER_STOPS,
    FirstFailure,
    NodeDir,
    NodeFault,
    RankRecord,
    write_json,
)
from ..watch.protocol import Observer, RankInfo
from .control import SECRET_VARIABLE, ControlChannel, secret_of
from .reaping import Reaper, marked_processes

STOP_GRACE = 3.0
"""Seconds between the launcher's SIGTERM and SIGKILL for everything of the job, when it must stop (less than
mlenv's own grace for the node's command, so that the supervisor ends its job before it is killed itself)."""
DRAIN_SECONDS = 2.0
"""After the launcher ended, how long output still held open by a rank's leftover children is read."""
MAX_LINE = 16 << 20
"""A longer line (or state of a line updated with ``\\r``) is cut there (and goes on as a new line)."""
_ENDS = re.compile(rb"[\r\n]")
TAIL_LINES = 10
TAIL_WIDTH = 300
TICK = 0.2
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
JOB_VARIABLE = "MLENV_JOB"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@contextlib.contextmanager
def handling_user_signals(handler: Callable[[int, object], None]) -> Iterator[None]:
    """``handler`` for SIGINT/SIGTERM/SIGHUP (a user's stop) while the block runs; the previous handlers after."""
    previous = {sig: signal.signal(sig, handler) for sig in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler_before in previous.items():
            signal.signal(sig, handler_before)


@dataclass
class Sinks:
    """Where lines go besides the observers: stdout, the node log and the container log. On stdout one line updated
    in place (``\\r``) may be left open, showing its latest state; anything else written there ends it first."""

    files: list[IO[bytes]]
    open_line: str | None = None  # the tag of the line left open on stdout
    shown: str = ""  # what it shows

    def write(self, line: str, note: bool = False) -> None:
        """One line to stdout (a note: stderr) and every file."""
        self.end()
        data = (line + "\n").encode(errors="replace")
        for sink in [sys.stderr.buffer if note else sys.stdout.buffer, *self.files]:
            _put(sink, data)

    def log(self, line: str) -> None:
        """One line to every file, not to stdout."""
        data = (line + "\n").encode(errors="replace")
        for sink in self.files:
            _put(sink, data)

    def show(self, tag: str, line: str) -> None:
        """``line``, the latest state of ``tag``'s line, on stdout, in place of the state shown before (``\\r``)."""
        if self.open_line == tag and self.shown == line:
            return
        again = self.open_line == tag
        if not again:
            self.end()
        _put(sys.stdout.buffer, ("\r" if again else "").encode() + line.encode(errors="replace"))
        self.open_line, self.shown = tag, line

    def end(self, tag: str | None = None) -> None:
        """End the line left open on stdout (only ``tag``'s, when given): it keeps its last state."""
        if self.open_line is not None and tag in (None, self.open_line):
            _put(sys.stdout.buffer, b"\n")
            self.open_line, self.shown = None, ""


def _put(sink: IO[bytes], data: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        sink.write(data)
        sink.flush()


@dataclass
class _Rank:
    info: RankInfo
    record: RankRecord
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    updating: bool = False  # the tail's last line is a state of the line the rank updates in place


@dataclass
class _Connection:
    sock: socket.socket
    buffer: bytearray = field(default_factory=bytearray)
    kind: str | None = None
    rank: int | None = None


@dataclass
class Supervisor:
    """One node's share of a job. ``run`` it; it returns the node's exit status."""

    argv: Sequence[str]
    env: dict[str, str]
    node: int
    num_nodes: int
    host: str
    node_dir: NodeDir
    observers: Sequence[Observer]
    sinks: Sinks
    control_address: tuple[str, int] | None = None
    grace: float = STOP_GRACE

    ranks_by_number: dict[int, _Rank] = field(default_factory=dict)
    selector: selectors.BaseSelector = field(default_factory=selectors.DefaultSelector)
    process: subprocess.Popen[bytes] | None = None
    stop_reason: str | None = None
    stop_code: int | None = None
    kill_at: float | None = None
    user_signal: int | None = None  # the user stopped the job: with this signal here, or on another node
    user_stop_told: bool = False  # the other nodes were told of the user's stop here
    first_failure: FirstFailure | None = None
    local_failure: FirstFailure | None = None
    channel: ControlChannel | None = None
    extra_state: dict[str, object] = field(default_factory=dict)
    current_state: str = RUNNING  # as state.json has it
    oom_before: int | None = None
    marker: bytes = b""  # MLENV_JOB=...: in the environment of every process of the job
    written_ranks: list[dict[str, Any]] | None = None
    run_dir: Path = field(init=False)  # JobControl: this node's attempt directory

    def __post_init__(self) -> None:
        self.run_dir = self.node_dir.path


    # JobControl -------------------------------------------------------------------------------------------------
    def ranks(self) -> list[RankInfo]:
        return [self.ranks_by_number[number].info for number in sorted(self.ranks_by_number)]

    def note(self, message: str) -> None:
        self.sinks.write(f"mlenv: {message}", note=True)

    def set_state(self, state: str, **fields: object) -> None:
        self.extra_state.update(fields)
        self._write_state(state, str(self.extra_state.get("reason") or ""))

    def record(self, **fields: object) -> None:
        self.set_state(self.current_state, **fields)

    @property
    def hub(self) -> bool:
        return self.node == 0 or self.channel is None or not self.channel.connected

    def tell_hub(self, message: dict[str, Any]) -> None:
        if self.hub or self.channel is None:
            self._observer_message(message)
        else:
            self.channel.relay(message)

    def tell_all(self, message: dict[str, Any]) -> None:
        if self.channel is not None and self.node == 0:
            self.channel.relay(message)
        self._observer_message(message)

    def _observer_message(self, message: dict[str, Any]) -> None:
        for observer in self.observers:
            observer.message(message)

    def stop(self, reason: str, exit_code: int) -> None:
        if self.channel is not None:
            self.channel.stop(reason, exit_code)
        else:
            self._stop_here(reason, exit_code, None)

    # the job ----------------------------------------------------------------------------------------------------
    def run(self) -> int:
        """Start the launcher, serve the ranks until everything has ended, return the node's exit status."""
        self.node_dir.path.mkdir(parents=True, exist_ok=True)
        self.oom_before = oom_kills()
        with Reaper.start(self.env, self.note) as reaper, tempfile.TemporaryDirectory(prefix="mlenv-") as sockets, \
                self._signals():
            self.extra_state["cgroup"] = str(reaper.cgroup.path) if reaper.cgroup else None
            path = str(Path(sockets, "ranks"))
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(path)
            server.listen(256)
            server.setblocking(False)
            self.selector.register(server, selectors.EVENT_READ, lambda: self._accept(server))
            self._open_channel()
            self._write_ranks()
            self._write_state(RUNNING, "")
            for observer in self.observers:
                observer.started(self)
            env = {name: value for name, value in self.env.items() if name != SECRET_VARIABLE}  # not the ranks'
            env[SOCKET_VARIABLE] = path
            env.setdefault(JOB_VARIABLE, f"supervisor-{os.getpid()}-{time.time_ns()}")
            self.marker = f"{JOB_VARIABLE}={env[JOB_VARIABLE]}".encode()
            ours, theirs = socket.socketpair()
            # its own session: our signals reach it once, through us (torchrun puts each worker in its own)
            with theirs:
                self.process = subprocess.Popen(list(self.argv), env=env, stdout=theirs.fileno(),
                                                stderr=theirs.fileno(), start_new_session=True,
                                                preexec_fn=reaper.preexec())  # into the cgroup: only os calls
            reaper.started(self.process.pid, self.process.poll() is None, self.note)
            ours.setblocking(False)
            self.selector.register(ours, selectors.EVENT_READ, _Reader(self, _Connection(ours, kind="launcher")))
            status = self._serve(self.process)
            server.close()
            reaper.end(self.marker, self.grace, self.note)
        return self._finish(status)

    def _serve(self, process: subprocess.Popen[bytes]) -> int:
        next_tick = time.monotonic()
        ended_at: float | None = None
        status = 0
        while True:
            for key, _ in self.selector.select(TICK):
                key.data()
            now = time.monotonic()
            if self.channel is not None:
                if self.user_signal is not None and not self.user_stop_told:  # stop every node, as the user's
                    self.user_stop_told = True
                    self.channel.stop(f"stopped by {signal_name(self.user_signal)}", 128 + self.user_signal)
                self.channel.tick()
            if now >= next_tick:
                next_tick = now + 1.0
                self._write_ranks()
                for observer in self.observers:
                    observer.tick(now)
            if self.kill_at is not None and now >= self.kill_at:
                self.kill_at = None
                self._kill(signal.SIGKILL)
            if ended_at is None and (code := process.poll()) is not None:
                self._dispatch_ready()  # the ranks' last words, sent before torchrun could see them end
                status, ended_at = (128 - code if code < 0 else code), now
                if self.stop_reason is None and status != 0 and self.first_failure is None:
                    self._launcher_failed(status)
            if ended_at is None:
                continue
            reading = any(isinstance(key.data, _Reader) and key.data.connection.kind in ("output", "launcher")
                          for key in self.selector.get_map().values())
            waiting = self.channel is not None and self.channel.waiting_for_peers()
            if self.channel is not None and not self.channel.finished:
                self.channel.done()
            stopping = self.kill_at is not None and bool(marked_processes(self.marker))  # SIGTERM ignored?
            if (not reading or now - ended_at > DRAIN_SECONDS) and not waiting and not stopping:
                return status

    def _dispatch_ready(self) -> None:
        """Handle everything the connections hold now, without waiting."""
        for _ in range(1000):
            ready = self.selector.select(0)
            if not ready:
                return
            for key, _ in ready:
                key.data()

    def _open_channel(self) -> None:
        if self.control_address is None or self.num_nodes < 2:
            return
        secret = secret_of(self.env)
        if secret is None:
            self.note(f"warning: no {SECRET_VARIABLE} in the environment, so no control channel: a failure on "
                      "another node will not stop this one")
            return
        address, port = self.control_address
        self.channel = ControlChannel(self.node, self.num_nodes, address, port, self._stop_here, self.note,
                                      self.selector, on_message=self._observer_message,
                                      attempt=self.node_dir.attempt, run_id=self.env.get("MLENV_RUN_ID", ""),
                                      secret=secret)
        self.channel.open()

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM/SIGHUP: the user stops the job; each signal is passed on once."""
        def handle(signum: int, _frame: object) -> None:
            if self.user_signal == signum:
                return  # the same signal through our group and from our parent: one stop
            self.user_signal = signum
            self._terminate(signum)

        with handling_user_signals(handle):
            yield

    # connections ------------------------------------------------------------------------------------------------
    def _accept(self, server: socket.socket) -> None:
        with contextlib.suppress(BlockingIOError):
            sock, _ = server.accept()
            sock.setblocking(False)
            connection = _Connection(sock)
            self.selector.register(sock, selectors.EVENT_READ, _Reader(self, connection))

    def _closed(self, connection: _Connection) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(connection.sock)
        connection.sock.close()
        rank = self.ranks_by_number.get(connection.rank) if connection.rank is not None else None
        if connection.kind == "control" and rank is not None and rank.record.state == RUNNING:
            self._rank_exited(rank, 128 + signal.SIGKILL, "SIGKILL")  # the wrapper died without a word

    def _header(self, connection: _Connection, header: dict[str, Any]) -> None:
        connection.kind = str(header.get("kind"))
        number = int(header.get("rank", 0))
        connection.rank = number
        if number not in self.ranks_by_number:
            info = RankInfo(number, int(header.get("local_rank", 0)), self.node, self.host, 0)
            record = RankRecord(number, info.local_rank, self.node, self.host, 0, RUNNING, None, None, utc_now(),
                                None, None)
            self.ranks_by_number[number] = _Rank(info, record)

    def _message(self, connection: _Connection, message: dict[str, Any]) -> None:
        rank = self.ranks_by_number[connection.rank or 0]
        if message.get("event") == "started":
            rank.info = replace(rank.info, pid=int(message["pid"]))
            rank.record = replace(rank.record, pid=rank.info.pid)
            self._write_ranks()
            for observer in self.observers:
                observer.rank_started(rank.info)
        elif message.get("event") == "exited":
            self._drain(rank.info.rank)
            signame = message.get("signal")
            self._rank_exited(rank, int(message["exit_code"]), str(signame) if signame else None)

    def _drain(self, number: int) -> None:
        """Read what the rank's output connections already hold, before its end is handled."""
        for key in list(self.selector.get_map().values()):
            reader = key.data
            if isinstance(reader, _Reader) and reader.connection.kind == "output" \
                    and reader.connection.rank == number:
                reader.drain()

    def _output(self, rank: _Rank) -> None:
        """The rank wrote: any bytes, a whole line or not (the hang watchdog's and ``status --gpus``' output)."""
        rank.record = replace(rank.record, last_output_at=utc_now())
        for observer in self.observers:
            observer.output(rank.info)

    def _tag(self, rank: _Rank | None) -> str:
        return f"[node-{self.node}]" if rank is None else f"[node-{self.node} r{rank.info.rank}]"

    def _line(self, rank: _Rank | None, raw: bytes, state: bool = False) -> None:
        """A whole line of the rank (None: the launcher's) to stdout, the logs and the observers; with ``state``
        a finished state of a line it updates in place: on stdout in place of the one before, in the logs and the
        rank's last lines a line of its own."""
        text = raw.decode(errors="replace")
        tag = self._tag(rank)
        if rank is not None:
            if state and rank.updating:
                rank.tail[-1] = text[:TAIL_WIDTH]  # the last lines as a terminal shows them
            else:
                rank.tail.append(text[:TAIL_WIDTH])
            rank.updating = state
        if state:
            self.sinks.log(f"{tag} {text}")
            self.sinks.show(tag, f"{tag} {text}")
        else:
            self.sinks.write(f"{tag} {text}")
        for observer in self.observers:
            observer.line(None if rank is None else rank.info, text)

    def _show(self, rank: _Rank | None, raw: bytes) -> None:
        """The state of a line updated in place that the rank is still writing: on stdout only, until it is done."""
        tag = self._tag(rank)
        self.sinks.show(tag, f"{tag} {raw.decode(errors='replace')}")

    def _updated_line_ended(self, rank: _Rank | None, raw: bytes) -> None:
        """The newline after a line updated in place: ``raw`` its last state (nothing new when empty)."""
        if raw:
            self._line(rank, raw, state=True)
        self.sinks.end(self._tag(rank))
        if rank is not None:
            rank.updating = False

    # rank events ------------------------------------------------------------------------------------------------
    def _rank_exited(self, rank: _Rank, exit_code: int, signame: str | None) -> None:
        if rank.record.state != RUNNING:
            return
        failed = exit_code != 0 and self.stop_reason is None and self.first_failure is None \
            and self.user_signal is None
        state = SUCCEEDED if exit_code == 0 else FAILED if failed else STOPPED
        rank.record = replace(rank.record, state=state, exit_code=exit_code, signal=signame, ended_at=utc_now())
        self._write_ranks()
        for observer in self.observers:
            observer.rank_exited(rank.info, exit_code, signame)
        if not failed:
            return
        failure = FirstFailure(rank.info.rank, self.node, exit_code, signame, self._reason(rank, exit_code, signame),
                               list(rank.tail), self._node_fault(), self.host)
        self.local_failure = failure
        self.note(describe(failure, rank.info.pid))
        if self.channel is not None:
            self.channel.failure(failure.to_dict(), time.time())
        self._stop_here(f"stopped after rank {failure.rank} failed", exit_code, failure.to_dict())

    def _reason(self, rank: _Rank, exit_code: int, signame: str | None) -> str:
        if signame == "SIGKILL":
            after = oom_kills()
            if (after is not None and self.oom_before is not None and after > self.oom_before) \
                    or kernel_killed(rank.info.pid):
                return "killed by the kernel's OOM killer"
        return f"killed by {signame}" if signame else f"exited with {exit_code}"

    def _node_fault(self) -> NodeFault | None:
        """The first node-fault sign an observer found on this node (faultsigns.py)."""
        found = (fault for observer in self.observers if (fault := observer.node_fault()) is not None)
        return NodeFault.parse(next(found, None))

    def _launcher_failed(self, status: int) -> None:
        name = Path(self.argv[2] if len(self.argv) > 2 and self.argv[1] == "-m" else self.argv[0]).name
        self.stop(f"the launcher ({name}) exited with {status}", status)

    def _stop_here(self, reason: str, exit_code: int, first: dict[str, Any] | None) -> None:
        """Stop this node's share (once); the control channel calls this on every node."""
        if first is not None:
            decided = FirstFailure.from_dict(first)
            if self.first_failure is None or self.first_failure.rank != decided.rank:
                self.first_failure = decided
                for rank in self.ranks_by_number.values():  # ranks that died of it were not the cause
                    if rank.record.state == FAILED and rank.info.rank != decided.rank:
                        rank.record = replace(rank.record, state=STOPPED)
                if decided.node != self.node:
                    self.note(f"stopping: rank {decided.rank} on node-{decided.node} {decided.reason}")
        if self.stop_reason is not None:
            return
        self.stop_reason, self.stop_code = reason, exit_code
        if first is None and exit_code in USER_STOPS and self.user_signal is None:
            self.user_signal, self.user_stop_told = exit_code - 128, True  # the user stopped it on another node
        if first is None:
            self.note(f"stopping the job: {reason}")
        if self.kill_at is None:  # not already stopping (the user's own signal)
            self._terminate(signal.SIGTERM)

    def _terminate(self, signum: int) -> None:
        """SIGTERM (or the user's signal) to the launcher's group; SIGKILL to the whole job after the grace."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signum)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.grace

    def _kill(self, signum: int) -> None:
        """Everything of the job: the launcher's group and every process carrying the job's marker."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signum)
        for pid in marked_processes(self.marker):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    # records ----------------------------------------------------------------------------------------------------
    def _finish(self, status: int) -> int:
        for rank in self.ranks_by_number.values():
            if rank.record.state == RUNNING:  # its wrapper never reported: killed with the launcher
                rank.record = replace(rank.record, state=STOPPED, ended_at=utc_now())
        if self.user_signal is not None:  # the user's stop, even when a rank failed of it first somewhere
            state, reason = STOPPED, f"stopped by {signal_name(self.user_signal)}"
            code = 128 + self.user_signal
        elif self.first_failure is not None:
            ff = self.first_failure
            state, code = FAILED, ff.exit_code
            reason = f"rank {ff.rank} {ff.reason}" if ff.node == self.node and self.local_failure == ff \
                else f"stopped after rank {ff.rank} failed"
        elif self.stop_reason is not None:
            state, reason, code = FAILED, self.stop_reason, self.stop_code or 1
        else:
            state, reason, code = (SUCCEEDED, "", 0) if status == 0 else (FAILED, f"exited with {status}", status)
        for observer in self.observers:
            code = observer.finished(code)
        if code != 0 and state == SUCCEEDED:
            state, reason = FAILED, str(self.extra_state.get("reason") or f"exited with {code}")
        if self.channel is not None:
            self.channel.close()
        self._write_ranks()
        self._write_state(state, reason)
        return code

    def _write_ranks(self) -> None:
        records = [self.ranks_by_number[number].record.to_dict() for number in sorted(self.ranks_by_number)]
        if records != self.written_ranks:
            with contextlib.suppress(OSError):
                write_json(self.node_dir.ranks, records)
            self.written_ranks = records

    def _write_state(self, state: str, reason: str) -> None:
        self.current_state = state
        data = {**self.extra_state, "state": state, "reason": reason,
                "first_failure": self.first_failure.to_dict() if self.first_failure else None}
        with contextlib.suppress(OSError):
            write_json(self.node_dir.state, data)


class _Reader:
    """Reads one connection: its header line, then output (split into whole lines, and the states of a line updated
    in place with ``\\r``) or control messages."""

    def __init__(self, supervisor: Supervisor, connection: _Connection) -> None:
        self.supervisor = supervisor
        self.connection = connection
        self.scanned = 0  # the buffer holds no line end before this
        self.updated = False  # the output line being read was updated in place (a carriage return since it began)

    def __call__(self) -> None:
        try:
            chunk = self.connection.sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._lines(final=True)
            self.supervisor._closed(self.connection)
            return
        self.connection.buffer += chunk
        self._lines(final=False)

    def drain(self) -> None:
        """Everything the connection holds now, without waiting."""
        self.connection.sock.setblocking(False)
        while True:
            try:
                chunk = self.connection.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                chunk = b""
            if not chunk:
                break
            self.connection.buffer += chunk
            self._lines(final=False)
        if self.connection.kind == "output":
            self._output(final=True)  # the rank's partial last line

    def _lines(self, final: bool) -> None:
        """Hand on every whole line (a line longer than MAX_LINE in pieces); with ``final`` the rest too."""
        buffer = self.connection.buffer
        while self.connection.kind in (None, "control"):  # the header, control messages: JSON lines
            end = buffer.find(b"\n", self.scanned)
            if end >= 0:
                raw, cut = bytes(buffer[:end]), end + 1
            elif len(buffer) >= MAX_LINE:
                raw, cut = bytes(buffer[:MAX_LINE]), MAX_LINE
            else:
                self.scanned = len(buffer)
                if final and buffer:
                    self._one(bytes(buffer))
                    buffer.clear()
                    self.scanned = 0
                return
            del buffer[:cut]
            self.scanned = 0
            self._one(raw)
        self._output(final)

    def _output(self, final: bool) -> None:
        """Hand on the output's whole lines and the finished states of a line updated in place (``\\r``), show the
        state still being written; with ``final`` the rest as the line's end."""
        buffer, supervisor = self.connection.buffer, self.supervisor
        rank = supervisor.ranks_by_number.get(self.connection.rank or 0) if self.connection.kind == "output" else None
        if rank is not None and buffer and not final:  # bytes just read
            supervisor._output(rank)
        while (found := _ENDS.search(buffer, self.scanned)) is not None or len(buffer) >= MAX_LINE:
            end = found.start() if found is not None else MAX_LINE
            raw, updates = bytes(buffer[:end]), found is not None and buffer[end] == ord("\r")
            del buffer[:end + 1 if found is not None else end]
            self.scanned = 0
            self._piece(rank, raw, updates)
        self.scanned = len(buffer)
        if final and (buffer or self.updated):
            self._piece(rank, bytes(buffer), False)
            buffer.clear()
            self.scanned = 0
        elif self.updated and buffer:
            supervisor._show(rank, bytes(buffer))

    def _piece(self, rank: _Rank | None, raw: bytes, updates: bool) -> None:
        """``raw`` up to a ``\\r`` (``updates``: a state of a line updated in place) or the line's end."""
        if updates:
            self.updated = True
            if raw:
                self.supervisor._line(rank, raw, state=True)
        elif self.updated:
            self.updated = False
            self.supervisor._updated_line_ended(rank, raw)
        else:
            self.supervisor._line(rank, raw)

    def _one(self, raw: bytes) -> None:
        connection, supervisor = self.connection, self.supervisor
        if connection.kind is None:
            try:
                header = json.loads(raw)
            except ValueError:
                header = {}
            supervisor._header(connection, header if isinstance(header, dict) else {})
        elif connection.kind == "control":
            with contextlib.suppress(ValueError, KeyError, TypeError):
                message = json.loads(raw)
                if isinstance(message, dict):
                    supervisor._message(connection, message)


def describe(failure: FirstFailure, pid: int) -> str:
    """``rank 3 (node-1, pid 4242) exited with 7 first; last lines: ...``: the job's first failure in one line."""
    tail = " | ".join(line.strip() for line in failure.log_tail[-3:] if line.strip()) or "(none)"
    return f"rank {failure.rank} (node-{failure.node}, pid {pid}) {failure.reason} first; last lines: {tail}"

