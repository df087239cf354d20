"""The node supervisors' control channel: fail fast across nodes without an mlenv client (detached runs too).

Node 0's supervisor listens on ``MASTER_PORT + 1``; the others connect and stay connected while their job runs.
Messages are JSON lines. A node reports a rank failure (``failure``), a stop it needs (``stop``) and its end
(``done``). A node says hello with its attempt (``MLENV_RESTART_COUNT``); node 0 sends a node of another attempt
away (``retry``: the previous attempt's node 0 is still waiting for its peers), and that node tries again. Node 0
collects the failures of ``DECIDE_SECONDS`` (ranks that die of the first one's death come
later), names the earliest as the job's first failure and broadcasts one ``stop`` to every node. A connection lost
before ``done`` counts as that node's failure, on both sides.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

DECIDE_SECONDS = 1.0
CONNECT_SECONDS = 300.0
"""How long a node tries to reach node 0 before it runs without the channel (and says so)."""
CONNECT_TIMEOUT = 0.5

StopHandler = Callable[[str, int, "dict[str, Any] | None"], None]
"""Called with (reason, exit code, the job's first failure or None) when the job must stop."""
Note = Callable[[str], None]


@dataclass
class _Peer:
    sock: socket.socket
    node: int | None = None
    buffer: bytes = b""
    done: bool = False


@dataclass
class ControlChannel:
    """One node's end of the channel, driven by the supervisor's selector and its ``tick``."""

    node: int
    num_nodes: int
    address: str
    port: int
    on_stop: StopHandler
    note: Note
    selector: selectors.BaseSelector
    server: socket.socket | None = None
    peers: list[_Peer] = field(default_factory=list)
    upstream: _Peer | None = None
    connect_until: float = 0.0
    failures: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    decide_at: float | None = None
    stopped: bool = False
    finished: bool = False
    on_message: Callable[[dict[str, Any]], None] | None = None
    """Observers' messages (``relay``) that reach this node."""
    attempt: int = 0
    """The run's attempt this node runs: only nodes of the same attempt are connected."""

    def open(self) -> None:
        """Listen (node 0) or start trying to connect (the others)."""
        if self.node == 0:
            try:
                family = socket.AF_INET6 if socket.has_dualstack_ipv6() else socket.AF_INET
                self.server = socket.create_server(("", self.port), family=family,
                                                   dualstack_ipv6=family == socket.AF_INET6)
            except OSError as exc:
                self.note(f"warning: no control channel on port {self.port} ({exc.strerror}): a failure on another "
                          "node will not stop this one")
                return
            self.server.setblocking(False)
            self.selector.register(self.server, selectors.EVENT_READ, self._accept)
        else:
            self.connect_until = time.monotonic() + CONNECT_SECONDS

    def _accept(self) -> None:
        if self.server is None:
            return
        with contextlib.suppress(BlockingIOError):
            sock, _ = self.server.accept()
            peer = _Peer(sock)
            self.peers.append(peer)
            self.selector.register(sock, selectors.EVENT_READ, lambda: self._read(peer))

    def _try_connect(self) -> None:
        try:
            sock = socket.create_connection((self.address, self.port), timeout=CONNECT_TIMEOUT)
        except OSError:
            if time.monotonic() > self.connect_until:
                self.connect_until = float("inf")
                self.note(f"warning: node 0's control channel {self.address}:{self.port} cannot be reached: a "
                          "failure on another node will not stop this one")
            return
        sock.settimeout(5.0)
        self.upstream = _Peer(sock, node=0)
        self._send(self.upstream, {"hello": self.node, "attempt": self.attempt})
        self.selector.register(sock, selectors.EVENT_READ, lambda: self._read(self.upstream))

    def _read(self, peer: _Peer | None) -> None:
        if peer is None:
            return
        try:
            chunk = peer.sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            self._lost(peer)
            return
        peer.buffer += chunk
        while b"\n" in peer.buffer and (peer is self.upstream or peer in self.peers):  # until it is dropped
            line, peer.buffer = peer.buffer.split(b"\n", 1)
            with contextlib.suppress(ValueError):
                message = json.loads(line)
                if isinstance(message, dict):
                    self._handle(peer, message)

    def _handle(self, peer: _Peer, message: Mapping[str, Any]) -> None:
        if "hello" in message:
            if int(message.get("attempt", 0)) != self.attempt:  # a node of the next attempt, early: not ours
                self._send(peer, {"retry": f"node 0 of attempt {self.attempt} is ending"})
                self._drop(peer)
                self.peers.remove(peer)
                return
            peer.node = int(message["hello"])
        elif "retry" in message and peer is self.upstream:  # the previous attempt's node 0: try again
            self._drop(peer)
            self.upstream = None
        elif "failure" in message:
            self._failure(float(message.get("ended", time.time())), dict(message["failure"]))
        elif "done" in message:
            peer.done = True
        elif "observer" in message and isinstance(message["observer"], dict) and self.on_message is not None:
            self.on_message(dict(message["observer"]))
        elif "stop" in message:
            if self.node == 0:
                self._broadcast(str(message["stop"]), int(message.get("exit_code", 1)), None)
            else:
                self._stop(str(message["stop"]), int(message.get("exit_code", 1)), message.get("first_failure"))

    def _drop(self, peer: _Peer) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(peer.sock)
        peer.sock.close()

    def _lost(self, peer: _Peer) -> None:
        self._drop(peer)
        if peer is self.upstream:
            self.upstream = None
            if not self.finished:
                self._stop("lost the control channel to node 0", 1, None)
        elif peer in self.peers:
            self.peers.remove(peer)
            if not peer.done:
                self._broadcast(f"lost node {'?' if peer.node is None else peer.node}", 1, None)

    def _failure(self, ended: float, failure: dict[str, Any]) -> None:
        """Node 0: one more failure to decide between."""
        if self.stopped:
            return
        self.failures.append((ended, failure))
        if self.decide_at is None:
            self.decide_at = time.monotonic() + DECIDE_SECONDS

    def _broadcast(self, reason: str, exit_code: int, first: dict[str, Any] | None) -> None:
        """Node 0: stop every node (once)."""
        if self.stopped:
            return
        for peer in list(self.peers):
            self._send(peer, {"stop": reason, "exit_code": exit_code, "first_failure": first})
        self._stop(reason, exit_code, first)

    def _stop(self, reason: str, exit_code: int, first: dict[str, Any] | None) -> None:
        if not self.stopped:
            self.stopped = True
            self.on_stop(reason, exit_code, first)

    def _send(self, peer: _Peer, message: Mapping[str, Any]) -> None:
        with contextlib.suppress(OSError):
            peer.sock.sendall(json.dumps(message).encode() + b"\n")

    def tick(self) -> None:
        """Connect when not yet connected; after the decision window, name the first failure."""
        if self.node != 0 and self.upstream is None and time.monotonic() < self.connect_until and not self.finished:
            self._try_connect()
        if self.decide_at is not None and time.monotonic() >= self.decide_at and not self.stopped:
            _, first = min(self.failures, key=lambda item: item[0])
            self._broadcast(f"stopped after rank {first['rank']} failed", int(first["exit_code"]), first)

    def failure(self, failure: dict[str, Any], ended: float) -> None:
        """A rank of this node failed (``ended``: wall clock)."""
        if self.node == 0 or self.upstream is None:
            self._failure(ended, failure)
        else:
            self._send(self.upstream, {"failure": failure, "ended": ended})

    def stop(self, reason: str, exit_code: int) -> None:
        """This node needs the whole job stopped (an observer, a launcher that failed on its own)."""
        if self.node == 0 or self.upstream is None:
            self._broadcast(reason, exit_code, None)
        else:
            self._send(self.upstream, {"stop": reason, "exit_code": exit_code})

    def relay(self, message: Mapping[str, Any]) -> None:
        """An observer's message: from node 0 to every other node, from another node to node 0."""
        for peer in ([self.upstream] if self.upstream is not None else []) if self.node != 0 else list(self.peers):
            self._send(peer, {"observer": message})

    def done(self) -> None:
        """This node's job has ended: from now on a lost connection is no failure."""
        self.finished = True
        if self.upstream is not None:
            self._send(self.upstream, {"done": True})

    def waiting_for_peers(self) -> bool:
        """Node 0 stays until every connected node has ended (else they would take its leaving as a failure) and it
        has named the first of the failures reported (after its own ranks succeeded too); the others stay connected
        until node 0 has ended, so that a failure elsewhere after their own ranks succeeded still reaches them (and a
        detached run's restart starts on every node)."""
        if self.node != 0:
            return self.upstream is not None
        return any(not peer.done for peer in self.peers) or (self.decide_at is not None and not self.stopped)

    def close(self) -> None:
        for sock in [*(p.sock for p in self.peers), *([self.upstream.sock] if self.upstream else []),
                     *([self.server] if self.server else [])]:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(sock)
            sock.close()
