"""The node supervisors' control channel, on real sockets: across a restart, a node of the next attempt that reaches
the ending attempt's node 0 is sent away to retry (no failure, no stop) and joins the next attempt's node 0; a
stranger without the run's secret, a node of another run and a silent connection are dropped, noted, never
obeyed, and count for nothing."""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import time
from dataclasses import replace
from typing import Any

import pytest
from mlenv.runtime.records.runlayout import FirstFailure
from mlenv.runtime.records.states import FaultSign, NodeFault
from mlenv.runtime.supervise import control, proofs
from mlenv.runtime.supervise.control import ControlChannel
from mlenv.runtime.supervise.door import HELLO_LIMIT

from tests.helpers import free_port

SECRET = "f" * 32


def channel(node: int, attempt: int, port: int, stops: list[Any], notes: list[str] | None = None,
            run_id: str = "run-1", secret: str = SECRET) -> ControlChannel:
    made = ControlChannel(node, 2, "127.0.0.1", port, lambda *stop: stops.append(stop),
                          (notes if notes is not None else []).append, selectors.DefaultSelector(), attempt=attempt,
                          run_id=run_id, secret=secret)
    made.open()
    return made


def pump(channels: list[ControlChannel], until: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, "the condition never held"
        for each in channels:
            each.tick()
            for key, _ in each.selector.select(0.05):
                key.data()


def test_a_node_of_the_next_attempt_retries_until_its_own_node_0_listens() -> None:
    port, stops = free_port(), list[Any]()
    ending = channel(0, 0, port, stops)
    early = channel(1, 1, port, stops)
    pump([ending, early], lambda: early.upstream is not None)  # it reached the ending attempt's node 0 ...
    pump([ending, early], lambda: early.upstream is None and not ending.peers)  # ... which sent it away
    assert stops == [] and not ending.waiting_for_peers()
    ending.close()
    following = channel(0, 1, port, stops)
    pump([following, early], lambda: any(peer.node == 1 for peer in following.peers) and early.connected)
    early.failure(FAILURE, time.time())
    pump([following, early], lambda: len(stops) == 2)
    assert [stop[1] for stop in stops] == [3, 3]
    following.close()
    early.close()


def connected(port: int, stops: list[Any], notes: list[str] | None = None) -> tuple[ControlChannel, ControlChannel]:
    hub, other = channel(0, 0, port, stops, notes), channel(1, 0, port, stops, notes)
    pump([hub, other], lambda: any(peer.node == 1 for peer in hub.peers) and other.connected)
    return hub, other


FAILURE = FirstFailure(2, 1, 3, None, "exited with 3", [])


def test_node_0_whose_ranks_succeeded_names_a_later_failure_before_it_ends() -> None:
    port, stops = free_port(), list[Any]()
    hub, other = connected(port, stops)
    hub.done()  # node 0's ranks all succeeded
    assert hub.waiting_for_peers()  # node 1 runs on
    other.failure(FAILURE, time.time())
    other.done()
    pump([hub, other], lambda: all(peer.done for peer in hub.peers))
    assert hub.waiting_for_peers() and stops == []  # node 1 has ended, but its failure is not named yet
    pump([hub, other], lambda: not hub.waiting_for_peers())
    assert [(stop[1], stop[2]) for stop in stops] == [(3, FAILURE), (3, FAILURE)]  # node 0 and node 1 stop
    hub.close()
    other.close()


def test_a_node_whose_ranks_succeeded_stays_until_node_0_ends_and_hears_of_a_later_failure() -> None:
    port, stops = free_port(), list[Any]()
    hub, other = connected(port, stops)
    other.done()  # node 1's ranks all succeeded
    pump([hub, other], lambda: not hub.waiting_for_peers())
    assert other.waiting_for_peers()  # until node 0 has ended
    hub.failure(replace(FAILURE, node=0, rank=0), time.time())
    pump([hub, other], lambda: len(stops) == 2)
    assert [stop[1] for stop in stops] == [3, 3]
    hub.close()
    pump([hub, other], lambda: not other.waiting_for_peers())
    assert len(stops) == 2  # node 0's leaving after it ended is no failure
    other.close()


def test_node_0_listens_on_the_master_s_address_only() -> None:
    port, stops = free_port(), list[Any]()
    hub = channel(0, 0, port, stops)
    assert hub.door is not None and hub.door.server.getsockname()[:2] == ("127.0.0.1", port)
    hub.close()


@pytest.mark.parametrize("lines", [
    [{"hello": 1, "attempt": 0}, {"stop": "forged", "exit_code": 143}],
    [{"hello": 1, "attempt": 0, "run": "run-1", "secret": "0" * 32},
     {"failure": {"rank": 3, "node": 1, "exit_code": 9}, "ended": 0, "run": "run-1", "secret": "0" * 32}],
    [{"stop": "forged", "exit_code": 143}],
])
def test_a_stranger_without_the_secret_is_dropped_noted_and_never_obeyed(lines: list[dict[str, Any]]) -> None:
    port, stops, notes = free_port(), list[Any](), list[str]()
    hub = channel(0, 0, port, stops, notes)
    with socket.create_connection(("127.0.0.1", port)) as stranger:
        stranger.sendall(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
        pump([hub], lambda: bool(notes))
    assert notes == ["dropped a control connection from 127.0.0.1: bad secret (said once)"]
    assert hub.door is not None and not hub.door.callers and not hub.peers
    assert stops == [] and not hub.waiting_for_peers()
    hub.close()


def test_a_connection_that_closes_or_stays_silent_is_no_lost_node() -> None:
    port, stops, notes = free_port(), list[Any](), list[str]()
    hub = channel(0, 0, port, stops, notes)
    socket.create_connection(("127.0.0.1", port)).close()  # connect and close
    assert hub.door is not None
    with socket.create_connection(("127.0.0.1", port)) as silent:
        pump([hub], lambda: len(hub.door.callers) == 1)
        assert not hub.waiting_for_peers()  # a connection that said nothing keeps no run going
        hub.done()
        assert not hub.waiting_for_peers()
        assert stops == []
        silent.sendall(b"x" * (HELLO_LIMIT + 1))  # no line within the hello's limit: dropped
        pump([hub], lambda: not hub.door.callers)
    assert stops == [] and notes == [f"dropped a control connection from 127.0.0.1: longer than {HELLO_LIMIT} "
                                     "bytes (said once)"]
    hub.close()


def test_a_connection_that_never_says_hello_is_closed_within_the_deadline() -> None:
    port, stops, notes = free_port(), list[Any](), list[str]()
    hub = channel(0, 0, port, stops, notes)
    assert hub.door is not None
    hub.door.deadline = 0.5
    with socket.create_connection(("127.0.0.1", port), timeout=10) as silent, silent.makefile("rb") as lines:
        pump([hub], lambda: bool(hub.door and hub.door.callers))
        assert b'"challenge"' in lines.readline()
        started = time.monotonic()
        pump([hub], lambda: bool(notes))
        assert lines.readline() == b""  # closed by node 0
        assert 0.5 <= time.monotonic() - started < 2.5
    assert notes == ["dropped a control connection from 127.0.0.1: no answer to its challenge in 0.5 s (said once)"]
    assert stops == [] and not hub.door.callers and not hub.peers
    hub.close()


def test_a_node_of_another_run_is_turned_away_and_runs_on_without_the_channel() -> None:
    port, stops, notes, theirs = free_port(), list[Any](), list[str](), list[str]()
    hub = channel(0, 0, port, stops, notes)
    other = channel(1, 0, port, stops, theirs, run_id="run-2")
    pump([hub, other], lambda: bool(notes) and other.upstream is None and bool(theirs))
    assert notes == ["turned away node 1 of run \"run-2\" from 127.0.0.1 (this is run run-1)"]
    assert theirs[0] == f'node 0 at 127.0.0.1:{port} refused this node: "this is run run-1"'
    assert stops == [] and not hub.peers and not other.waiting_for_peers()
    other.failure(FAILURE, time.time())  # its own failure stops only its own node
    pump([hub, other], lambda: len(stops) == 1)
    assert not hub.stopped
    hub.close()
    other.close()


def test_a_stranger_holding_node_0_s_port_learns_no_secret_and_stops_no_node() -> None:
    """A listener that is not node 0 sends a challenge, reads the hello and closes: the node never sends the secret,
    tries a few times, then runs on without the channel."""
    stops, notes, heard = list[Any](), list[str](), list[bytes]()
    with socket.create_server(("127.0.0.1", 0)) as squatter:
        port = squatter.getsockname()[1]
        node = channel(1, 0, port, stops, notes)
        squatter.settimeout(0.05)
        for _ in range(control.UNPROVEN_TRIES):
            pump([node], lambda: node.upstream is not None)
            connection, _ = squatter.accept()
            with connection:
                connection.sendall(json.dumps({"challenge": proofs.nonce()}).encode() + b"\n")
                connection.settimeout(0.05)

                def hello(connection: socket.socket = connection) -> bool:
                    with contextlib.suppress(TimeoutError):
                        heard.append(connection.recv(4096))
                    return heard[-1:] != [] and heard[-1].endswith(b"\n")

                pump([node], hello)
            pump([node], lambda: node.upstream is None)
    assert all(b'"hello": 1' in line and SECRET.encode() not in line for line in heard if line), heard
    assert stops == [] and not node.waiting_for_peers()
    assert notes == [f"warning: 127.0.0.1:{port} did not prove the run's secret in {control.UNPROVEN_TRIES} tries (not "
                     "this run's node 0): no control channel, a failure on another node will not stop this one"]
    node.close()


def test_a_silent_node_is_lost_and_a_busy_loop_is_not_silence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 1 stops beating and reading (frozen): node 0 names it lost after the silence and stops; node 0's own
    loop held up for longer than the silence (a stack sample) first counts every node as heard."""
    monkeypatch.setattr(control, "BEAT_SECONDS", 0.1)
    port, stops, notes = free_port(), list[Any](), list[str]()
    hub = channel(0, 0, port, stops, notes)
    hub.silence = 1.0
    other = channel(1, 0, port, stops)
    pump([hub, other], lambda: any(peer.node == 1 for peer in hub.peers) and other.connected)
    pump([hub, other], lambda: other.beating is not None and hub.beating is not None)
    hub.ticked -= 5.0  # node 0's loop was held up for 5 s: it heard nobody meanwhile, nobody is silent for it
    for peer in hub.peers:
        peer.heard -= 5.0
    hub.tick()
    assert stops == [] and any(peer.node == 1 for peer in hub.peers)
    assert other.beating is not None
    other.beating.set()  # node 1 freezes: no more beats, no more reading
    silent: list[tuple[int, NodeFault]] = []
    hub.on_lost = lambda node, sign: silent.append((node, sign))
    pump([hub], lambda: bool(stops), seconds=5)
    assert silent == [(1, NodeFault(FaultSign.UNREACHABLE, "node 0 heard nothing from it for 1 s"))]
    assert stops[0][0] == "lost node 1 (nothing heard for 1 s: frozen, or cut off)"
    assert "node 1 stopped answering (nothing heard for 1 s: frozen, or cut off)" in notes
    assert not hub.waiting_for_peers()  # node 0 does not wait for a node it lost
    hub.close()
    other.close()


def test_a_silent_node_0_is_named_lost_by_the_node_that_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 0 stops beating and reading (frozen): node 1 records node 0 lost (node 0 records nothing of its own)
    and stops; status names node 0, and node 1, which stopped for it, is not the failure."""
    from mlenv.core.runrecords import latest_run
    from mlenv.runtime.records.states import NodeEnd, RunState

    monkeypatch.setattr(control, "BEAT_SECONDS", 0.1)
    port, stops = free_port(), list[Any]()
    hub, other = connected(port, stops)
    other.silence = 1.0
    lost: list[tuple[int, NodeFault]] = []
    other.on_lost = lambda node, sign: lost.append((node, sign))
    pump([hub, other], lambda: other.beating is not None and hub.beating is not None)
    assert hub.beating is not None
    hub.beating.set()  # node 0 freezes: no more beats, no more reading
    pump([other], lambda: bool(stops), seconds=5)
    sign = NodeFault(FaultSign.UNREACHABLE, "node 1 heard nothing from it for 1 s")
    assert lost == [(0, sign)] and stops[0][:2] == ("lost the control channel to node 0 (nothing heard for 1 s: "
                                                    "frozen, or cut off)", 1)
    run = latest_run("r", {0: {"state": "running", "exit_code": None},
                           1: {"state": "failed", "exit_code": 1, "lost_nodes": {"0": sign.to_dict()}}})
    assert run.node_faults == {0: sign} and run.state is RunState.FAILED
    assert run.nodes == {0: NodeEnd(RunState.FAILED), 1: NodeEnd(RunState.STOPPED, 1)}
    hub.close()
    other.close()


def test_a_node_whose_connection_closes_before_its_job_ended_is_lost() -> None:
    """Node 1's supervisor is killed (its connection closes without its job's end): node 0 records it lost, its
    ``unreachable`` sign marked ``closed`` (a node's own record says more), and stops."""
    port, stops = free_port(), list[Any]()
    hub = channel(0, 0, port, stops)
    other = channel(1, 0, port, stops)
    lost: list[tuple[int, NodeFault]] = []
    hub.on_lost = lambda node, sign: lost.append((node, sign))
    pump([hub, other], lambda: any(peer.node == 1 for peer in hub.peers) and other.connected)
    other.close()
    pump([hub], lambda: bool(stops), seconds=5)
    assert lost == [(1, NodeFault(FaultSign.UNREACHABLE, control.CLOSED, closed=True))]
    assert stops[0][0] == "lost node 1"
    hub.close()


def test_the_closed_channel_s_words_decide_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 0's words for a closed connection are only shown: in other words the node's own record still says more
    (status, the restart policy), and ssh's 255 without a record of the run still replaces it; a silence in the very
    same words is still a silence."""
    from mlenv.core.capabilities import LaunchOutcome
    from mlenv.core.runrecords import latest_run
    from mlenv.ops.launch import attempt_facts
    from mlenv.runtime.records.restartpolicy import History

    monkeypatch.setattr(control, "CLOSED", "node 1 hung up on node 0")
    port, stops = free_port(), list[Any]()
    hub, other = connected(port, stops)
    lost: list[tuple[int, NodeFault]] = []
    hub.on_lost = lambda node, sign: lost.append((node, sign))
    other.close()
    pump([hub], lambda: bool(stops), seconds=5)
    hub.close()
    ((_, closed),) = lost
    assert (closed.evidence, closed.closed) == ("node 1 hung up on node 0", True)
    gone = NodeFault(FaultSign.UNREACHABLE, "the node's supervisor (pid 7) is gone without an exit status")
    silent = NodeFault(FaultSign.UNREACHABLE, "node 1 hung up on node 0")  # a silence, whatever its words
    for sign, found in ((closed, gone), (silent, silent)):
        run = latest_run("r", {0: {"state": "failed", "exit_code": 1, "lost_nodes": {"1": sign.to_dict()}},
                               1: {"state": "failed", "exit_code": None, "node_fault": gone.to_dict()}})
        assert run.node_faults == {1: found}
    run = latest_run("r", {0: {"state": "failed", "exit_code": 1, "lost_nodes": {"1": closed.to_dict()}}, 1: None})
    verdict = attempt_facts(LaunchOutcome(1, {0: 1, 1: 255}, {}, 0, hosts={0: "a", 1: "b"}), run, 0).judged(History())
    assert [(out.node, out.reason) for out in verdict.left_out] == [
        (1, "unreachable: exit 255 and no record of the run there")]


def test_a_preemption_reaches_every_node_as_one() -> None:
    """A node whose pod is taken away stops the job as a preemption: every node is told so, typed (never by the
    reason's words), and a user's stop is no preemption."""
    for preempted in (True, False):
        port, stops = free_port(), list[Any]()
        hub, other = connected(port, stops)
        other.stop("the pod was taken away, in any words", 143, preempted)
        pump([hub, other], lambda told=stops: len(told) == 2)
        assert [(stop[1], stop[3]) for stop in stops] == [(143, preempted)] * 2
        hub.close()
        other.close()


FORGED = {"replay": "out of sequence (line '", "alter": "bad MAC"}
"""How node 0 names each forgery of ``forge`` (the start of its words)."""


def forge(node: ControlChannel, how: str) -> None:
    """``node`` sends node 0 a true line, then that line again (``replay``) or a forged stop under the next line's
    MAC (``alter``)."""
    upstream = node.upstream
    assert upstream is not None and upstream.seal is not None
    with node.sending:  # not between the heartbeat thread's lines
        beat, following = upstream.seal.seal(b'{"beat": true}'), upstream.seal.seal(b'{"beat": true}')
        forged = beat if how == "replay" else following.replace(b'{"beat": true}', b'{"stop": "forged"}')
        upstream.sock.sendall(beat + forged)


@pytest.mark.parametrize("how", sorted(FORGED))
def test_a_replayed_or_altered_line_closes_the_connection_and_is_never_obeyed(how: str) -> None:
    """Node 1's line sent twice, or another body under its MAC: node 0 drops the connection (node 1 is lost, as when
    its connection breaks), never obeys the line."""
    port, stops, notes = free_port(), list[Any](), list[str]()
    hub, other = connected(port, stops)
    hub.note = notes.append
    forge(other, how)
    pump([hub], lambda: bool(stops))
    assert stops[0][:2] == ("lost node 1", 1) and not hub.peers
    (note,) = notes
    assert note.startswith(f"dropped a control message from 127.0.0.1: {FORGED[how]}"), note
    hub.close()
    other.close()


def test_an_altered_line_from_node_0_stops_the_node() -> None:
    port, stops, notes = free_port(), list[Any](), list[str]()
    hub, other = connected(port, stops)
    other.note = notes.append
    (peer,) = hub.peers
    assert peer.seal is not None
    with hub.sending:
        peer.sock.sendall(peer.seal.seal(b'{"beat": true}').replace(b'{"beat": true}', b'{"stop": "forged"}'))
    pump([other], lambda: bool(stops))
    assert stops[0][:2] == ("lost the control channel to node 0", 1)
    assert notes == ["dropped a control message from 127.0.0.1: bad MAC"]
    hub.close()
    other.close()


def test_an_error_in_handling_a_node_s_message_drops_its_connection_not_node_0() -> None:
    """An exception of node 0's own handling (here an observer's) ends that connection, noted with the peer, and
    never the supervisor's loop."""
    port, stops, notes = free_port(), list[Any](), list[str]()
    hub, other = connected(port, stops, notes)

    def observer(message: dict[str, Any]) -> None:
        raise RuntimeError(f"cannot take {message}")

    hub.on_message = observer
    other.relay({"stack": 1})
    pump([hub, other], lambda: len(stops) == 2)
    assert "dropped a control message from 127.0.0.1: RuntimeError cannot take {'stack': 1}" in notes
    assert stops[0][0] == "lost node 1"
    hub.close()
    other.close()
