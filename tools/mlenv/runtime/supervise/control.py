"""The node supervisors' control channel: fail fast across nodes without an mlenv client (detached runs too).

Node 0's supervisor listens on ``MASTER_PORT + 1`` of the master's address only; the others connect and stay
connected while their job runs. Messages are JSON lines, each carrying the run id and attempt. The two ends of a
connection prove to each other that they hold the run's secret (``MLENV_CONTROL_SECRET``: random per run, handed to
the nodes in their environment), which never travels: node 0 sends a ``challenge`` (a nonce), the node answers with
its ``hello``, a nonce of its own and the HMAC of the challenge, and node 0 with a ``welcome``, the HMAC of both
nonces (compared in constant time). From then on every line of the connection, both ways, is sealed (proofs.py): its
MAC binds it to both nonces, its direction and its turn, so that a line altered, replayed or out of its turn closes
the connection. Strangers wait at node 0's door (door.py): a connection that has not said hello with the right proof
within ``HELLO_SECONDS`` is dropped and counts for nothing, at most ``UNPROVEN_LIMIT`` wait at once (the oldest
dropped first), and a connection that cannot be accepted (out of descriptors) is refused, said once; a node gives
node 0 ``PROOF_SECONDS`` to prove itself (node 0 may be busy starting its job), then tries again. A node reports a
rank failure (``failure``), a stop it needs (``stop``) and its end (``done``); both ends say they are alive
(``beat``) every ``BEAT_SECONDS`` from a thread of their own, and an end silent for ``SILENCE_SECONDS`` is lost (a
frozen node closes no connection). Node 0 turns a node of another run away (``refused``), and sends a node of
another attempt away (``retry``: the previous attempt's node 0 is still waiting for its peers), and that node tries
again. Node 0 collects the failures of ``DECIDE_SECONDS`` (ranks that die of the first one's death come later),
names the earliest as the job's first failure and broadcasts one ``stop`` to every node. A connection lost before
``done`` counts as that node's failure, on both sides (once it said hello). No error in handling a connection ends
the supervisor: that connection is dropped, noted."""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..records.jsonvalue import JsonObject, int_of, number_of, object_of
from ..records.runlayout import FirstFailure
from ..records.states import FaultSign, NodeFault
from .door import HELLO_LIMIT, SEND_TIMEOUT, Caller, Door, shown
from .listener import listen
from .proofs import DOWN, UP, Seal, Unsealed, is_nonce, nonce, proof, proves

DECIDE_SECONDS = 1.0
CONNECT_SECONDS = 300.0
"""How long a node tries to reach node 0 before it runs without the channel (and says so)."""
CONNECT_TIMEOUT = 0.5
UNPROVEN_TRIES = 3
"""How many times a node tries a node 0 that never proves the secret (another run's?) before it runs without it."""
PROOF_SECONDS = 10.0
"""How long a node waits for node 0 to prove the secret (its challenge, then its welcome) before it drops the
connection, an unproven try: longer than node 0 gives strangers, as node 0's loop may be busy starting its job."""
MESSAGE_LIMIT = 64 << 20
"""The longest message of a node that said hello (observers' messages carry stacks)."""
BEAT_SECONDS = 2.0
"""How often each end of a connection says it is alive (from a thread of its own: a supervisor busy sampling stacks
still beats)."""
SILENCE_SECONDS = 15.0
"""A connected node (or node 0) heard nothing from this long is lost: frozen, or cut off without a closing."""

StopHandler = Callable[[str, int, FirstFailure | None, bool], None]
"""Called with (reason, exit code, the job's first failure or None, whether it is a preemption) when the job stops."""
CLOSED = "its control channel to node 0 closed before its job ended"
"""Node 0's words for a node whose connection closed unannounced (the evidence of its ``closed`` sign)."""
Note = Callable[[str], None]


