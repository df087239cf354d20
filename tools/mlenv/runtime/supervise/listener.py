"""Node 0's listening socket for the control channel: the master's address only, never every interface."""

from __future__ import annotations

import contextlib
import socket


def listen(address: str, port: int) -> socket.socket:
    """Node 0's listening socket on the master's address (each address it resolves to, in order; where none is this
    node's own, as behind a virtual service address, the address this node routes to it from); never every
    interface. OSError when none can be bound."""
    error: OSError = OSError(0, "the master's address does not resolve")
    with contextlib.suppress(OSError):
        for family, _, _, _, where in socket.getaddrinfo(address, port, type=socket.SOCK_STREAM):
            try:
                return socket.create_server(where[:2], family=family)
            except OSError as exc:
                error = exc
    routed = _routed_from(address, port)
    if routed is None:
        raise error
    return socket.create_server((routed, port), family=socket.AF_INET6 if ":" in routed else socket.AF_INET)


def _routed_from(address: str, port: int) -> str | None:
    """This node's address towards ``address``, as the kernel routes it (no packet is sent)."""
    with contextlib.suppress(OSError):
        for family, _, _, _, where in socket.getaddrinfo(address, port, type=socket.SOCK_DGRAM):
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(where)
                return str(probe.getsockname()[0])
    return None
