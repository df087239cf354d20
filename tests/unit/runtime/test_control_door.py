"""The door where strangers wait to prove the run's secret (door.py), on real sockets: at most UNPROVEN_LIMIT wait,
the oldest dropped first, said once; an error of the owner's drops that connection only; out of descriptors (a
process under a tight RLIMIT_NOFILE), a flood is refused, said once, without a busy loop, and a connection that
answers afterwards still reaches the owner."""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from mlenv.runtime.supervise.door import UNPROVEN_LIMIT, Caller, Door

from tests.helpers import ROOT

# A door in a process that keeps FREE descriptors beyond those it holds; SIGUSR1 gives it 8 more, and it says how
# many rounds its loop has made. It prints its notes and each answer it is given.
DOOR = """\
import json, os, resource, selectors, signal, socket, sys, time
from mlenv.runtime.supervise.door import Door

server = socket.create_server(("127.0.0.1", 0))
selector = selectors.DefaultSelector()
def answered(caller, message, rest):
    print("answered", json.dumps(message), flush=True)
    caller.sock.close()
door = Door(server, selector, lambda text: print("note", text, flush=True), answered)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
held = [int(fd) for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}")]  # not listdir's
top = max(held) + 1 + int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))
relieved = []
signal.signal(signal.SIGUSR1, lambda *_: relieved.append(True))
print("port", server.getsockname()[1], flush=True)
deadline, rounds = time.monotonic() + 30, 0  # a test that fails ends
while time.monotonic() < deadline:
    for key, _ in selector.select(0.1):
        key.data()
    door.tick(time.monotonic())
    rounds += 1
    if relieved == [True]:
        relieved.append(True)
        resource.setrlimit(resource.RLIMIT_NOFILE, (top + 8, hard))
        print("rounds", rounds, flush=True)
"""
EMFILE_NOTE = "note cannot accept a connection (Too many open files, EMFILE): refusing while it lasts (said once)"


def pump(door: Door, until: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, "the condition never held"
        for key, _ in door.selector.select(0.05):
            key.data()
        door.tick(time.monotonic())


def closed(connection: socket.socket) -> bool:
    """The other end closed ``connection`` (after its challenge)."""
    connection.settimeout(5)
    with connection.makefile("rb") as lines:
        return b'"challenge"' in lines.readline() and lines.readline() == b""


def test_at_most_the_limit_wait_and_the_oldest_is_dropped_first_said_once() -> None:
    notes: list[str] = []
    with socket.create_server(("127.0.0.1", 0)) as server, selectors.DefaultSelector() as selector:
        door = Door(server, selector, notes.append, lambda *_: None)
        strangers = []
        for count in range(1, UNPROVEN_LIMIT + 7):
            strangers.append(socket.create_connection(server.getsockname()))
            pump(door, lambda count=count: len(door.callers) == min(count, UNPROVEN_LIMIT)
                 and not door.selector.select(0))
        assert all(closed(stranger) for stranger in strangers[:6])  # the six oldest
        assert sorted(caller.sock.getpeername() for caller in door.callers.values()) == sorted(
            stranger.getsockname() for stranger in strangers[6:])
        assert notes == [f"more than {UNPROVEN_LIMIT} connections waiting to prove the run's secret: dropping the "
                         "oldest first (said once)"]
        for stranger in strangers:
            stranger.close()
        door.close()


def test_an_error_of_the_owner_drops_that_connection_and_the_door_stays() -> None:
    notes: list[str] = []
    answers: list[dict[str, Any]] = []

    def answered(caller: Caller, answer: dict[str, Any], _rest: bytes) -> str | None:
        if answer.get("boom"):
            raise RuntimeError("boom")
        answers.append(answer)
        caller.sock.close()
        return None

    with socket.create_server(("127.0.0.1", 0)) as server, selectors.DefaultSelector() as selector:
        door = Door(server, selector, notes.append, answered)
        for answer in ({"boom": True}, {"boom": True}, {"hello": 1}):
            with socket.create_connection(server.getsockname()) as caller:
                caller.sendall(json.dumps(answer).encode() + b"\n")
                pump(door, lambda: bool(notes) and not door.callers and not door.selector.select(0))
        assert answers == [{"hello": 1}]
        assert notes == ["dropped a connection from 127.0.0.1: RuntimeError while answering it (said once)"]
        door.close()


@pytest.fixture
def tight_door(request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[str], int, list[str]]]:
    """A door in a process with ``request.param`` descriptors to spare: the process, its port, its lines so far."""
    process = subprocess.Popen([sys.executable, "-c", DOOR, str(request.param)], stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT / "tools")})
    assert process.stdout is not None
    first = process.stdout.readline()
    assert first.startswith("port "), first
    try:
        yield process, int(first.split()[1]), []
    finally:
        process.kill()
        process.wait()
        process.stdout.close()


def read_until(process: subprocess.Popen[str], lines: list[str], start: str) -> str:
    """Read the process's lines into ``lines`` until one starts with ``start`` (its stdout ends when it does):
    that line."""
    assert process.stdout is not None
    while not (found := [line for line in lines if line.startswith(start)]):
        line = process.stdout.readline()
        assert line, lines
        lines.append(line.rstrip("\n"))
    return found[0]


def answer(port: int) -> None:
    """Connect, wait for the challenge, answer it."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as caller, caller.makefile("rb") as replies:
        assert b'"challenge"' in replies.readline()
        caller.sendall(b'{"hello": 1}\n')


@pytest.mark.parametrize("tight_door", [4], indirect=True)
def test_out_of_descriptors_a_flood_is_refused_said_once_and_an_answer_still_comes_through(
        tight_door: tuple[subprocess.Popen[str], int, list[str]]) -> None:
    process, port, lines = tight_door
    flood = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(40)]
    read_until(process, lines, EMFILE_NOTE)
    for stranger in flood:
        stranger.close()
    answer(port)
    read_until(process, lines, 'answered {"hello": 1}')
    assert lines.count(EMFILE_NOTE) == 1 and process.poll() is None, lines
    assert [line for line in lines if line.startswith("note")] == [EMFILE_NOTE], lines


@pytest.mark.parametrize("tight_door", [0], indirect=True)
def test_with_no_descriptor_to_free_accepting_pauses_instead_of_spinning(
        tight_door: tuple[subprocess.Popen[str], int, list[str]]) -> None:
    process, port, lines = tight_door
    with socket.create_connection(("127.0.0.1", port), timeout=20) as waiting:
        read_until(process, lines, EMFILE_NOTE)
        time.sleep(1.0)  # a window in which a busy loop would make thousands of rounds, not a wait for anything
        process.send_signal(signal.SIGUSR1)  # descriptors again: the connection waiting in the backlog is served
        with waiting.makefile("rb") as replies:
            assert b'"challenge"' in replies.readline()
    assert int(read_until(process, lines, "rounds ").split()[1]) < 200  # about 12 a second, paused; spinning, 1000s
    answer(port)
    read_until(process, lines, 'answered {"hello": 1}')
    assert [line for line in lines if line.startswith("note")] == [EMFILE_NOTE], lines
