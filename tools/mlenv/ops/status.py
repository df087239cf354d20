"""``mlenv status``: the nodes of one deployment (or of every recorded one), with the detached runs it knows."""

# Imported where used, measured with python -X importtime: ops.gpus (its fanout and the runtime's GPU reader, ~30 ms)
# and runtime.watch.idle (~12 ms): a plain status pays neither.
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from functools import partial

from mlenv import state
from mlenv.core.capabilities import Feature, Handle, NodeStatus
from mlenv.core.recorded import FAILED, PARTIAL, DeployOutcome, ExcludedNode, RecordedRun
from mlenv.core.registry import Backend
from mlenv.errors import MlenvError, UsageError
from mlenv.ops.runs import RunRow, distinct, entry, find, launched_at, recorded_runs
from mlenv.ops.target import backend_of, resolve
from mlenv.runtime.records.goodput import describe as goodput_line
from mlenv.runtime.records.jsonvalue import JsonObject, JsonValue
from mlenv.runtime.records.runrecord import RunRecord
from mlenv.runtime.records.states import RunState, end_text
from mlenv.ui import error, print_json, say, table

TYPE_CHECKING = False
if TYPE_CHECKING:
    from mlenv.ops.gpus import GpuReport

UNFINISHED = "the deploy did not finish (interrupted?)"
"""The error shown of a deploy that recorded none: it is under way, or was interrupted."""


def deploy_shown(recorded: state.Deployment) -> DeployOutcome:
    """How the last deploy of ``recorded`` ended, as status shows it: an unfinished one's error is ``UNFINISHED``."""
    return replace(recorded.deploy, error=UNFINISHED) if recorded.unfinished else recorded.deploy


@dataclass(frozen=True)
class StatusRun:
    """A run of status: what the deployment recorded of it, and what its nodes did (``mlenv runs``' row)."""

    recorded: RecordedRun
    row: RunRow

    def to_json(self) -> JsonObject:
        return {**self.recorded.to_json(), **self.row.to_json()}


@dataclass(frozen=True)
class StatusReport:
    """What status shows of one deployment (or cluster file): its handle and record (None: not deployed), its
    ``runs`` oldest first, its excluded nodes, its nodes as the backend answered (none where it did not: ``error``
    says why), the run shown as its nodes' supervisors recorded it (None: none, or they were not asked) and, where
    asked, each node's GPU state."""

    handle: Handle
    current: bool
    recorded: state.Deployment | None
    runs: list[StatusRun]
    excluded: list[ExcludedNode]
    pods: list[NodeStatus]
    run: RunRecord | None = None
    gpu_state: list[GpuReport] | None = None
    error: str | None = None

    @property
    def never_ready(self) -> bool:
        """Whether the deployment never was ready: its nodes are not, whatever they say."""
        return self.recorded is not None and self.recorded.deploy.state == FAILED

    def to_json(self) -> JsonObject:
        """``status --json`` of one deployment (docs/json.md)."""
        handle, recorded, run = self.handle, self.recorded, self.run
        shown: JsonObject = {
            "name": handle.name, "cluster": handle.name, "backend": handle.backend, "mode": handle.mode,
            "nodes": handle.nodes, "namespace": handle.namespace, "current": self.current,
            "deployed": recorded is not None, "cluster_file": recorded.cluster_file if recorded else None,
            "runs": [described.to_json() for described in self.runs],
            "deploy": deploy_shown(recorded).to_json() if recorded else None,
            "latest_run": run.to_dict() if run else None,  # as its nodes' supervisors recorded it (docs/runs.md)
            "run_states": {str(n): end_text(end) for n, end in run.nodes.items()} if run else {},  # by ordinal
            "excluded": [excluded.to_json() for excluded in self.excluded],
            "pods": [pod_row(row, self.never_ready) for row in self.pods],
        }
        if self.gpu_state is not None:
            shown["gpu_state"] = [report.to_json() for report in self.gpu_state]
        if self.error is not None:
            shown["error"] = self.error
        return shown

    @property
    def failed(self) -> bool:
        """Whether the deployment could not be queried, or (with GPUs asked) a node did not answer."""
        return bool(self.error) or any(report.answer is None for report in self.gpu_state or ())


