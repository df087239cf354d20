"""A rank's output as the node supervisor reads it, through a real connection: any bytes are output (the hang
watchdog's last output, the rank's ``last_output_at``), a line updated in place with ``\\r`` (a progress bar) keeps its
tag on stdout in its latest state and is whole in the log, one line per finished state."""

from __future__ import annotations

import io
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlenv.runtime.records.runlayout import NodeDir
from mlenv.runtime.supervise.rankoutput import Connection, Reader, Sinks
from mlenv.runtime.supervise.supervisor import Supervisor
from mlenv.runtime.watch.hang import HangWatchdog
from mlenv.runtime.watch.protocol import BaseObserver, RankInfo


class Seen(BaseObserver):
    """What an observer is handed: lines and output signs, by rank."""

    def __init__(self) -> None:
        self.lines: list[tuple[int | None, str]] = []
        self.outputs: list[int] = []

    def line(self, rank: RankInfo | None, text: str) -> None:
        self.lines.append((None if rank is None else rank.rank, text))

    def output(self, rank: RankInfo) -> None:
        self.outputs.append(rank.rank)


class Rank:
    """One rank's output connection to the supervisor, as the rank wrapper opens it."""

    def __init__(self, supervisor: Supervisor, number: int) -> None:
        ours, self.sock = socket.socketpair()
        ours.setblocking(False)
        self.reader = Reader(supervisor, Connection(ours))
        self.write(f'{{"kind": "output", "rank": {number}, "local_rank": 0}}\n'.encode())

    def write(self, data: bytes) -> None:
        """Send ``data`` and have the supervisor read all of it."""
        self.sock.sendall(data)
        self.reader()  # one read takes it all: a few bytes, already sent

    def close(self) -> None:
        self.sock.close()
        self.reader()


Made = tuple[Supervisor, io.BytesIO, Seen, HangWatchdog]


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Made]:
    """A one-node supervisor (not running a launcher) with a hang watchdog, a recording observer and a log."""
    log, seen, watchdog = io.BytesIO(), Seen(), HangWatchdog(12, "stop")
    made = Supervisor(["true"], {}, 0, 1, "h", NodeDir(tmp_path, 0, 0), [seen, watchdog], Sinks([log]))
    watchdog.started(made)
    yield made, log, seen, watchdog


def test_carriage_return_updates_are_output(supervisor: Made) -> None:
    made, _, seen, watchdog = supervisor
    rank = Rank(made, 3)
    assert made.ranks_by_number[3].record.last_output_at is None and seen.outputs == []  # a header is not output
    before = watchdog.last_output
    rank.write(b"\r  5%|#         | 1/20")  # no newline: tqdm's first update
    assert watchdog.last_output > before  # the hang watchdog's silence ends
    assert made.ranks_by_number[3].record.last_output_at is not None and seen.outputs == [3]
    rank.write(b"\r 10%|##        | 2/20")
    rank.write(b"part of a line, no line end at all")
    assert seen.outputs == [3, 3, 3]


def test_a_line_updated_in_place_is_tagged_on_stdout_and_whole_in_the_log(
        supervisor: Made, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    made, log, seen, _ = supervisor
    three, four = Rank(made, 3), Rank(made, 4)
    three.write(b"\r1/3")
    assert capfdbinary.readouterr().out == b"[node-0 r3] 1/3"  # the state being written, shown at once
    assert log.getvalue() == b""  # logged once finished
    three.write(b"\r2/3\r3/3")
    assert capfdbinary.readouterr().out == b"\r[node-0 r3] 2/3\r[node-0 r3] 3/3"  # each state tagged again
    assert log.getvalue() == b"[node-0 r3] 1/3\n[node-0 r3] 2/3\n"
    four.write(b"a line of rank 4\n")  # another line ends the open one: it keeps its last state
    assert capfdbinary.readouterr().out == b"\n[node-0 r4] a line of rank 4\n"
    three.write(b"\r3/3 done\n")  # the line's last states, on a line of their own now
    three.write(b"ok\r\n")  # a line ending in \r\n is the line, as before
    assert capfdbinary.readouterr().out == b"[node-0 r3] 3/3\r[node-0 r3] 3/3 done\n[node-0 r3] ok\n"
    assert log.getvalue().decode().splitlines() == [
        "[node-0 r3] 1/3", "[node-0 r3] 2/3", "[node-0 r4] a line of rank 4", "[node-0 r3] 3/3",
        "[node-0 r3] 3/3 done", "[node-0 r3] ok"]
    assert seen.lines == [(3, "1/3"), (3, "2/3"), (4, "a line of rank 4"), (3, "3/3"), (3, "3/3 done"), (3, "ok")]
    assert list(made.ranks_by_number[3].tail) == ["3/3 done", "ok"]  # the last lines as a terminal shows them


def test_the_state_left_when_the_rank_ends_is_logged(
        supervisor: Made, capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    made, log, _, _ = supervisor
    rank = Rank(made, 0)
    rank.write(b"epoch 1\n\r 50%\r 99%")
    rank.close()
    assert capfdbinary.readouterr().out == b"[node-0 r0] epoch 1\n[node-0 r0]  50%\r[node-0 r0]  99%\n"
    assert log.getvalue() == b"[node-0 r0] epoch 1\n[node-0 r0]  50%\n[node-0 r0]  99%\n"
