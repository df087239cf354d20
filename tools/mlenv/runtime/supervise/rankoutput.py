"""A rank's output as the node supervisor hands it on (supervisor.py): each connection read into whole lines (a line
updated in place with ``\\r`` in its states), tagged ``[node-R rN]``, to stdout, the logs and the observers.
"""

from __future__ import annotations

import collections
import contextlib
import json
import re
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import IO, Protocol

from ..records.jsonvalue import JsonObject
from ..records.runlayout import RankRecord
from ..watch.protocol import Observer, RankInfo

MAX_LINE = 16 << 20
"""A longer line (or state of a line updated with ``\\r``) is cut there (and goes on as a new line)."""
_ENDS = re.compile(rb"[\r\n]")
TAIL_LINES = 10
TAIL_WIDTH = 300


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


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
class RankState:
    """One rank as the supervisor knows it: what observers get, its record, its last lines."""

    info: RankInfo
    record: RankRecord
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    updating: bool = False  # the tail's last line is a state of the line the rank updates in place


@dataclass
class Connection:
    """One connection from a rank's wrapper (its output or its control messages) or the launcher's output."""

    sock: socket.socket
    buffer: bytearray = field(default_factory=bytearray)
    kind: str | None = None
    rank: int | None = None


class ConnectionOwner(Protocol):
    """What a :class:`Reader` hands a connection's header, messages and end to (the supervisor), and its ranks."""

    ranks_by_number: dict[int, RankState]
    output: RankOutput

    def on_closed(self, connection: Connection) -> None: ...

    def on_header(self, connection: Connection, header: JsonObject) -> None: ...

    def on_message(self, connection: Connection, message: JsonObject) -> None: ...


@dataclass
class RankOutput:
    """The ranks' (and the launcher's) output, handed on: to the sinks and every observer."""

    node: int
    sinks: Sinks
    observers: Sequence[Observer]

    def wrote(self, rank: RankState) -> None:
        """The rank wrote: any bytes, a whole line or not (the hang watchdog's and ``status --gpus``' output)."""
        rank.record = replace(rank.record, last_output_at=utc_now())
        for observer in self.observers:
            observer.output(rank.info)

    def tag(self, rank: RankState | None) -> str:
        return f"[node-{self.node}]" if rank is None else f"[node-{self.node} r{rank.info.rank}]"

    def line(self, rank: RankState | None, raw: bytes, state: bool = False) -> None:
        """A whole line of the rank (None: the launcher's) to stdout, the logs and the observers; with ``state``
        a finished state of a line it updates in place: on stdout in place of the one before, in the logs and the
        rank's last lines a line of its own."""
        text = raw.decode(errors="replace")
        tag = self.tag(rank)
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

    def show(self, rank: RankState | None, raw: bytes) -> None:
        """The state of a line updated in place that the rank is still writing: on stdout only, until it is done."""
        tag = self.tag(rank)
        self.sinks.show(tag, f"{tag} {raw.decode(errors='replace')}")

    def updated_line_ended(self, rank: RankState | None, raw: bytes) -> None:
        """The newline after a line updated in place: ``raw`` its last state (nothing new when empty)."""
        if raw:
            self.line(rank, raw, state=True)
        self.sinks.end(self.tag(rank))
        if rank is not None:
            rank.updating = False


class Reader:
    """Reads one connection: its header line, then output (split into whole lines, and the states of a line updated
    in place with ``\\r``) or control messages."""

    def __init__(self, owner: ConnectionOwner, connection: Connection) -> None:
        self.owner = owner
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
            self.owner.on_closed(self.connection)
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
        buffer, owner = self.connection.buffer, self.owner
        rank = owner.ranks_by_number.get(self.connection.rank or 0) if self.connection.kind == "output" else None
        if rank is not None and buffer and not final:  # bytes just read
            owner.output.wrote(rank)
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
            owner.output.show(rank, bytes(buffer))

    def _piece(self, rank: RankState | None, raw: bytes, updates: bool) -> None:
        """``raw`` up to a ``\\r`` (``updates``: a state of a line updated in place) or the line's end."""
        if updates:
            self.updated = True
            if raw:
                self.owner.output.line(rank, raw, state=True)
        elif self.updated:
            self.updated = False
            self.owner.output.updated_line_ended(rank, raw)
        else:
            self.owner.output.line(rank, raw)

    def _one(self, raw: bytes) -> None:
        connection, owner = self.connection, self.owner
        if connection.kind is None:
            try:
                header = json.loads(raw)
            except ValueError:
                header = {}
            owner.on_header(connection, header if isinstance(header, dict) else {})
        elif connection.kind == "control":
            with contextlib.suppress(ValueError, KeyError, TypeError):
                message = json.loads(raw)
                if isinstance(message, dict):
                    owner.on_message(connection, message)
