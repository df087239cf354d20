"""Who is slow, from arrival at collectives: per-rank compute time evens out behind the all-reduce, so a straggler
shows as the rank that *enters* collectives last. From every rank's entry times (:mod:`.collectives` records, on one
clock), per collective the last rank and its margin over the one before it; a rank (or, when no rank stands out, a
node) is a straggler when it accounts for most of the job's waiting and that waiting is a real share of the time.

Two conditions, so that a job of equal ranks names nobody: the unit's late margins (only those over
:data:`MIN_MARGIN_SHARE` of the median time between collectives, which leaves out jitter) sum to at least
:data:`MIN_TIME_SHARE` of the window's wall time, and to at least :data:`MIN_BLAME_SHARE` of every unit's late margins
together. Fewer than :data:`MIN_COLLECTIVES` collectives seen by every rank: no judgement."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..records.jsonvalue import JsonObject

MIN_COLLECTIVES = 10
MIN_MARGIN_SHARE = 0.2
"""A margin under this share of the median time between collectives is jitter."""
MIN_TIME_SHARE = 0.1
"""A straggler holds the job back at least this share of the window's wall time."""
MIN_BLAME_SHARE = 2 / 3
"""... and accounts for at least this share of all the waiting."""

Arrivals = Mapping[int, Mapping[int, int]]
"""Unit (rank or node) -> collective sequence number -> entry time (ns, one clock for every unit)."""


def _late(arrivals: Arrivals) -> tuple[list[int], dict[int, list[float]], float] | None:
    """The collectives every unit entered, each unit's late margins (s), the window's wall time (s)."""
    if len(arrivals) < 2:
        return None
    common = sorted(set.intersection(*(set(seqs) for seqs in arrivals.values())))
    if len(common) < MIN_COLLECTIVES:
        return None
    firsts = [min(times[seq] for times in arrivals.values()) for seq in common]
    window = (max(times[common[-1]] for times in arrivals.values()) - firsts[0]) / 1e9
    gaps = [later - earlier for earlier, later in itertools.pairwise(firsts)]
    floor = MIN_MARGIN_SHARE * statistics.median(gaps) / 1e9 if gaps else 0.0
    late: dict[int, list[float]] = {unit: [] for unit in arrivals}
    for seq in common:
        order = sorted(arrivals, key=lambda unit: arrivals[unit][seq])
        margin = (arrivals[order[-1]][seq] - arrivals[order[-2]][seq]) / 1e9
        if margin > floor:
            late[order[-1]].append(margin)
    return common, late, window


@dataclass(frozen=True)
class LateUnit:
    """A unit (rank or node) that holds the job back: into how many collectives it came last, by how much (median
    margin, s) and its waiting's share of the window's wall time."""

    unit: int
    last: int
    median_margin_s: float
    share: float


@dataclass(frozen=True)
class Judgement:
    """How many collectives every unit entered (0: too few to judge), over how long (s), and the late units."""

    collectives: int
    window_s: float
    late: tuple[LateUnit, ...]


def judge(arrivals: Arrivals) -> Judgement:
    """The units that hold the job back; ``collectives`` 0 (and none late) when there are too few to judge."""
    found = _late(arrivals)
    if found is None or found[2] <= 0:
        return Judgement(0 if found is None else len(found[0]), 0.0, ())
    common, late, window = found
    total = sum(sum(margins) for margins in late.values())
    named = tuple(LateUnit(unit, len(margins), round(statistics.median(margins), 3), round(sum(margins) / window, 3))
                  for unit, margins in sorted(late.items())
                  if margins and sum(margins) >= MIN_TIME_SHARE * window and sum(margins) >= MIN_BLAME_SHARE * total)
    return Judgement(len(common), round(window, 3), named)


def by_node(arrivals: Arrivals, node_of: Mapping[int, int]) -> dict[int, dict[int, int]]:
    """A node's arrival at a collective: its last rank's."""
    nodes: dict[int, dict[int, int]] = {}
    for rank, times in arrivals.items():
        mine = nodes.setdefault(node_of[rank], {})
        for seq, entered in times.items():
            mine[seq] = max(mine.get(seq, entered), entered)
    return nodes


@dataclass(frozen=True)
class Straggler:
    """A straggler named: its rank (None: a node, no rank of which stands out), node and host, how late (as
    :class:`LateUnit` says) and that in words."""

    rank: int | None
    node: int
    host: str
    last: int
    median_margin_s: float
    share: float
    text: str

    def to_json(self) -> JsonObject:
        """``{"rank" (a rank's only), "node", "last", "median_margin_s", "share", "host", "text"}`` (state.json's
        ``stragglers``, ``status --json``'s)."""
        return {**({} if self.rank is None else {"rank": self.rank}), "node": self.node, "last": self.last,
                "median_margin_s": self.median_margin_s, "share": self.share, "host": self.host, "text": self.text}


@dataclass(frozen=True)
class Stragglers:
    """The verdict: as :class:`Judgement` (of the ranks, else of the nodes), the stragglers named."""

    collectives: int
    window_s: float
    named: tuple[Straggler, ...]


def stragglers(arrivals: Arrivals, node_of: Mapping[int, int], hosts: Mapping[int, str]) -> Stragglers:
    """The ranks that hold the job back, else the nodes."""
    verdict = judge(arrivals)
    units: list[tuple[int | None, int, LateUnit]] = [(late.unit, node_of[late.unit], late) for late in verdict.late]
    if not units and len(set(node_of.values())) > 1:
        verdict = judge(by_node(arrivals, node_of))
        units = [(None, late.unit, late) for late in verdict.late]
    named = []
    for rank, node, late in units:
        who, host = f"node-{node}" if rank is None else f"rank {rank} (node-{node})", hosts.get(node, "?")
        text = (f"{who} ({host}) is a straggler: last into {late.last} of {verdict.collectives} collectives, by "
                f"{late.median_margin_s:g} s (median), holding the job back {late.share:.0%} of {verdict.window_s:g} s")
        named.append(Straggler(rank, node, host, late.last, late.median_margin_s, late.share, text))
    return Stragglers(verdict.collectives, verdict.window_s, tuple(named))


def entries_of(record: Mapping[str, Any], group: str = "default_pg") -> dict[int, int]:
    """Sequence number -> entry time of one rank's record (:mod:`.collectives`), for ``group``."""
    for found in record.get("groups") or []:
        if found.get("group") == group:
            return {int(seq): int(entered) for seq, _, entered, _ in found.get("entries") or []}
    return {}


def shifted(times: Mapping[int, int], offset_ns: int) -> dict[int, int]:
    """Entry times moved onto another clock (``offset_ns`` = that clock minus this one)."""
    return {seq: entered + offset_ns for seq, entered in times.items()}
