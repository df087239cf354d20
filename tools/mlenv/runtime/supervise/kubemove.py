"""Moving a detached run off a Kubernetes node judged faulty, from inside the run (``scheduling.move_faulty_pods``).

Node 0's supervisor holds no right to do it: its container has no ServiceAccount token. It writes its verdict (the
run, the attempt, the left-out nodes and the variables handed to the next attempt) for the pod's mover, a container
of its own with the token (supervise/podmover.py), in the directory both mount (:data:`MOVE_DIR`, named by the pod
template), and waits for the mover's answer. The mover keeps the StatefulSet's pods off the Kubernetes nodes of
the left-out nodes' pods and records the move in the pod template (runlayout.LEFT_OUT_ANNOTATION). The StatefulSet
then replaces every pod. Each new pod reads that through the downward API (LEFT_OUT), and its PID 1 resumes its
share of the run as the next attempt (supervise/detached.py ``resume``), with the handed variables only where they
are the ones a move hands (podmover.handed_env). mlenv records the left-out nodes from the pods' annotation when it
next looks (backends/kubernetes/exclusion.py).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..records.runlayout import LEFT_OUT, MOVE_DIR, MOVES_PODS
from .podmover import ANSWER, REQUEST, handed_env

if TYPE_CHECKING:
    from ..records.states import LeftOut

ANSWER_TIMEOUT = 60.0
"""Seconds the mover gets to answer (it makes three API calls)."""
POLL_SECONDS = 0.2


def enabled(environ: Mapping[str, str]) -> bool:
    """Whether this run's pods may move themselves off a faulty node."""
    return bool(environ.get(MOVES_PODS))


@dataclass(frozen=True)
class MovedNode:
    """A node a move left out: its number, the host its pod was moved off, why, and whether that is recorded on the
    deployment (a node-fault sign) or held for the run only."""

    node: int
    host: str
    reason: str
    saved: bool


@dataclass(frozen=True)
class RecordedMove:
    """A detached run's move of its pods, as a LEFT_OUT_ANNOTATION records it (podmover.py writes it): the run and
    attempt (None where the record names none), the variables it hands the next attempt (only those a move may
    hand: none where the record holds anything else) and the nodes it left out (a part that is none is left out)."""

    run: str | None
    attempt: int | None
    env: dict[str, str]
    nodes: tuple[MovedNode, ...]


def recorded(annotation: str) -> RecordedMove | None:
    """The move a LEFT_OUT_ANNOTATION records; None for none, or for a value that is not one."""
    try:
        move = json.loads(annotation) if annotation else None
    except ValueError:
        return None
    if not isinstance(move, dict) or not isinstance(move.get("nodes"), list):
        return None
    run, attempt = move.get("run"), move.get("attempt")
    nodes = tuple(MovedNode(entry["node"], str(entry["host"]), str(entry.get("reason")), bool(entry.get("saved")))
                  for entry in move["nodes"]
                  if isinstance(entry, dict) and entry.get("host") and isinstance(entry.get("node"), int))
    return RecordedMove(run if isinstance(run, str) else None,
                        attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
                        handed_env(move.get("env") or {}) or {}, nodes)


def moved(environ: Mapping[str, str], run_id: str, attempt: int) -> dict[str, str] | None:
    """The variables that attempt ``attempt`` of run ``run_id`` hands its next one, where this pod was made again
    because that attempt moved the run's pods (its :data:`LEFT_OUT`); None where it did not. Only the variables a
    move hands, with values of their shape: an annotation with anything else hands nothing."""
    move = recorded(environ.get(LEFT_OUT, ""))
    if move is None or move.run != run_id or move.attempt != attempt:
        return None
    return move.env


class MoveError(Exception):
    """The mover refused, or did not answer: what it said."""


def move(environ: Mapping[str, str], left_out: Sequence[LeftOut], run_id: str, attempt: int,
         handed: Mapping[str, str]) -> list[str]:
    """Have the pod's mover keep the StatefulSet's pods off the Kubernetes nodes of ``left_out``'s pods and record
    the move (attempt ``attempt`` of run ``run_id``, with the variables ``handed`` to the next one): every pod is
    replaced. The nodes kept off; MoveError where the mover refused or the API refused it."""
    directory = Path(environ.get(MOVE_DIR) or "")
    if not environ.get(MOVE_DIR) or not directory.is_dir():
        raise MoveError(f"the pod has no mover ({MOVE_DIR} names no directory)")
    ident = secrets.token_hex(8)
    request = {"id": ident, "run": run_id, "attempt": attempt, "env": dict(handed),
               "nodes": [{"node": out.node, "reason": out.reason, "saved": out.saved} for out in left_out]}
    partial = directory / f".{REQUEST}.{os.getpid()}"
    partial.write_text(json.dumps(request), encoding="utf-8")
    partial.chmod(0o644)
    partial.replace(directory / REQUEST)
    deadline = time.monotonic() + ANSWER_TIMEOUT
    while time.monotonic() < deadline:
        try:
            said = json.loads((directory / ANSWER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            said = None
        if isinstance(said, dict) and said.get("id") == ident:
            if isinstance(said.get("away"), list):
                return [str(host) for host in said["away"]]
            raise MoveError(str(said.get("error")))
        time.sleep(POLL_SECONDS)
    raise MoveError(f"the pod's mover did not answer in {ANSWER_TIMEOUT:g} s")
