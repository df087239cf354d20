"""A standby's handover on real sockets: the standby listens on its own address only; node 0's message, proven with
the run's control secret over the standby's challenge, hands the node over; one proven with another secret, or of
another run, is refused; one captured on its way and replayed on another connection is refused; strangers holding
connections do not hold the handover up; an answer without the secret's proof is not believed (the secret itself is
never sent)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from mlenv.runtime.supervise import standby
from mlenv.runtime.supervise.door import HELLO_SECONDS
from mlenv.runtime.supervise.proofs import SECRET_VARIABLE, nonce

from tests.helpers import free_port

SECRET = "a" * 32
HANDOVER = {"run_id": "run-1", "node": 1, "attempt": 1, "used": 1}


@pytest.fixture
def environ() -> dict[str, str]:
    """A run whose one standby is on 127.0.0.1."""
    return {"MASTER_PORT": str(free_port() - 2), SECRET_VARIABLE: SECRET, standby.STANDBYS: "127.0.0.1"}


@contextlib.contextmanager
def waiting(environ: dict[str, str]) -> Iterator[list[standby.Handover | None]]:
    """Standby 0 waiting in a thread: what it was handed, once it was (ended at the end when still waiting)."""
    listener = standby.listen(environ, 0)
    taken: list[standby.Handover | None] = []
    thread = threading.Thread(target=lambda: taken.append(standby.wait(listener, "run-1", SECRET)), daemon=True)
    thread.start()
    try:
        yield taken
    finally:
        if thread.is_alive():
            standby.send("127.0.0.1", 0, environ, {"run_id": "run-1", "end": True})
        thread.join(10)
        listener.close()


def in_thread(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_only_a_message_proven_with_the_run_s_secret_hands_a_node_over(environ: dict[str, str]) -> None:
    with waiting(environ) as taken:
        stranger = standby.send("127.0.0.1", 0, {**environ, SECRET_VARIABLE: "b" * 32}, HANDOVER)
        assert stranger == "the standby at 127.0.0.1 answered nothing" and not taken
        other_run = standby.send("127.0.0.1", 0, environ, {**HANDOVER, "run_id": "run-2"})
        assert other_run == "the standby at 127.0.0.1 answered not this run" and not taken
        assert standby.send("127.0.0.1", 0, environ, HANDOVER) is None
    assert taken == [standby.Handover("run-1", 1, 1, 1)] and taken[0].to_json() == HANDOVER


def test_a_standby_listens_on_its_own_address_only(environ: dict[str, str]) -> None:
    with waiting(environ):
        port = standby.port(environ, 0)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.2", port), timeout=5).close()
    with pytest.raises(OSError, match="names no standby 1"):
        standby.listen(environ, 1)


def test_a_standby_whose_port_is_taken_on_its_address_says_so(environ: dict[str, str]) -> None:
    """Not another address instead (the address it routes from, 127.0.0.1 here)."""
    environ[standby.STANDBYS] = "127.0.0.4"
    with socket.create_server(("127.0.0.4", standby.port(environ, 0))), \
            pytest.raises(OSError, match=r"in use .*'127\.0\.0\.4'"):
        standby.listen(environ, 0)


def test_a_handover_captured_on_its_way_and_replayed_is_refused(
        environ: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """A listener on node 0's way (127.0.0.2) passes the standby's challenge on, keeps node 0's message and replays it
    on a connection of its own: refused, unanswered; the same message on the connection it was made for hands the
    node over."""
    port = standby.port(environ, 0)
    replayed: list[bytes] = []
    with waiting(environ) as taken, socket.create_connection(("127.0.0.1", port), timeout=10) as first, \
            first.makefile("rb") as first_lines, socket.create_server(("127.0.0.2", port)) as on_the_way:
        challenge = first_lines.readline()

        def relay() -> None:
            node_0, _ = on_the_way.accept()
            with node_0, node_0.makefile("rb") as node_0_lines:
                node_0.sendall(challenge)
                message = node_0_lines.readline()
                with socket.create_connection(("127.0.0.1", port), timeout=10) as replay, \
                        replay.makefile("rb") as replies:
                    assert b'"challenge"' in replies.readline()
                    replay.sendall(message)
                    replayed.append(replies.readline())
                first.sendall(message)
                node_0.sendall(first_lines.readline())

        relaying = in_thread(relay)
        assert standby.send("127.0.0.2", 0, environ, HANDOVER) is None
        relaying.join(10)
    assert replayed == [b""]  # closed without an answer
    assert taken == [standby.Handover("run-1", 1, 1, 1)] and taken[0].to_json() == HANDOVER
    assert "mlenv: dropped a connection from 127.0.0.1: bad secret (said once)" in capsys.readouterr().out


def test_strangers_holding_connections_do_not_hold_the_handover_up(environ: dict[str, str]) -> None:
    port = standby.port(environ, 0)
    with waiting(environ) as taken:
        strangers = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        strangers[0].sendall(b'{"run_id": "run-1", "end": true, "proof": "00"')  # no end of line
        started = time.monotonic()
        assert standby.send("127.0.0.1", 0, environ, HANDOVER) is None
        assert time.monotonic() - started < HELLO_SECONDS  # served while the strangers still wait
        for stranger in strangers:
            stranger.close()
    assert taken == [standby.Handover("run-1", 1, 1, 1)] and taken[0].to_json() == HANDOVER


def test_an_answer_without_the_secret_s_proof_is_not_believed(environ: dict[str, str]) -> None:
    """A squatter on the standby's port that says ok: node 0 does not take the node as handed over."""
    with socket.create_server(("127.0.0.1", standby.port(environ, 0))) as squatter:
        def say_ok() -> None:
            connection, _ = squatter.accept()
            with connection, connection.makefile("rb") as lines:
                connection.sendall(json.dumps({"challenge": nonce()}).encode() + b"\n")
                lines.readline()
                connection.sendall(b'{"answer": "ok", "proof": "0"}\n')

        saying = in_thread(say_ok)
        assert standby.send("127.0.0.1", 0, environ, HANDOVER) == (
            "the standby at 127.0.0.1 answered without the run's secret")
        saying.join(10)
