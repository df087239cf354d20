"""A run as its nodes' supervisors recorded it, typed: read once from their records (runlayout.py's
:class:`RankRecord` and :class:`FirstFailure`, states.py's :class:`NodeFault` and :class:`NodeEnd`), and written as
``status --json``'s ``latest_run`` (docs/runs.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .goodput import Goodput, goodput
from .jsonvalue import JsonObject
from .runlayout import FirstFailure, RankRecord, parse_ranks
from .states import NodeEnd, NodeFault, RunState, parse_faults
from .timeline import NodeAttempt


@dataclass(frozen=True)
class RunRecord:
    """One run (its newest attempt) across its nodes."""

    id: str
    state: RunState | None
    """The run's state, from its nodes' states; None when none is known."""
    attempt: int
    ranks: tuple[RankRecord, ...] = ()
    """Every rank of every node, by global rank."""
    first_failure: FirstFailure | None = None
    transport: Mapping[str, Any] = field(default_factory=dict)
    """``node-N`` -> the node's transport verdict (``{"verdict", "plugin", "devices", "nccl_version"}``)."""
    stacks: Any = None
    """The hang watchdog's capture of the whole job (node 0's), if any."""
    idle: Mapping[str, Any] | None = None
    """``node-N`` -> the node's idle GPUs while the job is flagged idle; None when it is not."""
    stragglers: list[Any] | None = None
    """The straggler watch's verdict (node 0's): the ranks or nodes that enter collectives last; None without."""
    node_faults: Mapping[int, NodeFault] = field(default_factory=dict)
    """Node ordinal -> the node's own fault sign (a failed in-node check, a lost supervisor)."""
    nodes: Mapping[int, NodeEnd | None] = field(default_factory=dict)
    """Node ordinal -> its end (None: unknown): ``status``'s ``run_states``, as states.py's ``end_text`` words it."""
    exit_code: int | None = None
    """How the run ended (its newest attempt): the exit code of the node that failed first, else the first other
    node's that is not 0, else 0; None while any node of it runs, or where none is known."""
    ended_at: str | None = None
    """When its last rank ended (ISO 8601, UTC), once the run has ended; None before, or where no rank is known."""
    timeline: tuple[NodeAttempt, ...] = ()
    """Every node's share of every attempt (timeline.py): what its goodput is made of."""
    preemptions: int = 0
    """How many of its attempts ended preempted (a pod of it taken away) on some node: resumptions, not restarts."""
    goodput: Goodput | None = None
    """Where its wall time went (goodput.py, ``status --json``'s ``latest_run.goodput``); None when nothing is
    known."""

    def launched(self, at: float | None, now: float) -> RunRecord:
        """This run, launched (or submitted) at ``at`` (epoch seconds, None where unknown), with its goodput as of
        ``now``."""
        return replace(self, goodput=goodput(self.timeline, at, now))

    def to_dict(self) -> JsonObject:
        """``status --json``'s ``latest_run`` (without ``nodes``, which status prints as ``run_states``)."""
        return {"id": self.id, "state": self.state, "attempt": self.attempt,
                "ranks": [rank.to_dict() for rank in self.ranks],
                "first_failure": self.first_failure.to_dict() if self.first_failure else None,
                "transport": dict(self.transport), "stacks": self.stacks,
                "idle": dict(self.idle) if self.idle is not None else None,
                "stragglers": list(self.stragglers) if self.stragglers is not None else None,
                "node_faults": {node: fault.to_dict() for node, fault in self.node_faults.items()},
                "exit_code": self.exit_code, "ended_at": self.ended_at, "preemptions": self.preemptions,
                "goodput": self.goodput.to_json() if self.goodput is not None else None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunRecord:
        """The record :meth:`to_dict` wrote (``nodes`` too, when given: node -> ``NodeEnd.to_dict``, or null); a part
        that is not one is left out."""
        nodes = data.get("nodes")
        return cls(str(data.get("id", "")), RunState.parse(data.get("state")), int(data.get("attempt") or 0),
                   tuple(parse_ranks(data.get("ranks"))), FirstFailure.parse(data.get("first_failure")),
                   dict(data.get("transport") or {}), data.get("stacks"),
                   dict(data["idle"]) if isinstance(data.get("idle"), Mapping) else None,
                   list(data["stragglers"]) if isinstance(data.get("stragglers"), list) else None,
                   parse_faults(data.get("node_faults")),
                   {int(node): NodeEnd.parse(end)
                    for node, end in (nodes.items() if isinstance(nodes, Mapping) else ())},
                   exit_code=_int_or_none(data.get("exit_code")), ended_at=_str_or_none(data.get("ended_at")),
                   preemptions=_int_or_none(data.get("preemptions")) or 0,
                   goodput=Goodput.parse(data.get("goodput")))


def _str_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
