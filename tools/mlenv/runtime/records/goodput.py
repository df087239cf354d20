"""The goodput of a run: where its wall time went, in seconds, from its nodes' records of each attempt
(timeline.py's :class:`NodeAttempt`), a pure function of them. The phases (docs/runs.md):

- ``queued``: from the launch (or the batch job's submission) to the first node supervisor of attempt 0 starting;
- ``starting``: from that start to the job's first productive moment: the first collective a rank entered (its
  collective record's ``first_ns``), else, for a job that records none, the first line a rank wrote;
- ``lost``: the work recomputed: in an attempt that failed, from its newest checkpoint write (the newest file mtime
  under ``$MLENV_CHECKPOINT_DIR``, on any node) to its failure (the first rank failing, else its end); the attempt's
  whole productive time where it wrote no checkpoint since it became productive; for the last attempt, to its end;
- ``restarting``: from an attempt's failure to the next attempt's first productive moment;
- ``productive``: the rest of the wall time (start to end, or ``now`` while the run goes on).

An attempt that never became productive is starting (attempt 0) or restarting (a later one) all along.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .jsonvalue import JsonObject
from .states import RunState
from .timeline import NodeAttempt

PHASES = ("queued", "starting", "productive", "lost", "restarting")
_FAILED = (RunState.FAILED, RunState.HUNG, RunState.PREEMPTED)


@dataclass(frozen=True)
class _Attempt:
    start: float
    end: float | None  # None while it runs
    productive_at: float | None
    failed_at: float | None  # None where it did not fail
    checkpoint_at: float | None


@dataclass(frozen=True)
class Goodput:
    """Where a run's wall time went: the seconds of each phase (:data:`PHASES`, in that order), the productive
    share of the wall time and how many attempts it made."""

    wall: float
    phases: Mapping[str, float]
    productive_share: float
    attempts: int

    def to_json(self) -> JsonObject:
        """``{"wall", "phases": {queued, starting, productive, lost, restarting}, "productive_share", "attempts"}``
        (``status --json``'s ``latest_run.goodput``, ``launch --json``'s, the drill's)."""
        return {"wall": self.wall, "phases": dict(self.phases), "productive_share": self.productive_share,
                "attempts": self.attempts}

    @classmethod
    def parse(cls, data: object) -> Goodput | None:
        """The goodput :meth:`to_json` wrote; None for anything else."""
        if not isinstance(data, Mapping) or not isinstance(phases := data.get("phases"), Mapping):
            return None
        try:
            return cls(float(data["wall"]), {name: float(phases[name]) for name in PHASES},
                       float(data["productive_share"]), int(data["attempts"]))
        except (KeyError, TypeError, ValueError):
            return None


def goodput(shares: Iterable[NodeAttempt], launched_at: float | None, now: float) -> Goodput | None:
    """The goodput of the run whose nodes' shares are ``shares`` (launched at ``launched_at`` where known); None
    when no share says when it started."""
    runs = _attempts(list(shares))
    if not runs:
        return None
    begin = min(launched_at, runs[0].start) if launched_at is not None else runs[0].start
    end = max(runs[-1].end if runs[-1].end is not None else now, runs[0].start)
    phases = dict.fromkeys(PHASES, 0.0)
    phases["queued"] = runs[0].start - begin
    mark: float | None = None  # the previous attempt's failure (or end)
    for attempt in runs:
        until = max(attempt.end if attempt.end is not None else now, attempt.start)
        productive_at = _within(attempt.productive_at, attempt.start, until) if attempt.productive_at else until
        if mark is None:
            phases["starting"] += productive_at - attempt.start
        else:
            phases["restarting"] += max(0.0, productive_at - mark)
        mark = until
        if attempt.failed_at is not None:
            failed = _within(attempt.failed_at, productive_at, until)
            stop = until if attempt is runs[-1] else failed
            saved = attempt.checkpoint_at
            since = productive_at if saved is None else _within(saved, productive_at, failed)
            phases["lost"] += stop - since
            mark = failed
    wall = end - begin
    phases["productive"] = max(0.0, wall - sum(value for name, value in phases.items() if name != "productive"))
    return Goodput(round(wall, 3), {name: round(value, 3) for name, value in phases.items()},
                   round(phases["productive"] / wall, 4) if wall > 0 else 0.0, len(runs))


def _within(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def _attempts(shares: Sequence[NodeAttempt]) -> list[_Attempt]:
    """The attempts the shares tell of, oldest first, each from its nodes' shares; one whose start no share says is
    left out."""
    numbers = sorted({share.attempt for share in shares})
    found: list[_Attempt] = []
    for index, number in enumerate(numbers):
        mine = [share for share in shares if share.attempt == number]
        starts = [share.started_at for share in mine if share.started_at is not None]
        if not starts:
            continue
        later = index < len(numbers) - 1
        ends = [share.ended_at for share in mine if share.ended_at is not None]
        going = any(share.state in (RunState.RUNNING, RunState.HUNG) and share.ended_at is None for share in mine)
        end = max(ends) if ends and (later or not going) else None
        failures = [share.failed_at for share in mine if share.failed_at is not None]
        failed = later or any(share.state in _FAILED for share in mine)
        failed_at = min(failures) if failures else min(ends) if failed and end is not None else None
        found.append(_Attempt(min(starts), end, _first(mine), failed_at,
                              max((s.checkpoint_at for s in mine if s.checkpoint_at is not None), default=None)))
    return found


def _first(shares: Sequence[NodeAttempt]) -> float | None:
    """The attempt's first productive moment: its first collective, else its first line of output."""
    collectives = [share.first_collective_at for share in shares if share.first_collective_at is not None]
    lines = [share.first_output_at for share in shares if share.first_output_at is not None]
    return min(collectives) if collectives else min(lines) if lines else None


def describe(found: Goodput) -> str:
    """``goodput: 83% productive (41.2 s of 49.6 s; starting 5.1 s, restarting 3.0 s, lost 0.3 s)``: the phases
    other than productive that are not zero."""
    phases = found.phases
    others = [f"{name} {phases[name]:.1f} s" for name in ("queued", "starting", "restarting", "lost")
              if round(phases[name], 1)]
    return (f"goodput: {round(100 * found.productive_share)}% productive ({phases['productive']:.1f} s of "
            f"{found.wall:.1f} s" + (f"; {', '.join(others)}" if others else "") + ")")
