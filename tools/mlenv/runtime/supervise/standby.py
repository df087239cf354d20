"""Spare hosts of a detached run (``launch --detach --standby SLOT``; docs/runs.md): a standby waits on its host
until node 0's supervisor hands it a node that must be left out of the run, then runs that node's share from the
next attempt on, as the node's own host would have.

A standby listens on ``MASTER_PORT + 2 + SLOT`` of its host (MASTER_PORT is the rendezvous, + 1 the supervisors'
control channel). The nodes know the standbys from ``MLENV_STANDBYS`` (their addresses, in slot order) and how many
the run has used from ``MLENV_STANDBYS_USED``; every node decides alike from the first failures it recorded, and only
node 0 talks to the standby. A message is one JSON line: ``{"run_id", "node", "attempt", "used"}`` hands the node
over, ``{"run_id", "end": true}`` ends the standby (the run needs it no more); the standby answers ``ok``. Every
message carries its proof: the HMAC of its fields under the run's control secret (``MLENV_CONTROL_SECRET``,
control.py), which itself never travels; one without the right proof is ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .control import SECRET_VARIABLE
from .proofs import proof, proves

STANDBYS = "MLENV_STANDBYS"
"""The run's standbys: their hosts' addresses, comma-separated, in slot order."""
USED = "MLENV_STANDBYS_USED"
"""How many of them have taken a node's place so far."""
MARKER = "MLENV_STANDBY"
"""In a standby's environment: its pid file, so that ``stop`` finds it."""
TIMEOUT = 10.0
MESSAGE_LIMIT = 4096


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
    """The standby's listening socket (OSError when the port is taken)."""
    listener = socket.create_server(("", port(environ, slot)))
    listener.set_inheritable(True)
    return listener


def wait(listener: socket.socket, run_id: str, secret: str) -> dict[str, Any] | None:
    """Block until node 0 hands a node over (its message) or ends the standby (None); a message without the run's
    ``secret`` is ignored, one of another run, or one that is not one, is answered and ignored."""
    while True:
        connection, _ = listener.accept()
        with connection:
            connection.settimeout(TIMEOUT)
            try:
                message = json.loads(_line(connection))
            except (OSError, ValueError):
                continue
            if not isinstance(message, dict) or not proves(secret, message.pop("proof", None), _fields(message)):
                print(f"mlenv: dropped a message from {_peer(connection)}: bad secret", flush=True)
                continue
            if message.get("run_id") != run_id:
                with contextlib.suppress(OSError):
                    connection.sendall(b"not this run\n")
                continue
            if not message.get("end") and not all(isinstance(message.get(key), int)
                                                   for key in ("node", "attempt", "used")):
                continue
            with contextlib.suppress(OSError):
                connection.sendall(b"ok\n")
            return None if message.get("end") else message


def send(address: str, slot: int, environ: Mapping[str, str], message: Mapping[str, Any]) -> str | None:
    """Send ``message`` to standby ``slot`` at ``address``; why it failed, or None."""
    try:
        with socket.create_connection((address, port(environ, slot)), timeout=TIMEOUT) as connection:
            signed = {**message, "proof": proof(environ.get(SECRET_VARIABLE, ""), _fields(message))}
            connection.sendall(json.dumps(signed).encode() + b"\n")
            answer = _line(connection).strip()
    except OSError as err:
        return f"cannot reach the standby at {address}:{port(environ, slot)}: {err}"
    return None if answer == "ok" else f"the standby at {address} answered {answer or 'nothing'}"


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


def _fields(message: Mapping[str, Any]) -> list[list[Any]]:
    """A message's fields in one order, for its proof."""
    return [[key, message[key]] for key in sorted(message)]


def _peer(connection: socket.socket) -> str:
    """The address ``connection`` comes from."""
    with contextlib.suppress(OSError):
        return str(connection.getpeername()[0])
    return "?"


def _line(connection: socket.socket) -> str:
    """One line from ``connection`` (at most MESSAGE_LIMIT bytes)."""
    data = b""
    while b"\n" not in data and len(data) < MESSAGE_LIMIT:
        chunk = connection.recv(MESSAGE_LIMIT - len(data))
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].decode(errors="replace")
