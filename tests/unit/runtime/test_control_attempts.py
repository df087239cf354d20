"""The node supervisors' control channel across a restart, on real sockets: a node of the next attempt that reaches
the ending attempt's node 0 is sent away to retry (no failure, no stop) and joins the next attempt's node 0."""

from __future__ import annotations

import selectors
import socket
import time
from typing import Any

from mlenv.runtime.control import ControlChannel


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def channel(node: int, attempt: int, port: int, stops: list[Any]) -> ControlChannel:
    made = ControlChannel(node, 2, "127.0.0.1", port, lambda *stop: stops.append(stop), lambda _: None,
                          selectors.DefaultSelector(), attempt=attempt)
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
    pump([following, early], lambda: any(peer.node == 1 for peer in following.peers))
    early.failure({"rank": 2, "node": 1, "exit_code": 3}, time.time())
    pump([following, early], lambda: len(stops) == 2)
    assert [stop[1] for stop in stops] == [3, 3]
    following.close()
    early.close()
