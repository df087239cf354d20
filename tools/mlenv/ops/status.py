"""``mlenv status``: the nodes of one deployment (or of every recorded one), with the detached runs it knows."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial
from typing import Any

from mlenv import state
from mlenv.core.capabilities import Feature, Handle, NodeStatus
from mlenv.core.recorded import FAILED, PARTIAL, READY, RecordedRun
from mlenv.core.registry import Backend
from mlenv.errors import MlenvError, UsageError
from mlenv.ops.runs import distinct, entry, find, launched_at, recorded_runs
from mlenv.ops.target import backend_of, resolve
from mlenv.runtime.records.goodput import Goodput
from mlenv.runtime.records.goodput import describe as goodput_line
from mlenv.runtime.records.runrecord import RunRecord
from mlenv.runtime.records.states import RunState, end_text
from mlenv.ui import error, print_json, say, table

UNFINISHED = "the deploy did not finish (interrupted?)"
"""The error shown of a deploy that recorded none: it is under way, or was interrupted."""


def deploy_shown(recorded: state.Deployment) -> dict[str, Any]:
    """How the last deploy of ``recorded`` ended, as status shows it: an unfinished one's error is ``UNFINISHED``."""
    return {**recorded.deploy.to_json(), **({"error": UNFINISHED} if recorded.unfinished else {})}


def _report(handle: Handle, recorded: state.Deployment | None, current: str | None, tolerant: bool,
            backend: Callable[[], Backend], gpus: bool = False, run_id: str | None = None
            ) -> tuple[dict[str, Any], RunRecord | None]:
    """What status shows of ``handle``, asking the ``backend()``, and the run it shows, typed (None: none); with
    ``tolerant`` any failure (an unknown backend included) becomes the report's error; with ``gpus`` each node's
    GPU state too (``gpu_state``); with ``run_id`` that run in place of the latest (``latest_run``,
    ``run_states``). Each of ``runs`` is what the deployment recorded of the run with its state, exit code, attempts
    and duration as ``mlenv runs`` reads them (unknown where the backend was not asked)."""
    listed = distinct(recorded_runs(handle.name, recorded))
    report: dict[str, Any] = {
        "name": handle.name, "cluster": handle.name, "backend": handle.backend, "mode": handle.mode,
        "nodes": handle.nodes, "namespace": handle.namespace, "current": handle.name == current,
        "deployed": recorded is not None,
        "cluster_file": recorded.cluster_file if recorded else None,
        "runs": _described(handle.name, listed, {}),
        "deploy": deploy_shown(recorded) if recorded else None,
        "latest_run": None,  # the latest detached run, as its nodes' supervisors recorded it (docs/runs.md)
        "run_states": {},  # its state on each node, by ordinal
        # an undeployed cluster's once the backend has answered: it may record some (Slurm batch runs' scripts)
        "excluded": [entry.to_json() for entry in recorded.excluded] if recorded else [],
    }
    run: RunRecord | None = None
    try:
        made = backend()
        never_ready = recorded is not None and recorded.deploy.state == FAILED
        report["pods"] = [pod_row(row, never_ready) for row in made.deploy.status(handle)]
        if listed and report["pods"] and made.info.supports(Feature.JOBS):
            records = made.jobs.runs(handle, [run.id for run in listed])  # as their nodes' supervisors said
            report["runs"] = _described(handle.name, listed, records)
            wanted = run_id or listed[-1].id
            run = records[wanted].launched(launched_at(listed, wanted), time.time())  # run_id: one of listed
            report["run_states"] = {str(n): end_text(end) for n, end in run.nodes.items()}
            report["latest_run"] = run.to_dict()
        if gpus and report["pods"]:
            from mlenv.ops.gpus import gather

            report["gpu_state"] = gather(made.access, handle)
    except MlenvError as exc:
        if not tolerant:
            raise
        report["pods"], report["error"] = [], str(exc)
    except Exception as exc:  # with --all, one deployment's failure never hides the others
        if not tolerant:
            raise
        report["pods"], report["error"] = [], f"cannot query it: {type(exc).__name__}: {exc}"
    if recorded is None:
        report["excluded"] = [entry.to_json() for entry in state.load().excluded_of(handle.name)]
    return report, run


def _described(name: str, listed: list[RecordedRun], records: dict[str, RunRecord]) -> list[dict[str, Any]]:
    """``runs`` of status: each recorded run (oldest first) with what its nodes did (``mlenv runs``' fields)."""
    now = datetime.now(timezone.utc)
    return [{**run.to_json(), **entry(name, run, records.get(run.id), now)} for run in listed]


def pod_row(row: NodeStatus, never_ready: bool = False) -> dict[str, Any]:
    """A node of ``status --json`` in the names every command uses (docs/json.md): ``pod`` its name, ``node`` its
    ordinal, ``host`` the machine it is on; not ready while its deployment never was."""
    return {"pod": row.name, "node": row.ordinal, "host": row.node, "phase": row.phase,
            "ready": row.ready and not never_ready, "restarts": row.restarts, "gpus": row.gpus, "ip": row.ip,
            "rdma_devices": row.rdma_devices, "detail": row.detail, "extra": dict(row.extra)}


