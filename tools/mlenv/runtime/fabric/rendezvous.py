"""Can the nodes reach the master's rendezvous port? Node 0 listens on it for a while (unless a job already does),
every other node connects to it, as torchrun's c10d store will."""

from __future__ import annotations

import errno
import socket
import time
from dataclasses import dataclass

CONNECT_SECONDS = 1.0
RETRY_SECONDS = 0.2


@dataclass(frozen=True)
class PortProbe:
    """What one node found: ``ok`` and the evidence, in words."""

    ok: bool
    evidence: str


def serve(port: int, clients: int, seconds: float) -> PortProbe:
    """Listen on ``port`` (every address) until ``clients`` connected or ``seconds`` passed."""
    try:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    except OSError as exc:
        return PortProbe(False, f"cannot open a socket: {exc.strerror}")
    with listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return PortProbe(True, f"port {port} is in use here: a job's rendezvous is listening on it")
            return PortProbe(False, f"cannot listen on port {port}: {exc.strerror}")
        listener.listen(max(clients, 1))
        deadline = time.monotonic() + seconds
        accepted = 0
        while accepted < clients and (left := deadline - time.monotonic()) > 0:
            listener.settimeout(left)
            try:
                connection, _ = listener.accept()
            except OSError:  # the timeout
                break
            connection.close()
            accepted += 1
    return PortProbe(True, f"listened on port {port}: {accepted} of {clients} other nodes connected")


def connect(address: str, port: int, seconds: float) -> PortProbe:
    """Connect to ``address:port``, retrying for ``seconds`` (node 0 may start listening a little later)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((address, port), timeout=CONNECT_SECONDS):
                return PortProbe(True, f"connected to {address}:{port}")
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
        if time.monotonic() + RETRY_SECONDS >= deadline:
            return PortProbe(False, f"no connection to {address}:{port} within {seconds:g} s: {reason}")
        time.sleep(RETRY_SECONDS)
