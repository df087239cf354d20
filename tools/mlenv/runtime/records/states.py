"""A run's states, typed from the node to the terminal (docs/runs.md, "States"): the states, the one mapping from how
a job ended to its state (:func:`exit_state`), a node's end (``failed (7)`` is made only where it is shown:
:func:`end_text`), the node-fault signs and a node left out of a run's next attempts. Every layer decides on these
values, never on the words that show them."""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from .jsonvalue import JsonObject


class RunState(str, Enum):
    """The state of a run and of each node's share of it (and of each rank: running, succeeded, failed, stopped).
    Its value is the word records hold (state.json, ``jobs --json``, ``latest_run``), as before it was typed."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    HUNG = "hung"
    RESTARTING = "restarting"
    REQUEUED = "requeued"
    PREEMPTED = "preempted"
    NODE_FAILURE = "node-failure"
    """How an attempt ended, only (Slurm's ``ended`` file): the scheduler lost a node of it; the run reads failed."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, value: object) -> RunState | None:
        """The state ``value`` names; None for anything else (none recorded, a word this version does not know)."""
        try:
            return cls(value)
        except ValueError:
            return None


STOP_CODES = frozenset(128 + number for number in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM))
"""129, 130, 143: how a job ends that a stop's signal ended (SIGHUP, SIGINT, SIGTERM: Ctrl-C, mlenv stop, scancel)."""
KILLED_CODE = 128 + signal.SIGKILL
"""137: how a job ends that SIGKILL ended (mlenv's stop after its grace, the OOM killer, anyone's kill -9)."""


class Ending(Enum):
    """What is known of how a job (a rank, a node's share, an attempt) came to end, besides its exit code."""

    CODE_ONLY = "code-only"
    """Its exit code alone (a record without a state of its own, a Slurm attempt, a batch job): a stop's signal
    code (:data:`STOP_CODES`) is taken for a stop, as docs/runs.md says of the user's stops."""
    OWN = "own"
    """Nobody asked it to stop: it ended by itself, or something other than a stop killed it."""
    STOP = "stop"
    """A stop mlenv or the user asked for reached it (mlenv stop, Ctrl-C, scancel, fail-fast's SIGTERM)."""
    KILLED = "killed"
    """A stop reached it, and mlenv escalated it to SIGKILL after its grace."""
    PREEMPTION = "preemption"
    """The scheduler took it away (a pod of the run deleted or evicted): a stop that is no failure."""
    COLLATERAL = "collateral"
    """It ended while its job was being stopped for something else (another rank's failure, a stop of the whole
    run, a node its supervisor lost: silent, or gone): whatever its code, the failure is not its own."""
    LOST = "lost"
    """The scheduler lost a node of it (a node failure, a drain): never anyone's stop."""


_STOPS = frozenset({Ending.CODE_ONLY, Ending.STOP, Ending.KILLED, Ending.PREEMPTION})


def exit_state(code: int | None, ending: Ending = Ending.CODE_ONLY) -> RunState:
    """The one mapping from how a job ended to its state (every backend's records, the supervisor, the policy):

    - ``LOST``: node-failure, whatever the code;
    - 0: succeeded;
    - ``COLLATERAL``: stopped, whatever else it ended with;
    - no exit status (its supervisor gone): failed;
    - 129, 130, 143 (SIGHUP, SIGINT, SIGTERM) after a stop, or where only the code is known: stopped (``PREEMPTION``:
      preempted);
    - 137 (SIGKILL): stopped only where mlenv's stop escalated to it (``KILLED``), else failed (the OOM killer,
      a kill -9: a failure);
    - any other code: failed (a stop's signal that nobody asked for, ``OWN``, included)."""
    if ending is Ending.LOST:
        return RunState.NODE_FAILURE
    if code == 0:
        return RunState.SUCCEEDED
    if ending is Ending.COLLATERAL:
        return RunState.STOPPED
    if (code in STOP_CODES and ending in _STOPS) or (code == KILLED_CODE and ending is Ending.KILLED):
        return RunState.PREEMPTED if ending is Ending.PREEMPTION else RunState.STOPPED
    return RunState.FAILED


