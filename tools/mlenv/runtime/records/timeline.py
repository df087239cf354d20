"""A node's share of each attempt of a run, in times (epoch seconds): what the run's goodput (goodput.py) is made of,
read on the node from the attempt directories its supervisors wrote (runlayout.py) and carried by the runtime's
``jobs --json`` as each job's ``attempts``."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .jsonvalue import JsonObject
from .runlayout import NodeDir, RankRecord, attempts, read_json, read_ranks, read_state
from .states import RunState

PROGRESS = "progress"
"""state.json's key for the progress facts (runtime/watch/progress.py)."""


@dataclass(frozen=True)
class NodeAttempt:
    """One node's share of one attempt; a time is None where its record does not say it."""

    attempt: int
    node: int
    started_at: float | None
    """When the node's supervisor started (record.json)."""
    ended_at: float | None
    """When the share ended (its progress facts, else its exit file's mtime, else its last rank's end); None while
    it runs."""
    failed_at: float | None
    """When its first rank failed (ranks.json), where one did."""
    state: RunState | None
    first_collective_at: float | None = None
    first_output_at: float | None = None
    checkpoint_at: float | None = None

    def to_dict(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def parse(cls, data: object) -> NodeAttempt | None:
        """The share :meth:`to_dict` wrote; None for anything else."""
        if not isinstance(data, Mapping):
            return None
        try:
            return cls(int(data["attempt"]), int(data["node"]), _seconds(data.get("started_at")),
                       _seconds(data.get("ended_at")), _seconds(data.get("failed_at")),
                       RunState.parse(data.get("state")), **_progress(data))
        except (KeyError, TypeError, ValueError):
            return None


def node_attempts(run_dir: Path, node: int) -> list[NodeAttempt]:
    """Node ``node``'s share of every attempt of the run in ``run_dir`` that it has a record of, oldest first."""
    found = (share(number, node, read_json(files.record), read_state(files), read_ranks(files), _mtime(files.exit))
             for number in attempts(run_dir) for files in [NodeDir(run_dir, number, node)])
    return [item for item in found if item is not None]


def share(attempt: int, node: int, record: object, state: Mapping[str, Any], ranks: Sequence[RankRecord],
          exit_at: float | None = None) -> NodeAttempt | None:
    """The node's share of an attempt from its records (record.json's JSON, state.json's, ranks.json's ranks, and
    when its exit file was written); None without a record.json."""
    if not isinstance(record, Mapping):
        return None
    recorded = state.get(PROGRESS)
    progress: Mapping[str, Any] = recorded if isinstance(recorded, Mapping) else {}
    failed = [at for rank in ranks if rank.state is RunState.FAILED and (at := iso_seconds(rank.ended_at)) is not None]
    ended = _seconds(progress.get("ended_at")) or exit_at
    if ended is None and ranks and all(rank.ended_at for rank in ranks):
        ended = max(iso_seconds(rank.ended_at) or 0.0 for rank in ranks) or None
    return NodeAttempt(attempt, node, iso_seconds(record.get("started_at")), ended, min(failed) if failed else None,
                       RunState.parse(state.get("state")), **_progress(progress))


def _progress(data: Mapping[str, Any]) -> dict[str, float | None]:
    """The progress facts (runtime/watch/progress.py) in ``data``, each None where it is not a number."""
    return {name: _seconds(data.get(name)) for name in ("first_collective_at", "first_output_at", "checkpoint_at")}


def iso_seconds(text: object) -> float | None:
    """An ISO 8601 time (UTC where it names no zone) in epoch seconds; None for anything else."""
    if not isinstance(text, str):
        return None
    try:
        found = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (found if found.tzinfo is not None else found.replace(tzinfo=timezone.utc)).timestamp()


def _seconds(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _mtime(path: Path) -> float | None:
    with contextlib.suppress(OSError):
        return path.stat().st_mtime
    return None
