"""The node supervisors' control channel across a restart, on real sockets: a node of the next attempt that reaches
the ending attempt's node 0 is sent away to retry (no failure, no stop) and joins the next attempt's node 0."""

from __future__ import annotations

import selectors
import time
from typing import Any

from mlenv.runtime.control import ControlChannel

from tests.helpers import free_port


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


def connected(port: int, stops: list[Any]) -> tuple[ControlChannel, ControlChannel]:
    hub, other = channel(0, 0, port, stops), channel(1, 0, port, stops)
    pump([hub, other], lambda: any(peer.node == 1 for peer in hub.peers))
    return hub, other


FAILURE = {"rank": 2, "node": 1, "exit_code": 3}


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
    hub.failure({**FAILURE, "node": 0, "rank": 0}, time.time())
    pump([hub, other], lambda: len(stops) == 2)
    assert [stop[1] for stop in stops] == [3, 3]
    hub.close()
    pump([hub, other], lambda: not other.waiting_for_peers())
    assert len(stops) == 2  # node 0's leaving after it ended is no failure
    other.close()
