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
from typing import Any

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


def judge(arrivals: Arrivals) -> dict[str, Any]:
    """``{"collectives", "window_s", "stragglers": [{"unit", "last", "median_margin_s", "share"}]}``; ``collectives``
    0 (and no stragglers) when there are too few to judge."""
    found = _late(arrivals)
    if found is None or found[2] <= 0:
        return {"collectives": 0 if found is None else len(found[0]), "window_s": 0.0, "stragglers": []}
    common, late, window = found
    total = sum(sum(margins) for margins in late.values())
    stragglers = [{"unit": unit, "last": len(margins), "median_margin_s": round(statistics.median(margins), 3),
                   "share": round(sum(margins) / window, 3)}
                  for unit, margins in sorted(late.items())
                  if margins and sum(margins) >= MIN_TIME_SHARE * window and sum(margins) >= MIN_BLAME_SHARE * total]
    return {"collectives": len(common), "window_s": round(window, 3), "stragglers": stragglers}


def by_node(arrivals: Arrivals, node_of: Mapping[int, int]) -> dict[int, dict[int, int]]:
    """A node's arrival at a collective: its last rank's."""
    nodes: dict[int, dict[int, int]] = {}
    for rank, times in arrivals.items():
        mine = nodes.setdefault(node_of[rank], {})
        for seq, entered in times.items():
            mine[seq] = max(mine.get(seq, entered), entered)
    return nodes


def stragglers(arrivals: Arrivals, node_of: Mapping[int, int], hosts: Mapping[int, str]) -> dict[str, Any]:
    """The ranks that hold the job back, else the nodes: ``{"collectives", "window_s", "stragglers": [{"rank" or
    "node", "node", "host", "last", "median_margin_s", "share", "text"}]}``."""
    ranks = judge(arrivals)
    named = [{"rank": s["unit"], "node": node_of[s["unit"]], **s} for s in ranks["stragglers"]]
    verdict = ranks
    if not named and len(set(node_of.values())) > 1:
        verdict = judge(by_node(arrivals, node_of))
        named = [{"node": s["unit"], **s} for s in verdict["stragglers"]]
    for entry in named:
        unit = entry.pop("unit")
        who = f"rank {unit} (node-{entry['node']})" if "rank" in entry else f"node-{unit}"
        entry["host"] = hosts.get(entry["node"], "?")
        entry["text"] = (f"{who} ({entry['host']}) is a straggler: last into {entry['last']} of "
                         f"{verdict['collectives']} collectives, by {entry['median_margin_s']:g} s (median), "
                         f"holding the job back {entry['share']:.0%} of {verdict['window_s']:g} s")
    return {"collectives": verdict["collectives"], "window_s": verdict["window_s"], "stragglers": named}


def entries_of(record: Mapping[str, Any], group: str = "default_pg") -> dict[int, int]:
    """Sequence number -> entry time of one rank's record (:mod:`.collectives`), for ``group``."""
    for found in record.get("groups") or []:
        if found.get("group") == group:
            return {int(seq): int(entered) for seq, _, entered, _ in found.get("entries") or []}
    return {}


def shifted(times: Mapping[int, int], offset_ns: int) -> dict[int, int]:
    """Entry times moved onto another clock (``offset_ns`` = that clock minus this one)."""
    return {seq: entered + offset_ns for seq, entered in times.items()}
