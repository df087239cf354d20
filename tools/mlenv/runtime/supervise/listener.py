"""The listening sockets of node 0's control channel and of a standby: the node's own address on the cluster
network only (the master's, the standby's), never every interface."""

from __future__ import annotations

import contextlib
import errno
import socket


def listen(address: str, port: int) -> socket.socket:
    """A listening socket on this node's ``address`` (each address it resolves to, in order; where none is this
    node's own, as behind a virtual service address, the address this node routes to it from); never every
    interface. OSError when none can be bound (at once when the port is taken on an address of this node's)."""
    error: OSError = OSError(0, f"{address} does not resolve")
    resolved = []
    with contextlib.suppress(OSError):
        resolved = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    for family, _, _, _, where in resolved:
        try:
            return socket.create_server(where[:2], family=family)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:  # an address of this node's, its port taken: say so, not another
                raise
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