ENDED = frozenset({RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED, RunState.PREEMPTED})
"""The states of a node's share (or a run) that runs no more."""
_PRECEDENCE = (RunState.HUNG, RunState.RESTARTING, RunState.REQUEUED, RunState.PREEMPTED, RunState.FAILED,
               RunState.RUNNING, RunState.STOPPED, RunState.SUCCEEDED)


def run_state(node_states: Iterable[RunState | None]) -> RunState | None:
    """The state of a run from its nodes' states: hung, restarting, requeued or preempted on any node, else failed
    on any (the others are being stopped), else running on any, else stopped, else succeeded; None when none is
    known."""
    known = set(node_states)
    return next((state for state in _PRECEDENCE if state in known), None)


@dataclass(frozen=True)
class NodeEnd:
    """What became of a node's share of a run: its state, with its exit code once it ended (128+N: signal N)."""

    state: RunState
    exit_code: int | None = None

    def to_dict(self) -> dict[str, object]:
        return {"state": self.state.value, "exit_code": self.exit_code}

    @classmethod
    def parse(cls, data: object) -> NodeEnd | None:
        """The end :meth:`to_dict` wrote; None for anything else (nothing known of the node)."""
        if not isinstance(data, Mapping) or (state := RunState.parse(data.get("state"))) is None:
            return None
        code = data.get("exit_code")
        return cls(state, code if isinstance(code, int) and not isinstance(code, bool) else None)


def end_text(end: NodeEnd | None) -> str:
    """How a node's end reads, the one wording everywhere (status, runs, launch's summary, the runtime's jobs):
    ``failed (7)`` once it ended, ``running`` before, ``-`` when nothing is known."""
    if end is None:
        return "-"
    return end.state.value if end.exit_code is None else f"{end.state.value} ({end.exit_code})"


class FaultSign(str, Enum):
    """A node-fault sign (docs/runs.md, "Bad nodes"): the node, not the script, is at fault."""

    UNREACHABLE = "unreachable"
    """ssh exit 255 where the node has no record of the run, its supervisor gone without an exit status, or node 0
    lost it (silent, or its control connection closed)."""
    NODE_FAILURE = "node-failure"
    """The scheduler lost the node: down, failed, drained."""
    NCCL_NET = "nccl-net"
    XID = "xid"
    ECC = "ecc"
    NODE_CHECK = "node-check"
    """A failed in-node check (the launch's preflight on the node)."""
    STRAGGLER = "straggler"
    """Under ``--on-straggler exclude``: the node enters collectives last (runtime/watch/stragglers.py)."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class NodeFault:
    """A node-fault sign and the line or figures that show it."""

    sign: FaultSign
    evidence: str
    closed: bool = False
    """The sign rests on node 0's control connection to the node closing before its job ended, nothing more: any
    record of the node's own says more."""

    def to_dict(self) -> JsonObject:
        """``{"sign", "evidence"}``, and ``"closed": true`` where it is."""
        return {"sign": self.sign.value, "evidence": self.evidence, **({"closed": True} if self.closed else {})}

    @classmethod
    def parse(cls, data: object) -> NodeFault | None:
        """The sign recorded as :meth:`to_dict` writes it; None for anything else (a sign this version does not
        know)."""
        if not isinstance(data, Mapping):
            return None
        try:
            sign = FaultSign(data.get("sign"))
        except ValueError:
            return None
        return cls(sign, str(data.get("evidence")), data.get("closed") is True)


def parse_faults(data: object) -> dict[int, NodeFault]:
    """Node ordinal -> its sign, from ``{"<node>": {"sign", "evidence"}}`` (``latest_run.node_faults``, an
    attempt's ``lost.json``, node 0's ``lost_nodes``); a part that is not one is left out."""
    if not isinstance(data, Mapping):
        return {}
    return {int(node): fault for node, value in data.items()
            if str(node).isdigit() and (fault := NodeFault.parse(value)) is not None}


@dataclass(frozen=True)
class LeftOut:
    """A node the restart policy leaves out of a run's next attempts, why (as shown), and whether that is recorded
    on the deployment so that later runs leave it out too (a node-fault sign), or holds for this run only."""

    node: int
    reason: str
    saved: bool