def _report(handle: Handle, recorded: state.Deployment | None, current: str | None, tolerant: bool,
            backend: Callable[[], Backend], gpus: bool = False, run_id: str | None = None) -> StatusReport:
    """What status shows of ``handle``, asking the ``backend()``; with ``tolerant`` any failure (an unknown backend
    included) becomes the report's error; with ``gpus`` each node's GPU state too; with ``run_id`` that run in place
    of the latest. Each of its runs is what the deployment recorded of the run with its state, exit code, attempts
    and duration as ``mlenv runs`` reads them (unknown where the backend was not asked)."""
    listed = distinct(recorded_runs(handle.name, recorded))
    runs = _described(handle.name, listed, {})
    pods: list[NodeStatus] = []
    run: RunRecord | None = None
    gpu_state: list[GpuReport] | None = None
    failure: str | None = None
    try:
        made = backend()
        pods = made.deploy.status(handle)
        if listed and pods and made.info.supports(Feature.JOBS):
            records = made.jobs.runs(handle, [run.id for run in listed])  # as their nodes' supervisors said
            runs = _described(handle.name, listed, records)
            wanted = run_id or listed[-1].id
            run = records[wanted].launched(launched_at(listed, wanted), time.time())  # run_id: one of listed
        if gpus and pods:
            from mlenv.ops.gpus import gather

            gpu_state = gather(made.access, handle)
    except MlenvError as exc:
        if not tolerant:
            raise
        pods, failure = [], str(exc)
    except Exception as exc:  # with --all, one deployment's failure never hides the others
        if not tolerant:
            raise
        pods, failure = [], f"cannot query it: {type(exc).__name__}: {exc}"
    # an undeployed cluster's once the backend has answered: it may record some (Slurm batch runs' scripts)
    excluded = list(recorded.excluded if recorded is not None else state.load().excluded_of(handle.name))
    return StatusReport(handle, handle.name == current, recorded, runs, excluded, pods, run, gpu_state, failure)


def _described(name: str, listed: list[RecordedRun], records: dict[str, RunRecord]) -> list[StatusRun]:
    """The runs of status: each recorded run (oldest first) with what its nodes did (``mlenv runs``' fields)."""
    now = datetime.now(timezone.utc)
    return [StatusRun(run, entry(name, run, records.get(run.id), now)) for run in listed]


def pod_row(row: NodeStatus, never_ready: bool = False) -> JsonObject:
    """A node of ``status --json`` in the names every command uses (docs/json.md): ``pod`` its name, ``node`` its
    ordinal, ``host`` the machine it is on; not ready while its deployment never was."""
    return {"pod": row.name, "node": row.ordinal, "host": row.node, "phase": row.phase,
            "ready": row.ready and not never_ready, "restarts": row.restarts, "gpus": row.gpus, "ip": row.ip,
            "rdma_devices": row.rdma_devices, "detail": row.detail, "extra": dict[str, JsonValue](row.extra)}


def _print(report: StatusReport) -> None:
    handle, name, run = report.handle, report.handle.name, report.run
    where = f", namespace {handle.namespace}" if handle.namespace else ""
    title = f"{name} ({handle.backend}, {handle.mode}{where}{', current' if report.current else ''})"
    if report.error:
        error(f"{name}: {report.error}")
        return
    deploy = deploy_shown(report.recorded) if report.recorded else DeployOutcome()
    if deploy.state == FAILED:
        say(f"{name}: deploy failed: {deploy.error}; not ready (mlenv deploy again, or mlenv clean)")
    elif deploy.state == PARTIAL:
        say(f"{name}: the last deploy failed: {deploy.error}; shown is the deployment before it, "
            "which is still operated (mlenv deploy again, or mlenv clean)")
    rows = report.pods
    if not rows:
        say(f"{title}: no nodes" + ("" if report.recorded is not None else " (not deployed)"))
        return
    extra = sorted({key for row in rows for key in row.extra})
    # a column of nothing would only take room from the others (every header fits 60 columns)
    rdma = handle.mode == "rdma" or any(row.rdma_devices for row in rows)
    detail = any(row.detail for row in rows)
    table(title, ["POD", "NODE", "PHASE", "READY", "RESTARTS", "GPUS", "IP", *["RDMA"][:rdma],
                  *[c.upper() for c in extra], *["DETAIL"][:detail]],
          [[row.name, row.node or "-", row.phase, "yes" if row.ready and not report.never_ready else "no",
            row.restarts, row.gpus, row.ip or "-", *[row.rdma_devices or "-"][:rdma],
            *[row.extra.get(c, "") for c in extra], *[row.detail or ""][:detail]] for row in rows])
    for excluded in report.excluded:
        print(f"excluded: node-{excluded.node} ({excluded.host}) since {excluded.since}: {excluded.reason}; "
              "mlenv nodes --forget-excluded clears")
    if report.runs:
        latest = next((r.recorded for r in reversed(report.runs) if run is not None and r.recorded.id == run.id),
                      report.runs[-1].recorded)
        kind = "detached run" if latest.detached else "run"
        say(f"{'run' if latest is not report.runs[-1].recorded else f'latest {kind}'}: {latest.id} ({latest.script}, "
            f"started {latest.started}): {summary(run, latest)}")
        if latest.spares:
            say("on spare hosts: " + ", ".join(f"node-{used.node} on {used.spare} (in place of {used.host})"
                                               for used in latest.spares))
    if run is not None and report.runs:
        _print_run(run)
    if report.gpu_state is not None:
        from mlenv.ops.gpus import render

        say(render(report.gpu_state))


