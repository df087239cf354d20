"""Deployments by name, with their backend and handle, plus which one is current, and the batch jobs mlenv
submitted per cluster (deployed or not): .mlenv/state.json.

``deploy`` records a deployment before its first side effect, so a half-failed one can be inspected, re-deployed
or cleaned. A corrupt or foreign-shaped file is a clear error naming it and the fix, never a reason to delete
anything. The single-deployment file of earlier versions is migrated when it is read.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from mlenv.core.capabilities import Handle
from mlenv.core.recorded import FAILED, PARTIAL, READY, DeployOutcome, ExcludedNode, RecordedRun, SubmittedJob
from mlenv.errors import MlenvError, OperationError, UsageError, shown
from mlenv.runtime.records.jsonvalue import JsonObject
from mlenv.ui import info

VERSION = 2
MAX_BYTES = 4 * 1024 * 1024
Runs = tuple[RecordedRun, ...]
"""A deployment's recorded runs, oldest first."""


@dataclass(frozen=True)
class Deployment:
    """One recorded deployment: how it was asked for, and its backend's handle."""

    name: str
    backend: str
    cluster_file: str
    """The cluster file's absolute path when it was deployed."""
    mode: str
    nodes: int
    image: str | None
    """The --image override, if any."""
    handle: Handle
    runs: Runs = ()
    """Launches: run id, when, what; newest last."""
    excluded: tuple[ExcludedNode, ...] = ()
    """Nodes left out of the next runs, by node number; the one record of them (nccl-test --pairs --exclude-bad and
    restarts add, ``mlenv nodes --forget-excluded`` clears)."""
    deploy: DeployOutcome = field(default_factory=DeployOutcome)
    """How the last deploy ended (see ``unfinished``)."""
    attempt: Deployment | None = None
    """A re-deploy that did not (yet) succeed: what it created, for clean; the record above stays operated."""
    leftovers: tuple[Handle, ...] = ()
    """The handles of earlier deploy attempts that failed and were replaced by a later attempt: clean reaches what
    they created too."""

    @property
    def unfinished(self) -> bool:
        """Whether the last deploy is still under way or was interrupted: not ready, and no error recorded."""
        return self.deploy.unfinished

    @property
    def handles(self) -> tuple[Handle, ...]:
        """Every handle clean must reach, each once: the deployment's, a failed re-deploy's, the leftovers."""
        every = (self.handle, *([self.attempt.handle] if self.attempt is not None else []), *self.leftovers)
        return tuple(handle for index, handle in enumerate(every) if handle not in every[:index])

    def to_json(self) -> JsonObject:
        """The record in state.json; a ready deployment's reads as an earlier mlenv wrote it (no deploy, attempt,
        leftovers or excluded nodes)."""
        record = {**asdict(self), "handle": self.handle.to_json(), "runs": [run.to_json() for run in self.runs],
                  "excluded": [entry.to_json() for entry in self.excluded], "deploy": self.deploy.to_json(),
                  "attempt": None if self.attempt is None else self.attempt.to_json(),
                  "leftovers": [handle.to_json() for handle in self.leftovers]}
        unset: JsonObject = {"deploy": DeployOutcome().to_json(), "attempt": None, "leftovers": [],
                                 "excluded": []}
        return {key: value for key, value in record.items() if key not in unset or value != unset[key]}

    @classmethod
    def from_json(cls, record: Any) -> Deployment:
        """Inverse of ``to_json``; TypeError/ValueError/KeyError on a record of another shape."""
        if not isinstance(record, dict):
            raise TypeError("a deployment is not a mapping")
        attempt, deploy = record.get("attempt"), record.get("deploy")
        fields = {**record, "handle": Handle.from_json(record["handle"]),
                  "runs": tuple(RecordedRun.from_json(run) for run in record.get("runs") or ()),
                  "excluded": tuple(ExcludedNode.from_json(entry) for entry in record.get("excluded") or ()),
                  "deploy": DeployOutcome.from_json(deploy) if deploy else DeployOutcome(),
                  "attempt": None if attempt is None else cls.from_json(attempt),
                  "leftovers": tuple(Handle.from_json(handle) for handle in record.get("leftovers") or ())}
        deployment = cls(**fields)
        if not (isinstance(deployment.name, str) and isinstance(deployment.cluster_file, str)
                and isinstance(deployment.mode, str) and isinstance(deployment.nodes, int)):
            raise TypeError("a deployment field has the wrong type")
        return deployment


