"""Who holds a hung job back, by collective sequence: in the commonest distributed hang every rank waits in the
same collective but one that never got there. From every rank's collective record
(:mod:`.collectives`), per process group: the newest collective any rank entered (the front), the ranks that wait
in it, and the ranks behind it, named with the last collective they completed and, when given, where their own
code is. A rank without a readable record is named unknown; the others are still judged. Never a guess: no
collectives recorded says so."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .stacks import ranges, summary

DEFAULT_GROUP = "default_pg"


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


def judge_group(records: Mapping[int, Mapping[str, Any]], group: str,
                where: Mapping[int, str] | None = None) -> dict[str, Any]:
    """``{"group", "verdict", "text", "front", "waiting", "behind"}`` for one process group; ``verdict`` is
    ``behind`` (some ranks wait for others), ``all_waiting``, ``desync`` (ranks in different collectives under the
    same number) or ``running`` (no rank waits)."""
    lasts = {rank: _last(record, group) for rank, record in records.items()}
    members = {rank: last for rank, last in lasts.items() if last is not None}
    front = max(last.seq for last in members.values())
    at_front = {rank: last for rank, last in members.items() if last.seq == front}
    kinds: dict[str, list[int]] = {}
    for rank, newest in sorted(at_front.items()):
        kinds.setdefault(newest.operation, []).append(rank)
    waiting = sorted(rank for rank, newest in at_front.items() if not newest.done)
    # every rank is in the default group; another group's members are the ranks that recorded one of its calls
    judged = records if group == DEFAULT_GROUP else members
    behind = sorted(rank for rank in judged if rank not in at_front)
    result: dict[str, Any] = {"group": group, "front": front, "waiting": waiting, "behind": []}
    if len(kinds) > 1:
        said = ", ".join(f"{op} on {_ranks(ranks)}" for op, ranks in kinds.items())
        return {**result, "verdict": "desync", "text": f"ranks disagree on collective #{front}: {said}"}
    operation = next(iter(kinds))
    for rank in behind:
        last = lasts[rank]
        state = ("never entered a collective" if last is None else
                 f"last completed #{last.seq}" if last.done else f"waits in {last.operation} #{last.seq}")
        place = f" and is in {where[rank]}" if where and rank in where else ""
        stale = " (no fresh record: the rank did not answer)" if records[rank].get("stale") else ""
        result["behind"].append({"rank": rank, "last_seq": None if last is None else last.seq,
                                 "last_done": None if last is None else last.done,
                                 "text": f"rank {rank} {state}{place}{stale}"})
    if waiting and behind:
        head = f"{_ranks(waiting)} {'waits' if len(waiting) == 1 else 'wait'} in {operation} #{front}"
        return {**result, "verdict": "behind", "text": "; ".join([head, *(b["text"] for b in result["behind"])])}
    if waiting:
        return {**result, "verdict": "all_waiting",
                "text": f"every rank waits in {operation} #{front}: none is missing, the collective itself does "
                        "not complete (the network, or a process outside the job)"}
    return {**result, "verdict": "running", "text": f"no rank waits in a collective (newest: {operation} #{front})"}


def culprit(records: Mapping[int, Mapping[str, Any]], where: Mapping[int, str] | None = None) -> dict[str, Any]:
    """The verdict over every rank's record: the first process group where ranks wait for others (the default
    group first), else the default group's state. ``unknown`` names the ranks without a readable record."""
    unknown = [{"rank": rank, "error": str(record["error"])} for rank, record in sorted(records.items())
               if "error" in record]
    readable = {rank: record for rank, record in records.items() if "error" not in record}
    groups = _groups(readable)
    if not groups:
        return {"verdict": "none", "text": "no collectives recorded", "unknown": unknown, "groups": []}
    judged = [judge_group(readable, group, where) for group in groups]
    chosen = next((j for j in judged if j["verdict"] in ("behind", "desync")), judged[0])
    text = chosen["text"] + (f" (group {chosen['group']})" if chosen["group"] != DEFAULT_GROUP else "")
    if unknown:
        text += "; unknown: " + "; ".join(f"rank {u['rank']}: {u['error']}" for u in unknown)
    return {"verdict": chosen["verdict"], "text": text, "unknown": unknown, "groups": judged}


def culprit_of(ranks: Sequence[Mapping[str, Any]], records: Mapping[str | int, Mapping[str, Any]]) -> dict[str, Any]:
    """:func:`culprit` of the records of a whole job (keyed by rank, as JSON gives them), the ranks behind named with
    where their stack (``ranks``, as ``stacks.sample`` took them) is."""
    where = {int(str(rank["rank"])): summary(rank["frames"]) for rank in ranks if rank.get("frames")}
    return culprit({int(rank): record for rank, record in records.items()}, where)