@dataclass
class _Peer:
    """The other end of a connection: on node 0 a node that proved the secret, on the others node 0."""

    sock: socket.socket
    address: str
    node: int
    """The node it said it is in its hello (node 0 for the others' connection)."""
    buffer: bytes = b""
    done: bool = False
    since: float = field(default_factory=time.monotonic)
    heard: float = field(default_factory=time.monotonic)
    """When anything last came from it (its heartbeat comes every BEAT_SECONDS)."""
    nonce: str = field(default_factory=nonce)
    """The others: the nonce node 0 must prove the secret with."""
    challenge: str | None = None
    """The others: node 0's challenge, once it came."""
    seal: Seal | None = None
    """Both ends proved the secret: every line from now on is sealed."""

    @property
    def proven(self) -> bool:
        """It proved that it holds the run's secret."""
        return self.seal is not None


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
    door: Door | None = None
    """Node 0: where connections wait until they prove the secret."""
    peers: list[_Peer] = field(default_factory=list)
    """Node 0: the connected nodes."""
    upstream: _Peer | None = None
    connect_until: float = 0.0
    failures: list[tuple[float, FirstFailure]] = field(default_factory=list)
    decide_at: float | None = None
    stopped: bool = False
    finished: bool = False
    on_message: Callable[[JsonObject], None] | None = None
    """Observers' messages (``relay``) that reach this node."""
    on_lost: Callable[[int, NodeFault], None] | None = None
    """Called with (node, its ``unreachable`` sign) for a node lost: on node 0, one silent or whose connection closed
    before it said its job ended (its supervisor killed with it: its records cannot say so); on the others, node 0
    silent (frozen: it records nothing, and the node that stops is not the cause)."""
    attempt: int = 0
    """The run's attempt this node runs: only nodes of the same attempt are connected."""
    run_id: str = ""
    """The run this node belongs to: a node of another run is turned away."""
    secret: str = ""
    """The run's control secret: a connection that cannot prove it holds it is dropped."""
    unproven: int = 0
    """How many connections to node 0's address ended before it proved the secret."""
    silence: float = SILENCE_SECONDS
    """How long a connected end may stay silent before it is lost."""
    sending: threading.Lock = field(default_factory=threading.Lock)
    """One message at a time on a connection: the heartbeat thread sends too."""
    ticked: float = field(default_factory=time.monotonic)
    beating: threading.Event | None = None

    def open(self) -> None:
        """Listen on the master's address (node 0) or start trying to connect (the others)."""
        if self.node == 0:
            try:
                server = listen(self.address, self.port)
            except OSError as exc:
                self.note(f"warning: no control channel on {self.address}:{self.port} ({exc.strerror}): a failure "
                          "on another node will not stop this one")
                return
            self.door = Door(server, self.selector, self.note, self._answered, what="control connection")
        else:
            self.connect_until = time.monotonic() + CONNECT_SECONDS

    def _try_connect(self) -> None:
        try:
            sock = socket.create_connection((self.address, self.port), timeout=CONNECT_TIMEOUT)
        except OSError:
            if time.monotonic() > self.connect_until:
                self.connect_until = float("inf")
                self.note(f"warning: node 0's control channel {self.address}:{self.port} cannot be reached: a "
                          "failure on another node will not stop this one")
            return
        sock.settimeout(SEND_TIMEOUT)
        self.upstream = _Peer(sock, self.address, node=0)
        self.selector.register(sock, selectors.EVENT_READ, self._reader(self.upstream))

    def _reader(self, peer: _Peer) -> Callable[[], None]:
        """The selector's callback for ``peer``: an error in handling what it sent drops that connection, noted,
        never the supervisor."""
        def read() -> None:
            try:
                self._read(peer)
            except Exception as err:  # noted with the peer; the supervisor goes on
                if self._ours(peer):
                    self._refuse(peer, f"dropped a control message from {peer.address}: {type(err).__name__} {err}")
        return read

    def _read(self, peer: _Peer) -> None:
        try:
            chunk = peer.sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            self._lost(peer)
            return
        peer.heard = time.monotonic()
        peer.buffer += chunk
        while b"\n" in peer.buffer and self._ours(peer):  # until it is dropped
            line, peer.buffer = peer.buffer.split(b"\n", 1)
            self._line(peer, line)
        limit = MESSAGE_LIMIT if peer.proven else HELLO_LIMIT
        if len(peer.buffer) > limit and self._ours(peer):
            self._refuse(peer, f"dropped a control message from {peer.address}: longer than {limit} bytes")

    def _ours(self, peer: _Peer) -> bool:
        return peer is self.upstream or peer in self.peers

    def _line(self, peer: _Peer, line: bytes) -> None:
        """One message: opened when the connection is sealed, and obeyed only from a peer that proved it holds the
        run's secret (node 0's handshake first)."""
        try:
            body = line if peer.seal is None else peer.seal.open(line)
        except Unsealed as why:
            self._refuse(peer, f"dropped a control message from {peer.address}: {why}")
            return
        try:
            message = json.loads(body)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            self._refuse(peer, f"dropped a control message from {peer.address}: not a JSON object")
        elif peer.proven:
            self._handle(peer, message)
        else:
            self._handshake(peer, message)

    def _proof(self, *parts: object) -> str:
        return proof(self.secret, *parts)

    def _proves(self, message: JsonObject, key: str, *parts: object) -> bool:
        return proves(self.secret, message.get(key), *parts)

    def _handshake(self, peer: _Peer, message: JsonObject) -> None:
        """A node other than 0: node 0's challenge (answered with the hello), then its welcome (the connection is
        sealed from then on)."""
        if peer.challenge is None and is_nonce(message.get("challenge")):
            peer.challenge = str(message["challenge"])
            self._send(peer, {"hello": self.node, "nonce": peer.nonce,
                              "proof": self._proof("hello", peer.challenge, self.run_id, self.attempt, self.node)})
        elif peer.challenge is not None and self._proves(message, "welcome", "welcome", peer.challenge, peer.nonce):
            peer.seal = Seal(self.secret, peer.challenge, peer.nonce, UP)
            if self.finished:
                self._send(peer, {"done": True})
        else:
            self._refuse(peer, f"dropped a control message from {peer.address}: bad secret")

    def _answered(self, caller: Caller, message: JsonObject, rest: bytes) -> str | None:
        """Node 0: a connection's hello, with the HMAC of its challenge: a welcome with the HMAC of both nonces
        (the connection is sealed from then on), then the node is connected, or turned away when of another run,
        or sent away to retry when of another attempt."""
        client = message.get("nonce")
        if "hello" not in message or not is_nonce(client) or not self._proves(
                message, "proof", "hello", caller.challenge, message.get("run"), message.get("attempt"),
                message["hello"]):
            return "bad secret"
        node = int_of(message["hello"], "hello")
        peer = _Peer(caller.sock, caller.address, node=node, buffer=rest)  # read with its next lines
        self._send(peer, {"welcome": self._proof("welcome", caller.challenge, client)})
        peer.seal = Seal(self.secret, caller.challenge, str(client), DOWN)
        if message.get("run") != self.run_id:
            self._send(peer, {"refused": f"this is run {self.run_id}"})
            self.note(f"turned away node {shown(message['hello'])} of run {shown(message.get('run'))} from "
                      f"{peer.address} (this is run {self.run_id})")
            self._drop(peer)
        elif message.get("attempt") != self.attempt:  # a node of the next attempt, early: not ours
            self._send(peer, {"retry": f"node 0 of attempt {self.attempt} is ending"})
            self._drop(peer)
        else:
            self.peers.append(peer)
            self.selector.register(peer.sock, selectors.EVENT_READ, self._reader(peer))
        return None

    def _refuse(self, peer: _Peer, why: str) -> None:
        """Drop ``peer``'s connection, noted, as when it breaks."""
        self.note(why)
        self._lost(peer)

    def _unproven_upstream(self) -> None:
        """The connection to node 0's address ended before node 0 proved the secret: try again, a few times."""
        self.unproven += 1
        if self.unproven >= UNPROVEN_TRIES:
            self.connect_until = 0.0  # no more tries
            self.note(f"warning: {self.address}:{self.port} did not prove the run's secret in {self.unproven} tries "
                      "(not this run's node 0): no control channel, a failure on another node will not stop this one")

    def _handle(self, peer: _Peer, message: JsonObject) -> None:
        if "refused" in message and peer is self.upstream:  # another run's node 0 holds the port: not ours
            self.note(f"node 0 at {peer.address}:{self.port} refused this node: {shown(message['refused'])}")
            self._drop(peer)
            self.upstream = None
            self.connect_until = 0.0  # no more tries
            self.note("warning: no control channel: a failure on another node will not stop this one")
        elif "retry" in message and peer is self.upstream:  # the previous attempt's node 0: try again
            self._drop(peer)
            self.upstream = None
        elif "failure" in message:
            ended = message.get("ended")
            self._failure(time.time() if ended is None else number_of(ended, "ended"),
                          FirstFailure.from_dict(object_of(message["failure"], "failure")))
        elif "beat" in message:
            return  # heard: that is all it says
        elif "done" in message:
            peer.done = True
        elif "observer" in message and isinstance(message["observer"], dict) and self.on_message is not None:
            self.on_message(dict(message["observer"]))
        elif "stop" in message:
            reason, code = str(message["stop"]), int_of(message.get("exit_code", 1), "exit_code")
            preempted = message.get("preempted") is True
            if self.node == 0:
                self._broadcast(reason, code, None, preempted)
            else:
                first = message.get("first_failure")
                self._stop(reason, code, None if first is None else FirstFailure.from_dict(object_of(first, "first")),
                           preempted)

    def _drop(self, peer: _Peer) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(peer.sock)
        peer.sock.close()

    def _lost(self, peer: _Peer) -> None:
        """``peer``'s connection ended: node 0 not yet proven is tried again; node 0 proven, lost (this node stops
        unless its job ended); on node 0, a node that had not said its job ended is lost (the job stops)."""
        self._drop(peer)
        if peer is self.upstream:
            self.upstream = None
            if not peer.proven:
                self._unproven_upstream()
            elif not self.finished:
                self._stop("lost the control channel to node 0", 1, None)
        elif peer in self.peers:
            self.peers.remove(peer)
            if not peer.done and not self.stopped:
                self._lost_node(peer.node, CLOSED, closed=True)
                self._broadcast(f"lost node {peer.node}", 1, None)

    def _lost_node(self, node: int, evidence: str, closed: bool = False) -> None:
        if self.on_lost is not None:
            self.on_lost(node, NodeFault(FaultSign.UNREACHABLE, evidence, closed))

    def _failure(self, ended: float, failure: FirstFailure) -> None:
        """Node 0: one more failure to decide between."""
        if self.stopped:
            return
        self.failures.append((ended, failure))
        if self.decide_at is None:
            self.decide_at = time.monotonic() + DECIDE_SECONDS

    def _broadcast(self, reason: str, exit_code: int, first: FirstFailure | None, preempted: bool = False) -> None:
        """Node 0: stop every node (once)."""
        if self.stopped:
            return
        for peer in self.peers:
            self._send(peer, {"stop": reason, "exit_code": exit_code,
                              "first_failure": None if first is None else first.to_dict(), "preempted": preempted})
        self._stop(reason, exit_code, first, preempted)

    def _stop(self, reason: str, exit_code: int, first: FirstFailure | None, preempted: bool = False) -> None:
        if not self.stopped:
            self.stopped = True
            self.on_stop(reason, exit_code, first, preempted)

    def _send(self, peer: _Peer, message: JsonObject) -> None:
        """Send ``message`` (with the run id and attempt), sealed once the connection is."""
        body = json.dumps({**message, "run": self.run_id, "attempt": self.attempt}).encode()
        with self.sending, contextlib.suppress(OSError):
            peer.sock.sendall(body + b"\n" if peer.seal is None else peer.seal.seal(body))

    def _beat(self, stop: threading.Event) -> None:
        """The heartbeat thread: every BEAT_SECONDS, a beat to node 0 (or, on node 0, to every connected node)."""
        while not stop.wait(BEAT_SECONDS):
            upstream = self.upstream
            for peer in ([upstream] if upstream is not None and upstream.proven else []) if self.node != 0 \
                    else list(self.peers):
                self._send(peer, {"beat": True})

    def _silent(self, now: float) -> None:
        """Lose the ends heard nothing from for ``silence`` seconds; a loop that could not read that long (the
        thread blocked) first counts everything as heard."""
        if now - self.ticked > self.silence / 2:
            for peer in [*self.peers, *([self.upstream] if self.upstream else [])]:
                peer.heard = now
        self.ticked = now
        quiet = f"nothing heard for {self.silence:g} s: frozen, or cut off"
        if self.node == 0:
            for peer in [p for p in self.peers if not p.done and now - p.heard > self.silence]:
                self.note(f"node {peer.node} stopped answering ({quiet})")
                self._lost_node(peer.node, f"node 0 heard nothing from it for {self.silence:g} s")
                self.peers.remove(peer)
                self._drop(peer)
                self._broadcast(f"lost node {peer.node} ({quiet})", 1, None)
        elif self.connected and self.upstream is not None and now - self.upstream.heard > self.silence:
            self._drop(self.upstream)
            self.upstream = None  # no longer waited for, once this node's job ended too
            if not self.finished and not self.stopped:  # node 0 is the one lost: it cannot record itself
                self._lost_node(0, f"node {self.node} heard nothing from it for {self.silence:g} s")
                self._stop(f"lost the control channel to node 0 ({quiet})", 1, None)

    @property
    def connected(self) -> bool:
        """A node other than 0: connected to node 0 of its run and attempt, each having proved the secret."""
        return self.upstream is not None and self.upstream.proven

    def tick(self) -> None:
        """Connect when not yet connected; drop a connection to node 0 that did not prove the secret within
        PROOF_SECONDS (node 0's door drops its own strangers); after the decision window, name the first failure."""
        now = time.monotonic()
        if self.node != 0 and self.upstream is None and now < self.connect_until and not self.finished:
            self._try_connect()
        if self.upstream is not None and not self.upstream.proven and now - self.upstream.since > PROOF_SECONDS:
            self._refuse(self.upstream, f"dropped the control connection to {self.address}: no proof of the secret "
                                        f"in {PROOF_SECONDS:g} s")
        if self.door is not None:
            self.door.tick(now)
        if self.beating is None:
            self.beating = threading.Event()
            threading.Thread(target=self._beat, args=(self.beating,), name="mlenv-heartbeat", daemon=True).start()
        self._silent(time.monotonic())
        if self.decide_at is not None and time.monotonic() >= self.decide_at and not self.stopped:
            _, first = min(self.failures, key=lambda item: item[0])
            self._broadcast(f"stopped after rank {first.rank} failed", first.exit_code, first)

    def failure(self, failure: FirstFailure, ended: float) -> None:
        """A rank of this node failed (``ended``: wall clock)."""
        if self.node == 0 or self.upstream is None or not self.upstream.proven:
            self._failure(ended, failure)
        else:
            self._send(self.upstream, {"failure": failure.to_dict(), "ended": ended})

    def stop(self, reason: str, exit_code: int, preempted: bool = False) -> None:
        """This node needs the whole job stopped (an observer, a launcher that failed on its own, a stop here)."""
        if self.node == 0 or self.upstream is None or not self.upstream.proven:
            self._broadcast(reason, exit_code, None, preempted)
        else:
            self._send(self.upstream, {"stop": reason, "exit_code": exit_code, "preempted": preempted})

    def relay(self, message: JsonObject) -> None:
        """An observer's message: from node 0 to every other node, from another node to node 0."""
        for peer in ([self.upstream] if self.upstream is not None and self.upstream.proven else []) if self.node != 0 \
                else self.peers:
            self._send(peer, {"observer": message})

    def done(self) -> None:
        """This node's job has ended: from now on a lost connection is no failure."""
        self.finished = True
        if self.upstream is not None and self.upstream.proven:
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
        if self.beating is not None:
            self.beating.set()
        for peer in [*self.peers, *([self.upstream] if self.upstream else [])]:
            self._drop(peer)
        if self.door is not None:
            self.door.close()