@dataclass
class State:
    """Every recorded deployment and the current one."""

    deployments: dict[str, Deployment] = field(default_factory=dict)
    current: str | None = None
    jobs: dict[str, tuple[SubmittedJob, ...]] = field(default_factory=dict)
    """Batch jobs mlenv submitted, by deployment (cluster) name, whether or not it is deployed: status and clean
    touch only these."""
    excluded: dict[str, tuple[ExcludedNode, ...]] = field(default_factory=dict)
    """Nodes left out of the next runs of a cluster that is not deployed (its Slurm batch jobs), by cluster name;
    a deployment keeps its own (``Deployment.excluded``)."""

    def excluded_of(self, name: str) -> tuple[ExcludedNode, ...]:
        """The nodes excluded from the next runs of ``name``: its deployment's, else the undeployed cluster's."""
        known = self.deployments.get(name)
        return known.excluded if known is not None else self.excluded.get(name, ())


def state_file() -> Path:
    """.mlenv/state.json in the project root."""
    from mlenv.config.discover import project_root  # here: the config package adds ~75 ms to every command

    return project_root() / ".mlenv" / "state.json"


def _corrupt(path: Path, why: str) -> UsageError:
    return UsageError(f"{shown(str(path))} is not a state file mlenv can read ({why}); nothing was changed. "
                      f"Move it away (mv {shown(str(path))} {shown(str(path))}.bak) and deploy again, or fix it")


MISSING = object()


def _read(path: Path) -> Any:
    """The parsed file, or MISSING when there is none."""
    try:
        if not path.is_file():
            if path.exists():
                raise _corrupt(path, "not a regular file")
            return MISSING
        if path.stat().st_size > MAX_BYTES:
            raise _corrupt(path, f"larger than {MAX_BYTES // 1024 // 1024} MiB")
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise _corrupt(path, getattr(exc, "strerror", None) or str(exc)) from None
    except ValueError as exc:
        raise _corrupt(path, f"invalid JSON: {exc}") from None


