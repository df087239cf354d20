"""The straggler watch: an observer on every node's supervisor, on whenever the collective record is.

Every :data:`EVERY_SECONDS`, node 0 (the hub) asks every node at once for its ranks' collective records; each node
asks its ranks (a touch of the request file, never a wait in the supervisor's thread), reads what they wrote at its
next tick and sends the entry times to the hub with its own clock's time. The hub moves each node's times onto its own
clock (the difference between the node's time and the hub's when the report came in) and judges arrivals
(:mod:`mlenv.runtime.forensics.arrivals`). A straggler found, changed or gone is said on every node
(``mlenv: rank 3 (node-1) (HOST) is a straggler: ...``); each verdict is recorded as ``stragglers`` in node 0's
state.json (``status``: ``latest_run.stragglers``, ``[]`` once judged without one, null before); the job is never
stopped for it. Under ``--on-straggler exclude`` a named node carries the node-fault sign ``straggler`` while it is
named, so the restart rules leave it out at the next restart (a run that fails or is restarted for another reason).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..forensics import collectives
from ..forensics.arrivals import Straggler, entries_of, shifted, stragglers
from ..records.jsonvalue import JsonValue
from ..records.states import FaultSign, NodeFault
from .protocol import BaseObserver, JobControl

EVERY_SECONDS = 10.0
READ_AFTER_SECONDS = 1.0
"""A node reads its ranks' records this long after asking (they answer within collectives.POLL_SECONDS)."""
KIND = "straggler"


def _records(control: JobControl) -> Path:
    return control.run_dir / "stacks" / "collectives"


@dataclass(frozen=True)
class _Report:
    """A node's last report to the hub: its host, and its ranks' entry times on the hub's clock (rank -> sequence
    number -> ns)."""

    host: str
    ranks: dict[int, dict[int, int]]


class StragglerWatch(BaseObserver):
    """Name the ranks (or nodes) that enter collectives last, job-wide, every :data:`EVERY_SECONDS`."""

    def __init__(self, every: float = EVERY_SECONDS, on_straggler: str | None = None) -> None:
        self.every = every
        self.exclude = on_straggler == "exclude"
        self.mine: str | None = None
        """Under ``--on-straggler exclude``: why this node is one (its node-fault sign's evidence)."""
        self.next_sample = time.monotonic() + every
        self.asked: tuple[int, float] | None = None  # this node: (token, when to read)
        self.reports: dict[int, _Report] = {}  # the hub: node -> its last report, on the hub's clock
        self.named: list[str] = []
        self.recorded: tuple[Straggler, ...] | None = None  # node 0: the verdict in its state.json

    def tick(self, now: float) -> None:
        if self.control is None:
            return
        if self.asked is not None and now >= self.asked[1]:
            self._report(self.control, self.asked[0])
            self.asked = None
        if self.control.hub and now >= self.next_sample:
            self.next_sample = now + self.every
            self._judge(self.control)  # the nodes that answered the last sample, where some did not
            self.control.tell_all({"kind": KIND, "event": "sample"})

    def message(self, message: Mapping[str, Any]) -> None:
        if message.get("kind") != KIND or self.control is None:
            return
        event = message.get("event")
        if event == "sample" and self.control.ranks():
            self.asked = (collectives.ask(_records(self.control)), time.monotonic() + READ_AFTER_SECONDS)
        elif event == "arrivals" and self.control.hub:
            offset = time.time_ns() - int(message["sent_ns"])  # the hub's clock minus the node's
            self.reports[int(message["node"])] = _Report(
                next(iter(message["hosts"].values()), "?"),
                {int(rank): shifted({int(seq): t for seq, t in times.items()}, offset)
                 for rank, times in message["ranks"].items()})
            if len(self.reports) >= self.control.num_nodes:
                self._judge(self.control)
        elif event == "named":
            found = list(message.get("stragglers") or [])
            for entry in found:
                self.note(entry["text"])
            if not found:
                self.note("no straggler any more")
            here = [entry["text"] for entry in found if entry.get("node") == self.control.node]
            mine = here[0] if here and self.exclude else None
            if mine != self.mine:  # the node's own sign in its state.json: the restart rules read it there
                self.mine = mine
                fault = self.node_fault()
                self.control.record(node_fault=None if fault is None else fault.to_dict())

    def node_fault(self) -> NodeFault | None:
        """Under ``--on-straggler exclude``, this node's sign while it is named a straggler: the restart rules leave
        it out at the next restart."""
        return NodeFault(FaultSign.STRAGGLER, self.mine) if self.mine else None

    @staticmethod
    def _report(control: JobControl, token: int) -> None:
        """This node's ranks' entry times (default group) to the hub, with this clock's time."""
        ranks = control.ranks()
        records = collectives.read(_records(control), [rank.rank for rank in ranks], token, wait=0)
        control.tell_hub({
            "kind": KIND, "event": "arrivals", "node": control.node, "sent_ns": time.time_ns(),
            "hosts": {str(rank.rank): rank.host for rank in ranks},
            "ranks": {str(rank): {str(seq): t for seq, t in entries_of(record).items()}
                      for rank, record in records.items() if "error" not in record}})

    def _judge(self, control: JobControl) -> None:
        """Judge the reports of the last sample; say it when the stragglers changed."""
        reports, self.reports = self.reports, {}
        if not reports:
            return
        arrivals = {rank: times for report in reports.values() for rank, times in report.ranks.items()}
        node_of = {rank: node for node, report in reports.items() for rank in report.ranks}
        verdict = stragglers(arrivals, node_of, {node: report.host for node, report in reports.items()})
        if not verdict.collectives:
            return
        named: list[JsonValue] = [straggler.to_json() for straggler in verdict.named]
        if control.node == 0 and verdict.named != self.recorded:
            self.recorded = verdict.named
            control.record(stragglers=named)  # [] once judged: status tells "none" from "not yet"
        names = [f"node-{entry.node}" if entry.rank is None else str(entry.rank) for entry in verdict.named]
        if names != self.named and (names or self.named):
            self.named = names
            control.tell_all({"kind": KIND, "event": "named", "stragglers": named})
