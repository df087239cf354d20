"""Spare hosts of a detached run (``launch --detach --standby SLOT``; docs/runs.md): a standby waits on its host
until node 0's supervisor hands it a node that must be left out of the run, then runs that node's share from the
next attempt on, as the node's own host would have.

A standby listens on ``MASTER_PORT + 2 + SLOT`` of its own address among the run's standbys (``MLENV_STANDBYS``),
never on every interface (MASTER_PORT is the rendezvous, + 1 the supervisors' control channel). The nodes know the
standbys from ``MLENV_STANDBYS`` (their addresses, in slot order) and how many the run has used from
``MLENV_STANDBYS_USED``; every node decides alike from the first failures it recorded, and only node 0 talks to the
standby. The standby sends each connection a challenge (a nonce) at its door (door.py: connections served together,
at most UNPROVEN_LIMIT waiting, each for HELLO_SECONDS); node 0 answers with one JSON line: ``{"run_id", "node",
"attempt", "used"}`` hands the node over, ``{"run_id", "end": true}`` ends the standby (the run needs it no more),
with a nonce of its own and its proof, the HMAC of the challenge, that nonce and its fields under the run's control
secret (``MLENV_CONTROL_SECRET``, control.py), which itself never travels. The standby's answer (``ok``, or why
not) carries the HMAC of both nonces and the answer, so that neither a message nor an answer can be replayed, nor an
answer be made without the secret. A message without the right proof is dropped, unanswered.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..records.jsonvalue import JsonObject, JsonValue, int_of
from . import listener
from .door import Caller, Door
from .proofs import SECRET_VARIABLE, is_nonce, nonce, proof, proves

STANDBYS = "MLENV_STANDBYS"
"""The run's standbys: their hosts' addresses, comma-separated, in slot order."""
USED = "MLENV_STANDBYS_USED"
"""How many of them have taken a node's place so far."""
MARKER = "MLENV_STANDBY"
"""In a standby's environment: its pid file, so that ``stop`` finds it."""
TIMEOUT = 10.0
MESSAGE_LIMIT = 4096
TICK = 0.2


def addresses(environ: Mapping[str, str]) -> list[str]:
    """The run's standbys, in slot order."""
    return [address for address in environ.get(STANDBYS, "").split(",") if address]


def used(environ: Mapping[str, str]) -> int:
    """How many standbys have taken a node's place so far."""
    text = environ.get(USED, "")
    return int(text) if text.isdigit() else 0


def port(environ: Mapping[str, str], slot: int) -> int:
    """The standby ``slot``'s port: MASTER_PORT + 2 + slot."""
    return int(environ.get("MASTER_PORT", "29500")) + 2 + slot


def pid_file(run_dir: Path, slot: int) -> Path:
    """Where standby ``slot`` of the run records itself (its process carries the path as its marker)."""
    return run_dir / f"standby-{slot}.json"


def listen(environ: Mapping[str, str], slot: int) -> socket.socket:
    """The standby's listening socket on its own address among the run's standbys (OSError when the port is taken,
    or the run names no standby ``slot``)."""
    spares = addresses(environ)
    if slot >= len(spares):
        raise OSError(f"{STANDBYS} names no standby {slot}")
    server = listener.listen(spares[slot], port(environ, slot))
    server.set_inheritable(True)
    return server


@dataclass(frozen=True)
class Handover:
    """Node 0's message that hands node ``node`` of run ``run_id`` to a standby from attempt ``attempt`` on, with
    ``used`` standbys used then, and the values it hands on beside them (``handed``: the restart policy's)."""

    run_id: str
    node: int
    attempt: int
    used: int
    handed: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        return {"run_id": self.run_id, "node": self.node, "attempt": self.attempt, "used": self.used, **self.handed}

    @classmethod
    def from_json(cls, message: JsonObject) -> Handover:
        """The handover :meth:`to_json` wrote (TypeError on another shape)."""
        handed = {key: str(value) for key, value in message.items() if key not in _HANDOVER_KEYS}
        return cls(str(message["run_id"]), int_of(message["node"], "node"), int_of(message["attempt"], "attempt"),
                   int_of(message["used"], "used"), handed)


