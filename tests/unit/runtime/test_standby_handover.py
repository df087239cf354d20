"""A standby's handover on real sockets: node 0's message, proven with the run's control secret, hands the node
over; one proven with another secret, or of another run, is ignored (the secret itself is never sent)."""

from __future__ import annotations

import socket
import threading
from typing import Any

from mlenv.runtime.supervise import standby
from mlenv.runtime.supervise.control import SECRET_VARIABLE


def test_only_a_message_proven_with_the_run_s_secret_hands_a_node_over() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    environ = {"MASTER_PORT": str(port - 2), SECRET_VARIABLE: "a" * 32}
    listener = standby.listen(environ, 0)
    taken: list[dict[str, Any] | None] = []
    waiting = threading.Thread(target=lambda: taken.append(standby.wait(listener, "run-1", "a" * 32)))
    waiting.start()
    handover = {"run_id": "run-1", "node": 1, "attempt": 1, "used": 1}
    stranger = standby.send("127.0.0.1", 0, {**environ, SECRET_VARIABLE: "b" * 32}, handover)
    assert stranger is not None and "answered nothing" in stranger and waiting.is_alive()
    other_run = standby.send("127.0.0.1", 0, environ, {**handover, "run_id": "run-2"})
    assert other_run == "the standby at 127.0.0.1 answered not this run" and waiting.is_alive()
    assert standby.send("127.0.0.1", 0, environ, handover) is None
    waiting.join(10)
    listener.close()
    assert taken == [handover]