def _print(report: dict[str, Any], run: RunRecord | None = None) -> None:
    where = f", namespace {report['namespace']}" if report.get("namespace") else ""
    title = f"{report['name']} ({report['backend']}, {report['mode']}{where}{', current' if report['current'] else ''})"
    if report.get("error"):
        error(f"{report['name']}: {report['error']}")
        return
    deploy = report["deploy"] or {"state": READY}
    if deploy["state"] == FAILED:
        say(f"{report['name']}: deploy failed: {deploy['error']}; not ready (mlenv deploy again, or mlenv clean)")
    elif deploy["state"] == PARTIAL:
        say(f"{report['name']}: the last deploy failed: {deploy['error']}; shown is the deployment before it, "
            "which is still operated (mlenv deploy again, or mlenv clean)")
    rows = report["pods"]
    if not rows:
        say(f"{title}: no nodes" + ("" if report["deployed"] else " (not deployed)"))
        return
    extra = sorted({key for row in rows for key in row["extra"]})
    # a column of nothing would only take room from the others (every header fits 60 columns)
    rdma = report["mode"] == "rdma" or any(row["rdma_devices"] for row in rows)
    detail = any(row["detail"] for row in rows)
    table(title, ["POD", "NODE", "PHASE", "READY", "RESTARTS", "GPUS", "IP", *["RDMA"][:rdma],
                  *[c.upper() for c in extra], *["DETAIL"][:detail]],
          [[row["pod"], row["host"] or "-", row["phase"], "yes" if row["ready"] else "no", row["restarts"],
            row["gpus"], row["ip"] or "-", *[row["rdma_devices"] or "-"][:rdma],
            *[row["extra"].get(c, "") for c in extra], *[row["detail"] or ""][:detail]] for row in rows])
    for excluded in report["excluded"]:
        print(f"excluded: node-{excluded['node']} ({excluded.get('host', '-')}) since {excluded.get('since', '-')}: "
              f"{excluded.get('reason', '-')}; mlenv nodes --forget-excluded clears")
    if report["runs"]:
        latest = next((r for r in reversed(report["runs"]) if run is not None and r.get("id") == run.id),
                      report["runs"][-1])
        kind = "detached run" if latest.get("detached", True) else "run"
        say(f"{'run' if latest is not report['runs'][-1] else f'latest {kind}'}: {latest['id']} ({latest['script']}, "
            f"started {latest['started']}): {summary(run, latest)}")
        if latest.get("spares"):
            say("on spare hosts: " + ", ".join(f"node-{used['node']} on {used['spare']} (in place of {used['host']})"
                                               for used in latest["spares"]))
        recorded_run = report.get("latest_run") or {}  # as the nodes recorded it
        transport = recorded_run.get("transport") or {}
        if transport:
            say("transport: " + ", ".join(f"{node} {found['verdict']} ({found.get('plugin') or 'no network'})"
                                          for node, found in transport.items()))
        if recorded_run.get("idle"):
            from mlenv.runtime.watch.idle import IdleReport, describe

            say("GPUs idle: " + "; ".join(describe(idle) for value in recorded_run["idle"].values()
                                          if (idle := IdleReport.parse(value)) is not None))
        for straggler in recorded_run.get("stragglers") or []:
            say(straggler["text"])
        if (spent := Goodput.parse(recorded_run.get("goodput"))) is not None:
            say(goodput_line(spent))
        if recorded_run.get("first_failure"):
            failure = recorded_run["first_failure"]
            say(f"first failure: rank {failure['rank']} (node-{failure['node']}) {failure['reason']}")
    if "gpu_state" in report:
        from mlenv.ops.gpus import render

        say(render(report["gpu_state"]))


def summary(run: RunRecord | None, recorded: dict[str, Any]) -> str:
    """What became of a run (``latest_run``, typed; None where its nodes were not asked) and the deployment's record
    of it, truthfully: running or hung on how many nodes, and how to follow or stop it; once it ended, its state and
    exit code, and where its output is."""
    state_now = run.state if run is not None else None
    ends = dict(run.nodes) if run is not None else {}
    attempt = run.attempt if run is not None else 0
    # an attached run's resumptions are recorded on the deployment, a detached one's by its nodes
    preemptions = max(int(recorded.get("preemptions", 0)), run.preemptions if run is not None else 0)
    restarted = (f", attempt {attempt} (restarted {attempt - preemptions}x"
                 + (f", preempted {preemptions}x" if preemptions else "")
                 + "; mlenv logs shows every attempt)") if attempt else ""
    nodes = f"({', '.join(f'node-{n} {end_text(end)}' for n, end in sorted(ends.items()))})"
    if run is not None and state_now in (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED):  # nothing runs
        code = run.exit_code
        return (f"{state_now}{restarted}{'' if code is None else f', exit code {code}'} {nodes}; "
                f"mlenv logs {recorded['id']} shows it")
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
    reports = [report for report, _ in found]
    if as_json:
        print_json({"deployments": reports} if every else reports[0])
    else:
        if every and not reports:
            print("no deployments recorded")
        for report, run in found:
            _print(report, run)
    unanswered = any("error" in node for r in reports for node in r.get("gpu_state", []))
    return 1 if unanswered or any(r.get("error") for r in reports) else 0
