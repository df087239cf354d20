"""``mlenv runs``: the runs of a deployment (with ``--all``, of every deployment and of every cluster's batch jobs),
newest first, each as its nodes' supervisors recorded it (docs/runs.md); and the one place a run id a user typed is
looked up (``logs``, ``stacks``, ``status RUN_ID``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone

from mlenv import state
from mlenv.core.capabilities import Feature
from mlenv.core.recorded import RecordedRun
from mlenv.errors import MlenvError, UsageError
from mlenv.ops.target import Target, backend_of, resolve
from mlenv.runtime.records.jsonvalue import JsonObject
from mlenv.runtime.records.runlayout import FirstFailure
from mlenv.runtime.records.runrecord import RunRecord
from mlenv.runtime.records.states import RunState, end_text
from mlenv.ui import error, print_json, table

COLUMNS = ["RUN", "STATE", "EXIT", "ATTEMPTS", "DURATION", "START", "NODES", "SCRIPT", "FAILURE"]
"""The table's columns, the most wanted first: a narrow terminal cuts them from the last (ui.layout), so that at 80
columns the run id and its state stay whole."""


def recorded_runs(name: str, recorded: state.Deployment | None) -> list[RecordedRun]:
    """The runs recorded of ``name``, oldest first: the deployment's launches, or, for a cluster file that is not
    deployed, the runs of the batch jobs submitted for it (Slurm), in the same shape."""
    if recorded is not None:
        return list(recorded.runs)
    return [RecordedRun(job.run, job.script or "-", started=job.submitted or "-", detached=job.detached)
            for job in state.jobs_of(name) if job.run]


def distinct(runs: list[RecordedRun]) -> list[RecordedRun]:
    """One entry per run, oldest first: a run restarted attached is recorded again at each attempt; its entry is the
    last one's (its spares, preemptions) with the first one's start."""
    merged: dict[str, RecordedRun] = {}
    for run in runs:
        first = merged.get(run.id)
        merged[run.id] = replace(run, started=first.started) if first and first.started is not None else run
    return list(merged.values())


def launched_at(runs: list[RecordedRun], run_id: str) -> float | None:
    """When run ``run_id`` of the recorded ``runs`` was first launched (epoch seconds): its goodput's start; None
    where unknown."""
    started = next((_time(run.started) for run in runs if run.id == run_id), None)
    return started.timestamp() if started is not None else None


def find(target: Target, run_id: str) -> RecordedRun:
    """The recorded run ``run_id`` of ``target``; UsageError naming it and how to list the runs when there is
    none."""
    for run in recorded_runs(target.handle.name, target.recorded):
        if run.id == run_id:
            return run
    raise UsageError(f"no run {run_id!r} of {target.handle.name}: mlenv runs lists its runs "
                     "(mlenv runs --all, every deployment's)")


@dataclass(frozen=True)
class RunRow:
    """One run as ``mlenv runs`` shows it: what the deployment recorded of it (id, script, start) and what its nodes
    did (None where they were not asked)."""

    id: str
    cluster: str
    script: str | None
    detached: bool
    state: RunState | None
    exit_code: int | None
    attempts: int | None
    started: str | None
    ended: str | None
    duration: float | None
    nodes: int | None
    """How many nodes recorded a state."""
    node_states: dict[str, str]
    """Each node's state as shown (``failed (3)``), by ordinal."""
    first_failure: FirstFailure | None

    def to_json(self) -> JsonObject:
        """The entry of ``runs --json`` (docs/json.md)."""
        return {"id": self.id, "cluster": self.cluster, "script": self.script, "detached": self.detached,
                "state": self.state, "exit_code": self.exit_code, "attempts": self.attempts, "started": self.started,
                "ended": self.ended, "duration": self.duration, "nodes": self.nodes,
                "node_states": {**self.node_states},
                "first_failure": self.first_failure.to_dict() if self.first_failure is not None else None}


def listing(target: Target) -> list[RunRow]:
    """Every run of ``target``, newest first, in ``runs --json``'s shape (docs/json.md); read from its nodes at
    once."""
    listed = distinct(recorded_runs(target.handle.name, target.recorded))
    records: dict[str, RunRecord] = {}
    if listed and target.backend.info.supports(Feature.JOBS):
        records = target.backend.jobs.runs(target.handle, [run.id for run in listed])
    now = datetime.now(timezone.utc)
    return [entry(target.handle.name, run, records.get(run.id), now) for run in reversed(listed)]