def load() -> State:
    """The recorded deployments (none when there is no file)."""
    path = state_file()
    data = _read(path)
    if data is MISSING:
        return State()
    if not isinstance(data, dict):
        raise _corrupt(path, f"expected a JSON object, got {type(data).__name__}")
    if "deployments" not in data and "cluster_file" in data:
        return _migrate(path, data)
    try:
        deployments = {name: Deployment.from_json(record) for name, record in dict(data["deployments"]).items()}
        current = data.get("current")
        if current is not None and current not in deployments:
            raise ValueError(f"current deployment {current!r} is not recorded")
        jobs = {str(name): tuple(map(SubmittedJob.from_json, listed))
                for name, listed in dict(data.get("jobs") or {}).items()}
        excluded = {str(name): tuple(map(ExcludedNode.from_json, listed))
                    for name, listed in dict(data.get("excluded") or {}).items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise _corrupt(path, f"unexpected shape: {exc}") from None
    return State(deployments, current, jobs, excluded)


def _migrate(path: Path, old: JsonObject) -> State:
    """The single-deployment file of earlier versions: re-plan its cluster file to get the handle."""
    # here: planning (plan, the registry) adds ~120 ms to every command, paid only by a file this old
    from mlenv.core.clusters import load_cluster
    from mlenv.core.registry import get
    from mlenv.plan import plan

    try:
        cluster_file, mode, nodes, image = str(old["cluster_file"]), old.get("mode"), old.get("nodes"), old.get("image")
        if not (isinstance(mode, str | None) and isinstance(nodes, int | None) and isinstance(image, str | None)):
            raise TypeError("a field has the wrong type")
        job = plan(load_cluster(cluster_file), mode=mode, nodes=nodes, image=image)
        handle = get(job.cluster.backend, RECORDS).deploy.prepare(job).handle
    except (KeyError, TypeError, ValueError, MlenvError) as exc:
        raise _corrupt(path, f"an earlier mlenv's record whose cluster file cannot be planned again: {exc}") from None
    deployment = Deployment(handle.name, handle.backend, cluster_file, job.mode, job.nodes, image, handle)
    state = State({deployment.name: deployment}, deployment.name)
    save(state)
    return state


def save(state: State) -> None:
    """Write ``state`` atomically."""
    path = state_file()
    data = {"version": VERSION, "current": state.current,
            "deployments": {name: d.to_json() for name, d in sorted(state.deployments.items())},
            "jobs": {name: [job.to_json() for job in listed] for name, listed in sorted(state.jobs.items()) if listed}}
    if any(state.excluded.values()):  # written only when some undeployed cluster has excluded nodes
        data["excluded"] = {name: [entry.to_json() for entry in listed]
                            for name, listed in sorted(state.excluded.items()) if listed}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".state.json.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise OperationError(f"cannot record the deployment in {shown(str(path))}: {exc.strerror or exc}") from None


def record(deployment: Deployment) -> None:
    """Record what a deploy in progress knows (before its first change, and whenever it learns more). A
    deployment that was ready before is kept as it is, operated as before, with this one as its ``attempt``; a new
    one is recorded, so that clean finds it, but not made current until ``succeeded``."""
    with locked():
        state = load()
        known = state.deployments.get(deployment.name)
        ended = known is not None and known.deploy.error is not None  # an earlier attempt failed
        if known is not None and known.deploy.state != FAILED:
            earlier = [known.attempt.handle] if ended and known.attempt is not None else []
            state.deployments[deployment.name] = replace(known, attempt=deployment,
                                                         deploy=DeployOutcome(PARTIAL),
                                                         leftovers=(*known.leftovers, *earlier))
        else:
            earlier = [*known.leftovers, *([known.handle] if ended else [])] if known is not None else []
            state.deployments[deployment.name] = replace(deployment, runs=known.runs if known else (),
                                                         excluded=known.excluded if known else (),
                                                         deploy=DeployOutcome(FAILED),
                                                         leftovers=tuple(earlier))
        save(state)


def succeeded(name: str) -> None:
    """The deploy of ``name`` finished: what it recorded replaces the deployment (its runs and excluded nodes are
    kept), which is ready and current."""
    with locked():
        state = load()
        known = state.deployments[name]
        latest = known.attempt or known
        state.deployments[name] = replace(latest, runs=known.runs, excluded=known.excluded,
                                          deploy=DeployOutcome(READY),
                                          attempt=None, leftovers=known.leftovers)
        state.current = name
        save(state)


def failed(name: str, why: str) -> None:
    """The deploy of ``name`` failed with ``why``: the record keeps what it knew, and what the attempt created."""
    with locked():
        state = load()
        known = state.deployments.get(name)
        if known is None:
            return
        state.deployments[name] = replace(known, deploy=replace(known.deploy, error=why))
        save(state)


def update(name: str, *, runs: Callable[[Runs], Runs] | None = None, handle: Handle | None = None) -> None:
    """Change the runs (``runs`` of the recorded ones: read and written under one lock) or the handle of a recorded
    deployment; the handle of a re-deploy in progress goes to its attempt (the deployment before it stays operated
    until it succeeds)."""
    with locked():
        state = load()
        known = state.deployments.get(name)
        if known is None:
            return
        if handle is not None and known.attempt is not None and known.unfinished:
            known = replace(known, attempt=replace(known.attempt, handle=handle))
        elif handle is not None:
            known = replace(known, handle=handle)
        state.deployments[name] = replace(known, runs=known.runs if runs is None else runs(known.runs))
        save(state)


def exclude(name: str, nodes: dict[int, tuple[str, str]]) -> tuple[ExcludedNode, ...]:
    """Record ``nodes`` (node number -> (host, why)) as excluded from the next runs of ``name`` (its deployment,
    or the cluster when it is not deployed); a host already excluded keeps its first reason (a spare host that ran a
    node is excluded apart from the node's own host). The excluded nodes afterwards."""
    since = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with locked():
        state = load()
        listed = {entry.host: entry for entry in state.excluded_of(name)}
        for node, (host, reason) in nodes.items():
            listed.setdefault(host, ExcludedNode(node, host, reason, since))
        excluded = tuple(sorted(listed.values(), key=lambda entry: (entry.node, entry.host)))
        _set_excluded(state, name, excluded)
        save(state)
        return excluded


def forget_excluded(name: str) -> tuple[ExcludedNode, ...]:
    """Clear the excluded nodes of ``name`` (its deployment, or the cluster when it is not deployed); those it
    had."""
    with locked():
        state = load()
        had = state.excluded_of(name)
        if not had:
            return ()
        _set_excluded(state, name, ())
        save(state)
        return had


def _set_excluded(state: State, name: str, excluded: tuple[ExcludedNode, ...]) -> None:
    known = state.deployments.get(name)
    if known is not None:
        state.deployments[name] = replace(known, excluded=excluded)
    else:
        state.excluded[name] = excluded


def add_job(name: str, job: SubmittedJob, keep: int) -> None:
    """Record a batch job submitted for the cluster ``name`` (the newest ``keep`` are kept)."""
    with locked():
        state = load()
        state.jobs[name] = (*state.jobs.get(name, ()), job)[-keep:]
        save(state)


def update_job(name: str, job: SubmittedJob) -> None:
    """Record ``job`` in place of the recorded batch job with its id of the cluster ``name`` (nothing when none is
    recorded)."""
    with locked():
        state = load()
        listed = state.jobs.get(name, ())
        if any(known.id == job.id for known in listed):
            state.jobs[name] = tuple(job if known.id == job.id else known for known in listed)
            save(state)


def jobs_of(name: str) -> tuple[SubmittedJob, ...]:
    """The batch jobs recorded for the cluster ``name``, oldest first."""
    return load().jobs.get(name, ())


class StateRecords:
    """``core.registry.Records`` on .mlenv/state.json: what backends read and record, handed to them."""

    def handle_of(self, name: str) -> Handle | None:
        known = load().deployments.get(name)
        return known.handle if known is not None else None

    def jobs_of(self, name: str) -> tuple[SubmittedJob, ...]:
        return jobs_of(name)

    def add_job(self, name: str, job: SubmittedJob, keep: int) -> None:
        add_job(name, job, keep)

    def update_job(self, name: str, job: SubmittedJob) -> None:
        update_job(name, job)

    def exclude(self, name: str, nodes: dict[int, tuple[str, str]]) -> None:
        exclude(name, nodes)

    def excluded_of(self, name: str) -> tuple[ExcludedNode, ...]:
        return load().excluded_of(name)


RECORDS = StateRecords()


def forget(name: str) -> None:
    """Drop the record of ``name`` and its jobs (after a clean); the current one moves to another if it was this."""
    with locked():
        state = load()
        had_jobs = state.jobs.pop(name, None) is not None
        if state.deployments.pop(name, None) is None and not had_jobs:
            return
        if state.current == name:
            state.current = next(iter(sorted(state.deployments)), None)
        save(state)


def use(name: str) -> Deployment:
    """Make the deployment ``name`` (or of the cluster file ``name``) the current one."""
    with locked():
        state = load()
        deployment = find(state, name)
        state.current = deployment.name
        save(state)
        return deployment


def find(state: State, ref: str) -> Deployment:
    """The deployment named ``ref``, or whose cluster file is ``ref`` (a path or a cluster name)."""
    if ref in state.deployments:
        return state.deployments[ref]
    path = _cluster_path(ref)
    for deployment in state.deployments.values():
        if path is not None and deployment.cluster_file == path:
            return deployment
    known = ", ".join(sorted(state.deployments)) or "none"
    raise UsageError(f"no deployment {shown(ref)} is recorded (recorded: {known}); deploy it first "
                     f"(mlenv deploy {shown(ref)})")


def _cluster_path(ref: str) -> str | None:
    from mlenv.config.discover import resolve  # here: the config package adds ~75 ms to every command

    try:
        return os.path.realpath(resolve(ref)[0])
    except (UsageError, OSError):
        return None


def current() -> Deployment:
    """The current deployment; UsageError naming the fix when there is none."""
    state = load()
    if state.current is None:
        raise UsageError("no deployment recorded: deploy first (make deploy-cluster CLUSTER=NAME) "
                         "or name one with CLUSTER=NAME / --cluster NAME")
    return state.deployments[state.current]


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Hold .mlenv/state.lock while reading and writing the state (other mlenv commands wait)."""
    with _lock_file("state.lock") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def deploying(name: str) -> Iterator[None]:
    """One deploy or clean of ``name`` at a time: a second one waits, saying so."""
    with _one_at_a_time(f"deploy-{name}.lock", f"to finish with {name}"):
        yield


@contextlib.contextmanager
def launching(name: str) -> Iterator[None]:
    """One launch of ``name`` at a time from its look for a live run until its run is recorded (and ``running``
    holds it live): a second one waits, saying so, then looks."""
    with _one_at_a_time(f"launch-{name}.lock", f"to start its run of {name}"):
        yield


@contextlib.contextmanager
def running(name: str) -> Iterator[None]:
    """Held by each launch of ``name`` from before its run is recorded until the launch returns (a detached run's
    nodes started it; an attached run ended): ``run_going`` sees it live before any node records it."""
    with _lock_file(f"running-{name}.lock") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        yield


def run_going(name: str) -> bool:
    """Whether a launch of ``name`` holds ``running`` (the lock goes with its process, however that ends)."""
    with _lock_file(f"running-{name}.lock") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


@contextlib.contextmanager
def _lock_file(name: str) -> Iterator[IO[str]]:
    """.mlenv/``name``, open (made when missing); OperationError naming it when it cannot be."""
    path = state_file().with_name(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a+")
    except OSError as exc:
        raise OperationError(f"cannot lock {shown(str(path))}: {exc.strerror or exc}") from None
    with handle:
        yield handle


@contextlib.contextmanager
def _one_at_a_time(name: str, doing: str) -> Iterator[None]:
    """Hold the lock file .mlenv/``name``, waiting for its holder (said: ``waiting for mlenv pid N {doing}``)."""
    with _lock_file(name) as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another mlenv"
            info(f"waiting for {shown(holder)} {doing} ({shown(str(handle.name))})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"mlenv pid {os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            handle.truncate(0)
