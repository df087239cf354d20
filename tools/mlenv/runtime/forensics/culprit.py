"""Who holds a hung job back, by collective sequence: in the commonest distributed hang every rank waits in the
same collective but one that never got there. From every rank's collective record
(:mod:`.collectives`), per process group: the newest collective any rank entered (the front), the ranks that wait
in it, and the ranks behind it, named with the last collective they completed and, when given, where their own
code is. A rank without a readable record is named unknown; the others are still judged. Never a guess: no
collectives recorded says so."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ..records.jsonvalue import JsonObject, JsonValue
from .stacks import ranges, summary

DEFAULT_GROUP = "default_pg"
Standing = Literal["behind", "all_waiting", "desync", "running", "none"]
"""How a process group (or the job) stands: some ranks wait for others, every rank waits, ranks in different
collectives under the same number, no rank waits; ``none``: no collectives recorded."""


@dataclass(frozen=True)
class Last:
    """A rank's newest collective in one process group."""

    seq: int
    operation: str
    entered_ns: int
    done: bool


def _last(record: Mapping[str, Any], group: str) -> Last | None:
    for entry in record.get("groups") or []:
        if entry.get("group") == group and entry.get("entries"):
            return Last(*entry["entries"][-1])
    return None


def _groups(records: Mapping[int, Mapping[str, Any]]) -> list[str]:
    """Process groups seen, the default one first."""
    names = {str(g.get("group")) for record in records.values() for g in record.get("groups") or [] if g.get("entries")}
    return sorted(names, key=lambda name: (name != DEFAULT_GROUP, name))


def _ranks(numbers: Sequence[int]) -> str:
    return f"{'rank' if len(numbers) == 1 else 'ranks'} {ranges(numbers)}"


@dataclass(frozen=True)
class RankBehind:
    """A rank behind the group's front: the last collective it entered (None: none) and whether it completed."""

    rank: int
    last_seq: int | None
    last_done: bool | None
    text: str


@dataclass(frozen=True)
class GroupStanding:
    """One process group: its front (the newest collective any rank entered), the ranks that wait in it, those
    behind it, how it stands and that in words."""

    group: str
    front: int
    waiting: tuple[int, ...]
    behind: tuple[RankBehind, ...]
    verdict: Standing
    text: str


@dataclass(frozen=True)
class UnknownRank:
    """A rank without a readable collective record, and why."""

    rank: int
    error: str


@dataclass(frozen=True)
class Culprits:
    """The job's verdict: the group chosen (:func:`culprit`), in words, the unknown ranks and every group's."""

    verdict: Standing
    text: str
    unknown: tuple[UnknownRank, ...]
    groups: tuple[GroupStanding, ...]

    def to_json(self) -> JsonObject:
        """``{"verdict", "text", "unknown", "groups"}`` (stacks.json's and ``stacks --json``'s ``collectives``)."""
        return asdict(self)


def judge_group(records: Mapping[int, Mapping[str, Any]], group: str,
                where: Mapping[int, str] | None = None) -> GroupStanding:
    """One process group's standing: ``behind`` (some ranks wait for others), ``all_waiting``, ``desync`` (ranks
    in different collectives under the same number) or ``running`` (no rank waits)."""
    lasts = {rank: _last(record, group) for rank, record in records.items()}
    members = {rank: last for rank, last in lasts.items() if last is not None}
    front = max(last.seq for last in members.values())
    at_front = {rank: last for rank, last in members.items() if last.seq == front}
    kinds: dict[str, list[int]] = {}
    for rank, newest in sorted(at_front.items()):
        kinds.setdefault(newest.operation, []).append(rank)
    waiting = tuple(sorted(rank for rank, newest in at_front.items() if not newest.done))
    if len(kinds) > 1:
        said = ", ".join(f"{op} on {_ranks(ranks)}" for op, ranks in kinds.items())
        return GroupStanding(group, front, waiting, (), "desync", f"ranks disagree on collective #{front}: {said}")
    # every rank is in the default group; another group's members are the ranks that recorded one of its calls
    judged = records if group == DEFAULT_GROUP else members
    behind = tuple(_behind(rank, lasts[rank], where, bool(records[rank].get("stale")))
                   for rank in sorted(rank for rank in judged if rank not in at_front))
    operation = next(iter(kinds))
    if waiting and behind:
        head = f"{_ranks(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in {operation} #{front}"
        return GroupStanding(group, front, waiting, behind, "behind", "; ".join([head, *(b.text for b in behind)]))
    if waiting:
        return GroupStanding(group, front, waiting, behind, "all_waiting",
                             f"every rank waits in {operation} #{front}: none is missing, the collective itself "
                             "does not complete (the network, or a process outside the job)")
    return GroupStanding(group, front, waiting, behind, "running",
                         f"no rank waits in a collective (newest: {operation} #{front})")


def _behind(rank: int, last: Last | None, where: Mapping[int, str] | None, stale: bool) -> RankBehind:
    state = ("never entered a collective" if last is None else
             f"last completed #{last.seq}" if last.done else f"waits in {last.operation} #{last.seq}")
    place = f" and is in {where[rank]}" if where and rank in where else ""
    said = " (no fresh record: the rank did not answer)" if stale else ""
    return RankBehind(rank, None if last is None else last.seq, None if last is None else last.done,
                      f"rank {rank} {state}{place}{said}")


def culprit(records: Mapping[int, Mapping[str, Any]], where: Mapping[int, str] | None = None) -> Culprits:
    """The verdict over every rank's record: the first process group where ranks wait for others (the default
    group first), else the default group's state. ``unknown`` names the ranks without a readable record."""
    unknown = tuple(UnknownRank(rank, str(record["error"])) for rank, record in sorted(records.items())
                    if "error" in record)
    readable = {rank: record for rank, record in records.items() if "error" not in record}
    groups = _groups(readable)
    if not groups:
        return Culprits("none", "no collectives recorded", unknown, ())
    judged = tuple(judge_group(readable, group, where) for group in groups)
    chosen = next((j for j in judged if j.verdict in ("behind", "desync")), judged[0])
    text = chosen.text + (f" (group {chosen.group})" if chosen.group != DEFAULT_GROUP else "")
    if unknown:
        text += "; unknown: " + "; ".join(f"rank {u.rank}: {u.error}" for u in unknown)
    return Culprits(chosen.verdict, text, unknown, judged)


def culprit_of(ranks: Sequence[Mapping[str, Any]], records: Mapping[str, JsonValue]) -> Culprits:
    """:func:`culprit` of the records of a whole job (keyed by rank, as JSON gives them; a record that is no JSON
    object is left out), the ranks behind named with where their stack (``ranks``, as ``stacks.sample`` took them)
    is."""
    where = {int(str(rank["rank"])): summary(rank["frames"]) for rank in ranks if rank.get("frames")}
    return culprit({int(rank): record for rank, record in records.items() if isinstance(record, dict)}, where)
