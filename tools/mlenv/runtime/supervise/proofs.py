"""What proves the run's control secret (``MLENV_CONTROL_SECRET``) without sending it: the handshakes' proofs
(HMAC-SHA256 of their parts, nonces of both ends among them, so that none can be replayed) and, on a connection
whose ends proved it, the MAC that seals each line.

A sealed line is ``SEQUENCE MAC BODY``: ``MAC = HMAC(secret, [server nonce, client nonce, direction, SEQUENCE] +
newline + BODY)``, each direction of a connection counting its lines from 0. A line of another connection (other
nonces), of the other direction, out of its turn or altered does not open."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

SECRET_VARIABLE = "MLENV_CONTROL_SECRET"  # noqa: S105 (the name of a variable)
"""The run's control secret, in every node's environment (never on a command line, in a file or a log)."""

NONCE_BYTES = 16
UP = "up"
"""A node's lines to node 0."""
DOWN = "down"
"""Node 0's lines to a node."""


def nonce() -> str:
    """A fresh random nonce (hex)."""
    return secrets.token_hex(NONCE_BYTES)


def is_nonce(value: object) -> bool:
    """Whether ``value`` is a nonce as ``nonce`` makes them."""
    return isinstance(value, str) and len(value) == 2 * NONCE_BYTES and all(c in "0123456789abcdef" for c in value)


def proof(secret: str, *parts: object) -> str:
    """The HMAC-SHA256 of ``parts`` (as JSON) under ``secret``: what proves the secret without sending it."""
    return hmac.new(secret.encode(), json.dumps(parts).encode(), hashlib.sha256).hexdigest()


def proves(secret: str, given: object, *parts: object) -> bool:
    """Whether ``given`` is the proof of ``parts`` under ``secret`` (compared in constant time)."""
    return hmac.compare_digest(str(given or "").encode(), proof(secret, *parts).encode())


class Unsealed(ValueError):
    """A line that does not open (its message says why)."""


@dataclass
class Seal:
    """One proven connection's lines: those this end sends, sealed in turn; those it reads, opened in turn."""

    secret: str
    server: str
    """The nonce of the end that listens (node 0's challenge)."""
    client: str
    """The nonce of the end that connected."""
    sends: str
    """This end's direction, UP or DOWN."""
    sent: int = 0
    opened: int = 0

    def seal(self, body: bytes) -> bytes:
        """``body`` (JSON, no newline) as the next line this end sends, newline included."""
        line = b"%d %s %s\n" % (self.sent, self._mac(self.sends, self.sent, body), body)
        self.sent += 1
        return line

    def open(self, line: bytes) -> bytes:
        """The body of ``line``, the next line from the other end; Unsealed when out of turn or altered."""
        sequence, _, rest = line.partition(b" ")
        mac, _, body = rest.partition(b" ")
        if not sequence.isdigit() or int(sequence) != self.opened:
            raise Unsealed(f"out of sequence (line {sequence[:12].decode(errors='replace')!r}, expected "
                           f"{self.opened})")
        if not hmac.compare_digest(mac, self._mac(UP if self.sends == DOWN else DOWN, self.opened, body)):
            raise Unsealed("bad MAC")
        self.opened += 1
        return body

    def _mac(self, direction: str, sequence: int, body: bytes) -> bytes:
        head = json.dumps(["line", self.server, self.client, direction, sequence]).encode()
        return hmac.new(self.secret.encode(), head + b"\n" + body, hashlib.sha256).hexdigest().encode()


def secret_of(environ: Mapping[str, str]) -> str | None:
    """The run's control secret from the environment, or None where there is none."""
    return environ.get(SECRET_VARIABLE) or None
