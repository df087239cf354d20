"""What .mlenv/state.json records beside each deployment's handle, as typed values: its runs, the nodes left out
of its next runs, the batch jobs submitted for a cluster and how its last deploy ended. Each ``to_json`` writes the
keys every version of the file has used (an unset optional key is left out, as before); each ``from_json`` reads
what any earlier version wrote (a key it lacked takes its default) and raises TypeError/ValueError/KeyError on a
record of another shape. Here, below the backends and the state, as backends record jobs and excluded nodes too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TypeVar

from mlenv.runtime.records.jsonvalue import JsonObject

READY, FAILED, PARTIAL = "ready", "failed", "partial"
DEPLOY_STATES = (READY, FAILED, PARTIAL)


T = TypeVar("T")


def _mapping(record: object, what: str) -> Mapping[str, object]:
    if not isinstance(record, dict):
        raise TypeError(f"{what} is not a mapping")
    return record


def _typed(value: object, kind: type[T], key: str) -> T:
    """``value`` when it is a ``kind`` (a bool is no int); TypeError naming ``key`` otherwise."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"{key!r} has the wrong type")
    return value


def _optional(record: Mapping[str, object], key: str, kind: type[T]) -> T | None:
    """``record[key]`` (None where absent or null), TypeError when it is not a ``kind``."""
    value = record.get(key)
    return None if value is None else _typed(value, kind, key)


def _present(fields: JsonObject) -> JsonObject:
    """``fields`` without those that are unset (None): the keys an earlier mlenv left out."""
    return {key: value for key, value in fields.items() if value is not None}


@dataclass(frozen=True)
class SpareUse:
    """A spare host that ran node ``node`` of a run in place of the excluded ``host``."""

    node: int
    host: str
    spare: str

    def to_json(self) -> JsonObject:
        return {"node": self.node, "host": self.host, "spare": self.spare}

    @classmethod
    def from_json(cls, record: object) -> SpareUse:
        fields = _mapping(record, "a spare")
        return cls(_typed(fields["node"], int, "node"), _typed(fields["host"], str, "host"),
                   _typed(fields["spare"], str, "spare"))


@dataclass(frozen=True)
class RecordedRun:
    """A launch recorded on its deployment (or a batch job's run, for a cluster that is not deployed)."""

    id: str
    script: str | None = None
    launcher: str | None = None
    detached: bool = True
    started: str | None = None
    """When it was launched, ISO 8601 (``-`` for a batch job that recorded none)."""
    preemptions: int | None = None
    """How many times it was resumed after a preemption, once it was."""
    spares: tuple[SpareUse, ...] | None = None
    """The spare hosts its nodes ran on, where some did."""

    def to_json(self) -> JsonObject:
        return _present({"id": self.id, "script": self.script, "launcher": self.launcher, "detached": self.detached,
                         "started": self.started, "preemptions": self.preemptions,
                         "spares": None if self.spares is None else [spare.to_json() for spare in self.spares]})

    @classmethod
    def from_json(cls, record: object) -> RecordedRun:
        fields = _mapping(record, "a run")
        spares = fields.get("spares")
        return cls(_typed(fields["id"], str, "id"), _optional(fields, "script", str),
                   _optional(fields, "launcher", str), bool(fields.get("detached", True)),
                   _optional(fields, "started", str), _optional(fields, "preemptions", int),
                   None if spares is None else tuple(map(SpareUse.from_json, _typed(spares, list, "spares"))))


@dataclass(frozen=True)
class ExcludedNode:
    """A node left out of the next runs: its number, host, why and since when (ISO 8601)."""

    node: int
    host: str
    reason: str
    since: str

    def to_json(self) -> JsonObject:
        return {"node": self.node, "host": self.host, "reason": self.reason, "since": self.since}

    @classmethod
    def from_json(cls, record: object) -> ExcludedNode:
        fields = _mapping(record, "an excluded node")
        return cls(_typed(fields["node"], int, "node"), _typed(fields["host"], str, "host"),
                   str(fields.get("reason", "")), str(fields.get("since", "")))


@dataclass(frozen=True)
class SubmittedJob:
    """A batch job mlenv submitted for a cluster (Slurm): its id, run, script, when; ``restarts`` a detached run's
    --max-restarts (its script may submit the run's next job), ``followed`` when mlenv read what that script left,
    ``next`` the job its run went on as."""

    id: str
    run: str | None = None
    script: str | None = None
    detached: bool = True
    submitted: str | None = None
    restarts: int = 0
    followed: str | None = None
    next: str | None = None

    def to_json(self) -> JsonObject:
        return _present({"id": self.id, "run": self.run, "script": self.script, "detached": self.detached,
                         "submitted": self.submitted, "restarts": self.restarts or None, "followed": self.followed,
                         "next": self.next})

    @classmethod
    def from_json(cls, record: object) -> SubmittedJob:
        fields = _mapping(record, "a job")
        return cls(_typed(fields["id"], str, "id"), _optional(fields, "run", str), _optional(fields, "script", str),
                   bool(fields.get("detached", True)), _optional(fields, "submitted", str),
                   _optional(fields, "restarts", int) or 0, _optional(fields, "followed", str),
                   _optional(fields, "next", str))

    def followed_at(self, since: str, next_job: str | None) -> SubmittedJob:
        """This job once mlenv read, at ``since``, what its script left: ``next_job`` the job its run went on as
        (the one known before, where None)."""
        return replace(self, followed=since, next=next_job or self.next)


@dataclass(frozen=True)
class DeployOutcome:
    """How the last deploy ended: ``state`` ready, failed (none succeeded yet) or partial (a re-deploy failed; the
    deployment before it is still the one operated), ``error`` why not ready (None while not ready: that deploy has
    not finished)."""

    state: str = READY
    error: str | None = None

    @property
    def unfinished(self) -> bool:
        """Whether the deploy is still under way or was interrupted: not ready, and no error recorded."""
        return self.state != READY and self.error is None

    def to_json(self) -> JsonObject:
        return {"state": self.state, "error": self.error}

    @classmethod
    def from_json(cls, record: object) -> DeployOutcome:
        fields = _mapping(record, "a deploy outcome")
        if fields.get("state") not in DEPLOY_STATES:
            raise ValueError(f"deploy state {fields.get('state')!r} is none of {', '.join(DEPLOY_STATES)}")
        return cls(_typed(fields["state"], str, "state"), _optional(fields, "error", str))