_HANDOVER_KEYS = ("run_id", "node", "attempt", "used")


def wait(server: socket.socket, run_id: str, secret: str) -> Handover | None:
    """Serve connections until node 0 hands a node over (its message) or ends the standby (None); a message
    without the proof of the run's ``secret`` is dropped, one of another run, or one that is not one, is answered
    and ignored."""
    taken: list[Handover | None] = []

    def answered(caller: Caller, message: JsonObject, _rest: bytes) -> str | None:
        given, theirs = message.pop("proof", None), message.pop("nonce", None)
        if not is_nonce(theirs) or not proves(secret, given, "handover", caller.challenge, theirs, _fields(message)):
            return "bad secret"
        handover = message.get("end") is True or all(isinstance(message.get(key), int) for key in _HANDOVER_KEYS[1:])
        answer = "not this run" if message.get("run_id") != run_id else "ok" if handover else "no handover"
        with caller.sock, contextlib.suppress(OSError):
            caller.sock.sendall(json.dumps({"answer": answer, "proof": proof(secret, "answer", caller.challenge,
                                                                              theirs, answer)}).encode() + b"\n")
        if answer == "ok":
            taken.append(None if message.get("end") else Handover.from_json(message))
        return None

    with selectors.DefaultSelector() as selector:
        door = Door(server, selector, lambda text: print(f"mlenv: {text}", flush=True), answered)
        try:
            while not taken:
                for key, _ in selector.select(TICK):
                    key.data()
                door.tick(time.monotonic())
        finally:
            door.close()
    return taken[0]


def send(address: str, slot: int, environ: Mapping[str, str], message: JsonObject) -> str | None:
    """Send ``message`` to standby ``slot`` at ``address``; why it failed, or None."""
    secret, ours = environ.get(SECRET_VARIABLE, ""), nonce()
    try:
        with socket.create_connection((address, port(environ, slot)), timeout=TIMEOUT) as connection, \
                connection.makefile("rb") as lines:
            challenge = _reply(lines.readline(MESSAGE_LIMIT)).get("challenge")
            signed = {**message, "nonce": ours, "proof": proof(secret, "handover", challenge, ours, _fields(message))}
            connection.sendall(json.dumps(signed).encode() + b"\n")
            reply = _reply(lines.readline(MESSAGE_LIMIT))
    except OSError as err:
        return f"cannot reach the standby at {address}:{port(environ, slot)}: {err}"
    answer = reply.get("answer")
    if not reply:
        return f"the standby at {address} answered nothing"
    if not proves(secret, reply.get("proof"), "answer", challenge, ours, answer):
        return f"the standby at {address} answered without the run's secret"
    return None if answer == "ok" else f"the standby at {address} answered {answer}"


def end_unused(environ: Mapping[str, str], run_id: str) -> None:
    """Tell the standbys no node has taken yet that the run needs them no more (best effort)."""
    for slot, address in enumerate(addresses(environ)):
        if slot >= used(environ):
            send(address, slot, environ, {"run_id": run_id, "end": True})


def stop(root: Path, run_id: str | None) -> int:
    """SIGTERM the standbys of this host under the runs root ``root`` (of run ``run_id`` only when given); how many
    there were."""
    from .reaping import marked_processes  # here: mlenv's render reads this module's names, not the reaper

    root = root.absolute()  # as the standby's run directory was made absolute (its marker)
    runs = [root / run_id] if run_id else sorted(root.glob("*"))
    count = 0
    for path in (found for run in runs for found in sorted(run.glob("standby-*.json"))):
        for pid in marked_processes(f"{MARKER}={path}".encode()):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)
                count += 1
    return count


def _fields(message: JsonObject) -> list[list[JsonValue]]:
    """A message's fields in one order, for its proof."""
    return [[key, message[key]] for key in sorted(message)]


def _reply(line: bytes) -> JsonObject:
    """A line of the standby's as a JSON object; empty when it is none."""
    try:
        reply = json.loads(line)
    except ValueError:
        return {}
    return reply if isinstance(reply, dict) else {}