def entry(cluster: str, run: RecordedRun, record: RunRecord | None, now: datetime) -> RunRow:
    """One run: what the deployment recorded of it (id, script, start) and what its nodes did (``record``)."""
    if record is None:
        return RunRow(run.id, cluster, run.script, run.detached, None, None, None, run.started, None, None, None, {},
                      None)
    return RunRow(run.id, cluster, run.script, run.detached, record.state, record.exit_code,
                  record.attempt + 1 if record.state is not None else None, run.started, record.ended_at,
                  _seconds(run.started, record.ended_at, now, record),
                  sum(end is not None for end in record.nodes.values()),
                  {str(node): end_text(end) for node, end in sorted(record.nodes.items())}, record.first_failure)


def _seconds(started: object, ended_at: str | None, now: datetime, record: RunRecord | None) -> float | None:
    """How long the run took (until ``now`` while it runs); None where a time is unknown."""
    begin = _time(started)
    if begin is None or record is None or record.state is None:
        return None
    end = _time(ended_at) if record.exit_code is not None else now
    return None if end is None else max(0.0, round((end - begin).total_seconds(), 1))


def _time(text: object) -> datetime | None:
    try:
        found = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return found if found.tzinfo is not None else found.replace(tzinfo=timezone.utc)


def every_target() -> list[tuple[str, Target | MlenvError]]:
    """Every recorded deployment, and every cluster not deployed with batch jobs recorded (by name): its target,
    or why it cannot be had."""
    recorded = state.load()
    found: list[tuple[str, Target | MlenvError]] = [
        (name, Target(backend_of(d.backend), d.handle, d)) for name, d in sorted(recorded.deployments.items())]
    for name in sorted(set(recorded.jobs) - set(recorded.deployments)):
        try:
            found.append((name, resolve(name)))
        except MlenvError as exc:
            found.append((name, exc))
    return found


def show(cluster_ref: str | None, every: bool, as_json: bool) -> int:
    """Print the runs (``--all``: of every deployment, a column naming it); 1 when a deployment could not be
    asked (its runs are listed as recorded, their state unknown)."""
    failed = False
    rows: list[RunRow] = []
    for name, target in every_target() if every else [(cluster_ref or "", resolve(cluster_ref))]:
        try:
            if isinstance(target, MlenvError):
                raise target
            rows += listing(target)
        except Exception as exc:  # with --all, one deployment's failure never hides the others' runs
            if not every:
                raise
            failed = True
            error(f"{name}: cannot read its runs: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
            recorded = target.recorded if isinstance(target, Target) else None
            rows += [entry(name, run, None, datetime.now(timezone.utc))
                     for run in reversed(distinct(recorded_runs(name, recorded)))]
    rows.sort(key=lambda row: str(row.started), reverse=True)
    if as_json:
        print_json([row.to_json() for row in rows])
    elif not rows:
        print("no runs recorded" + ("" if every else "; mlenv launch starts one"))
    else:
        table(None, ["CLUSTER", *COLUMNS][not every:], [[*[row.cluster][not every:], *cells(row)] for row in rows])
    return 1 if failed else 0


def cells(row: RunRow) -> list[str]:
    """A run's cells of the table, as ``COLUMNS`` names them."""
    failure = row.first_failure
    return [row.id, row.state or "unknown", "-" if row.exit_code is None else str(row.exit_code),
            "-" if row.attempts is None else str(row.attempts), duration(row.duration),
            _started(row.started), "-" if row.nodes is None else str(row.nodes), row.script or "-",
            one_line(failure) if failure is not None else ""]


def one_line(failure: FirstFailure) -> str:
    """A first failure in one line: who, how, and its last line."""
    last = next((line.strip() for line in reversed(failure.log_tail) if line.strip()), "")
    return f"rank {failure.rank} (node-{failure.node}) {failure.reason}" + (f": {last}" if last else "")


def _started(text: object) -> str:
    found = _time(text)
    return found.strftime("%m-%d %H:%M:%S") if found is not None else str(text or "-")


def duration(seconds: float | None) -> str:
    """``42s``, ``3m05s``, ``2h01m``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.0f}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
