"""Where strangers knock: a listening socket whose every connection is sent a challenge (a fresh nonce) and must
answer with one line, a JSON object, before anything more of it is read (node 0's control channel, a standby).

At most ``UNPROVEN_LIMIT`` connections wait for their answer at once (a newer one drops the oldest), each for at
most ``HELLO_SECONDS`` and ``HELLO_LIMIT`` bytes. A connection that cannot be accepted is refused: out of
descriptors (or memory), the oldest waiting connection is dropped to free one, else accepting pauses for
``PAUSE_SECONDS``; one aborted before it was accepted is gone. Each kind of refusal is said once (once per address
where it names one): a flood makes a line, not a line per connection. Nothing a connection does raises out of the
door: an error of its owner's handling drops that connection, said once."""

from __future__ import annotations

import contextlib
import errno
import json
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..records.jsonvalue import JsonObject
from .proofs import nonce

HELLO_SECONDS = 3.0
"""How long a connection may wait before it answers its challenge (with the run's secret)."""
HELLO_LIMIT = 4096
"""The most bytes read from a connection before its answer: a longer first line is dropped."""
UNPROVEN_LIMIT = 64
"""How many connections may wait for their answer at once; a newer one drops the oldest."""
PAUSE_SECONDS = 0.5
"""How long accepting pauses when a connection cannot be accepted for want of a resource and no waiting connection
can be dropped to free it."""
SEND_TIMEOUT = 5.0
"""How long a send may block on a connection (a peer that reads nothing holds no send for long)."""
GONE = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.ENETDOWN, errno.ENETUNREACH,
                  errno.EHOSTDOWN, errno.EHOSTUNREACH, errno.ENOPROTOOPT, errno.ENONET, errno.EOPNOTSUPP})
"""accept(2) errors of the connection itself (Linux passes the network's on): it is gone, the next one may come."""

Note = Callable[[str], None]


@dataclass
class Caller:
    """A connection that has not answered its challenge yet."""

    sock: socket.socket
    address: str
    challenge: str = field(default_factory=nonce)
    since: float = field(default_factory=time.monotonic)
    buffer: bytes = b""


Answered = Callable[[Caller, JsonObject, bytes], str | None]
"""The door's owner, given a caller's answer (its first line) and what came after it: None when it took the
connection (to keep or to close), else why the door drops it (said once)."""


@dataclass
class Door:
    """A listening socket in ``selector`` whose connections are handed to ``answered`` once they answer."""

    server: socket.socket
    selector: selectors.BaseSelector
    note: Note
    answered: Answered
    what: str = "connection"
    """What a connection is called in the notes."""
    deadline: float = HELLO_SECONDS
    callers: dict[socket.socket, Caller] = field(default_factory=dict)
    """The connections waiting for their answer, oldest first."""
    paused_until: float | None = None
    said: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.server.setblocking(False)
        self.selector.register(self.server, selectors.EVENT_READ, self._accept)

    def _accept(self) -> None:
        try:
            sock, address = self.server.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as err:
            self._not_accepted(err)
            return
        if len(self.callers) >= UNPROVEN_LIMIT:
            self.once("limit", f"more than {UNPROVEN_LIMIT} {self.what}s waiting to prove the run's secret: dropping "
                               "the oldest first (said once)")
            self._close(next(iter(self.callers.values())))
        caller = Caller(sock, str(address[0]) if isinstance(address, tuple) else "?")
        sock.settimeout(SEND_TIMEOUT)
        self.callers[sock] = caller
        self.selector.register(sock, selectors.EVENT_READ, lambda: self._read(caller))
        try:
            sock.sendall(json.dumps({"challenge": caller.challenge}).encode() + b"\n")
        except OSError:
            self._close(caller)

    def _not_accepted(self, err: OSError) -> None:
        """A connection that could not be accepted: refused, said once; out of a resource, the oldest caller dropped
        to free it, else accepting paused a moment (its listening socket would stay readable: no busy loop)."""
        name = errno.errorcode.get(err.errno or 0, str(err.errno))
        self.once(name, f"cannot accept a {self.what} ({err.strerror}, {name}): refusing while it lasts (said once)")
        if err.errno in GONE:
            return
        if self.callers:
            self._close(next(iter(self.callers.values())))
        elif self.paused_until is None:
            self.selector.unregister(self.server)
            self.paused_until = time.monotonic() + PAUSE_SECONDS

    def _read(self, caller: Caller) -> None:
        try:
            chunk = caller.sock.recv(HELLO_LIMIT)
        except OSError:
            chunk = b""
        if not chunk:
            self._close(caller)  # left without a word: nothing to say
            return
        caller.buffer += chunk
        line, found, rest = caller.buffer.partition(b"\n")
        if len(line) > HELLO_LIMIT:
            self.refuse(caller, f"longer than {HELLO_LIMIT} bytes")
            return
        if not found:
            return
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(caller.sock)
        del self.callers[caller.sock]
        try:
            answer = json.loads(line)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            self.refuse(caller, "not a JSON object")
            return
        try:
            why = self.answered(caller, answer, rest)
        except Exception as err:  # an error of the owner's: this connection is dropped, the door stays
            why = f"{type(err).__name__} while answering it"
        if why is not None:
            self.refuse(caller, why)

    def refuse(self, caller: Caller, why: str) -> None:
        """Drop ``caller``'s connection, said once for its address and ``why``."""
        self.once(f"{caller.address} {why}", f"dropped a {self.what} from {caller.address}: {why} (said once)")
        self._close(caller)

    def once(self, key: str, text: str) -> None:
        """Note ``text`` unless a note of ``key`` was made before."""
        if key not in self.said:
            self.said.add(key)
            self.note(text)

    def tick(self, now: float) -> None:
        """Drop the callers that did not answer in time; accept again after a pause."""
        for caller in [c for c in self.callers.values() if now - c.since > self.deadline]:
            self.refuse(caller, f"no answer to its challenge in {self.deadline:g} s")
        if self.paused_until is not None and now >= self.paused_until:
            self.paused_until = None
            self.selector.register(self.server, selectors.EVENT_READ, self._accept)

    def _close(self, caller: Caller) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(caller.sock)
        self.callers.pop(caller.sock, None)
        caller.sock.close()

    def close(self) -> None:
        """Close the waiting connections and the listening socket."""
        for caller in list(self.callers.values()):
            self._close(caller)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(self.server)
        self.server.close()


def shown(value: object) -> str:
    """A value from a message (a stranger's too), fit for one line of a log: JSON, ASCII, at most 80 characters."""
    return json.dumps(value, ensure_ascii=True)[:80]
