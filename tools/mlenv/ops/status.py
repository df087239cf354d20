"""``mlenv status``: the nodes of one deployment (or of every recorded one), with the detached runs it knows."""

from __future__ import annotations

from typing import Any

from mlenv import state
from mlenv.backends import get
from mlenv.errors import MlenvError
from mlenv.ops.target import Target, resolve
from mlenv.ui import error, print_json, table


def _report(target: Target, current: str | None, tolerant: bool, gpus: bool = False) -> dict[str, Any]:
    """What status shows of ``target``; with ``tolerant`` a failure to query it becomes the report's error; with
    ``gpus`` each node's GPU state too (``gpu_state``)."""
    handle = target.handle
    report: dict[str, Any] = {
        "name": handle.name, "cluster": handle.name, "backend": handle.backend, "mode": handle.mode,
        "nodes": handle.nodes, "namespace": handle.data.get("namespace"), "current": handle.name == current,
        "deployed": target.recorded is not None,
        "cluster_file": target.recorded.cluster_file if target.recorded else None,
        "runs": list(target.recorded.runs) if target.recorded else [],
        "latest_run": None,  # the latest detached run, as its nodes' supervisors recorded it (docs/runs.md)
        "excluded": list(target.recorded.excluded) if target.recorded else [],
    }
    try:
        # a shallow copy: asdict's deep one took ~0.4 ms a row (a tenth of a second for 256 pods)
        report["pods"] = [{**vars(row), "extra": dict(row.extra)} for row in target.backend.status(handle)]
        if report["runs"] and report["pods"]:
            latest = report["runs"][-1]["id"]
            if hasattr(target.backend, "latest_run"):  # the fanout backends' supervisors' records
                run = target.backend.latest_run(handle, latest)
                report["run_states"] = {str(n): s for n, s in run.pop("nodes").items()}
                report["latest_run"] = run
            elif hasattr(target.backend, "run_states"):  # Slurm has neither: its runs are batch jobs
                report["run_states"] = {str(n): s for n, s in target.backend.run_states(handle, latest).items()}
        if gpus and report["pods"]:
            from mlenv.ops.gpus import gather

            report["gpu_state"] = gather(target.backend, handle)
    except MlenvError as exc:
        if not tolerant:
            raise
        report["pods"], report["error"] = [], str(exc)
    return report


def _print(report: dict[str, Any]) -> None:
    where = f", namespace {report['namespace']}" if report.get("namespace") else ""
    title = f"{report['name']} ({report['backend']}, {report['mode']}{where}{', current' if report['current'] else ''})"
    if report.get("error"):
        error(f"{report['name']}: {report['error']}")
        return
    rows = report["pods"]
    if not rows:
        print(f"{title}: no nodes" + ("" if report["deployed"] else " (not deployed)"))
        return
    extra = sorted({key for row in rows for key in row["extra"]})
    table(title, ["POD", "NODE", "PHASE", "READY", "RESTARTS", "GPUS", "IP", "RDMA", *[c.upper() for c in extra],
                  "DETAIL"],
          [[row["name"], row["node"] or "-", row["phase"], "yes" if row["ready"] else "no", row["restarts"],
            row["gpus"], row["ip"] or "-", row["rdma_devices"] or "-", *[row["extra"].get(c, "") for c in extra],
            row["detail"] or ""] for row in rows])
    for entry in report["excluded"]:
        print(f"excluded: node-{entry['node']} ({entry.get('host', '-')}) since {entry.get('since', '-')}: "
              f"{entry.get('reason', '-')}; mlenv nodes --forget-excluded clears")
    if report["runs"]:
        latest = report["runs"][-1]
        states = report.get("run_states", {})
        running = sum(state == "running" for state in states.values())
        run = report.get("latest_run") or {}
        kind = "detached run" if latest.get("detached", True) else "run"
        restarted = f", attempt {run['attempt']} (restarted {run['attempt']}x; mlenv logs shows every attempt)" \
            if run.get("attempt") else ""
        print(f"latest {kind}: {latest['id']} ({latest['script']}, started {latest['started']}): "
              f"{run.get('state') or 'state unknown'}{restarted}, running on {running}/{len(states)} nodes "
              f"({', '.join(f'node-{n} {s}' for n, s in sorted(states.items()))}); "
              "mlenv logs -f follows it, mlenv stop stops it")
        transport = run.get("transport") or {}
        if transport:
            print("transport: " + ", ".join(f"{node} {found['verdict']} ({found.get('plugin') or 'no network'})"
                                            for node, found in transport.items()))
        if run.get("first_failure"):
            failure = run["first_failure"]
            print(f"first failure: rank {failure['rank']} (node-{failure['node']}) {failure['reason']}")
    if "gpu_state" in report:
        from mlenv.ops.gpus import render

        print(render(report["gpu_state"]))


def show(cluster_ref: str | None, every: bool, as_json: bool, gpus: bool = False) -> int:
    """Print the status; 1 when a deployment could not be queried (or, with ``gpus``, a node did not answer)."""
    recorded = state.load()
    if every:
        targets = [Target(get(d.backend), d.handle, d) for _, d in sorted(recorded.deployments.items())]
    else:
        targets = [resolve(cluster_ref)]
    reports = [_report(target, recorded.current, tolerant=every, gpus=gpus) for target in targets]
    if as_json:
        print_json({"deployments": reports} if every else reports[0])
    else:
        if every and not reports:
            print("no deployments recorded")
        for report in reports:
            _print(report)
    unanswered = any("error" in node for r in reports for node in r.get("gpu_state", []))
    return 1 if unanswered or any(r.get("error") for r in reports) else 0