def _print_run(run: RunRecord) -> None:
    """What the nodes recorded of the run shown beyond its state: transport, idle GPUs, stragglers, goodput, and
    its first failure."""
    if run.transport:
        say("transport: " + ", ".join(f"{node} {found['verdict']} ({found.get('plugin') or 'no network'})"
                                      for node, found in run.transport.items()))
    if run.idle:
        from mlenv.runtime.watch.idle import IdleReport
        from mlenv.runtime.watch.idle import describe as idle_line

        say("GPUs idle: " + "; ".join(idle_line(report) for value in run.idle.values()
                                      if (report := IdleReport.parse(value)) is not None))
    for straggler in run.stragglers or []:
        say(straggler["text"])
    if run.goodput:
        say(goodput_line(run.goodput))
    if run.first_failure is not None:
        failure = run.first_failure
        say(f"first failure: rank {failure.rank} (node-{failure.node}) {failure.reason}")


def summary(run: RunRecord | None, recorded: RecordedRun) -> str:
    """What became of a run (``latest_run``, typed; None where its nodes were not asked) and the deployment's record
    of it, truthfully: running or hung on how many nodes, and how to follow or stop it; once it ended, its state and
    exit code, and where its output is."""
    state_now = run.state if run is not None else None
    ends = dict(run.nodes) if run is not None else {}
    attempt = run.attempt if run is not None else 0
    # an attached run's resumptions are recorded on the deployment, a detached one's by its nodes
    preemptions = max(recorded.preemptions or 0, run.preemptions if run is not None else 0)
    restarted = (f", attempt {attempt} (restarted {attempt - preemptions}x"
                 + (f", preempted {preemptions}x" if preemptions else "")
                 + "; mlenv logs shows every attempt)") if attempt else ""
    nodes = f"({', '.join(f'node-{n} {end_text(end)}' for n, end in sorted(ends.items()))})"
    if run is not None and state_now in (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED):  # nothing runs
        code = run.exit_code
        return (f"{state_now}{restarted}{'' if code is None else f', exit code {code}'} {nodes}; "
                f"mlenv logs {recorded.id} shows it")
    if state_now in (RunState.RUNNING, RunState.HUNG):
        on = sum(end is not None and end.state is state_now for end in ends.values())
        hint = "mlenv stacks shows where, mlenv stop stops it" if state_now is RunState.HUNG else \
            "mlenv logs -f follows it, mlenv stop stops it"
        return f"{state_now}{restarted} on {on}/{len(ends)} nodes {nodes}; {hint}"
    return f"{state_now or 'state unknown'}{restarted} {nodes}; mlenv logs -f follows it, mlenv stop stops it"


def show(cluster_ref: str | None, every: bool, as_json: bool, gpus: bool = False, run_id: str | None = None) -> int:
    """Print the status (with ``run_id``, of that run in place of the latest); 1 when a deployment could not be
    queried (or, with ``gpus``, a node did not answer)."""
    recorded = state.load()
    if every and run_id is not None:
        raise UsageError("a RUN_ID names a run of one deployment: give it without --all")
    if every:
        found = [_report(d.handle, d, recorded.current, True, partial(backend_of, d.backend), gpus)
                 for _, d in sorted(recorded.deployments.items())]
    else:
        target = resolve(cluster_ref)
        if run_id is not None:
            find(target, run_id)
        found = [_report(target.handle, target.recorded, recorded.current, False, lambda: target.backend, gpus,
                         run_id)]
    if as_json:
        print_json({"deployments": [report.to_json() for report in found]} if every else found[0].to_json())
    else:
        if every and not found:
            print("no deployments recorded")
        for report in found:
            _print(report)
    return 1 if any(report.failed for report in found) else 0
