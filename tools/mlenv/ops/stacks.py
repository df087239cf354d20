"""``mlenv stacks``: the Python stack of every rank of the latest run, on every node at once (the runtime's
``stacks --json`` through the backend's exec), grouped by identical stack, the odd ones out first."""

from __future__ import annotations

from typing import Any

from mlenv.core.capabilities import Handle, NodeAccess
from mlenv.errors import OperationError, UsageError
from mlenv.ops.fanout import runtime_json, select_nodes
from mlenv.runtime.forensics.culprit import culprit_of
from mlenv.runtime.forensics.stacks import group, render
from mlenv.runtime.records.states import RunState

OVER = (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED)


def take(backend: NodeAccess, handle: Handle, only: int | None = None, *, native: bool = False,
         method: str = "auto", run_id: str | None = None) -> dict[str, Any]:
    """``{"run", "ranks", "groups", "collectives", "flight_dumps", "unreachable"}`` of the latest run, or of
    ``run_id`` (``collectives``: who is behind in collective sequence,
    :func:`~mlenv.runtime.forensics.culprit.culprit`); OperationError when there is no run or the latest is over,
    UsageError when run ``run_id`` is over."""
    nodes = select_nodes(backend, handle, only)
    args = ["stacks", "--json", "--method", method, *(["--native"] if native else []),
            *(["--run", run_id] if run_id is not None else [])]
    answers = runtime_json(backend, handle, nodes, *args)
    unreachable = [{"node": n, "pod": a.node.name, "error": a.error} for n, a in sorted(answers.items())
                   if a.data is None]
    found = [a.data for _, a in sorted(answers.items()) if a.data is not None and a.data.get("run")]
    if not found:
        said = "; ".join(f"node-{u['node']}: {u['error']}" for u in unreachable)
        raise OperationError(f"no run of mlenv's on the nodes of {handle.name}: nothing to sample "
                             f"(mlenv launch starts one){f'; {said}' if said else ''}")
    run = max(found, key=lambda data: str(data.get("started_at") or ""))["run"] if len({d["run"] for d in found}) > 1 \
        else found[0]["run"]
    mine = [data for data in found if data["run"] == run]
    if all(data.get("state") in OVER for data in mine):
        states = ", ".join(sorted({str(data.get("state")) for data in mine}))
        over = f"run {run} is over ({states}): stacks samples a running job"
        if run_id is not None:  # asked of a finished run: the user can fix that
            raise UsageError(f"{over}; mlenv logs {run} shows what it printed")
        raise OperationError(over)
    ranks = sorted((rank for data in mine for rank in data.get("ranks") or []), key=lambda r: int(r["rank"]))
    records = {rank: record for data in mine for rank, record in (data.get("collectives") or {}).items()}
    return {"run": run, "ranks": ranks, "groups": group(ranks), "collectives": culprit_of(ranks, records).to_json(),
            "flight_dumps": [path for data in mine for path in data.get("flight_dumps") or []],
            "unreachable": unreachable}


def text(report: dict[str, Any]) -> str:
    """The groups, then what else there is to look at and which nodes did not answer."""
    methods = sorted({str(rank["method"]) for rank in report["ranks"] if rank.get("method")})
    lines = [f"run {report['run']}: {len(report['ranks'])} ranks" + (f", sampled by {' and '.join(methods)}"
                                                                      if methods else "")]
    if report["ranks"]:
        lines.append(f"collectives: {report['collectives']['text']}")
    lines.append(render(report["groups"]) if report["ranks"] else "no running rank")
    if report["flight_dumps"]:
        lines.append("NCCL flight recorder dumps:")
        lines += [f"    {path}" for path in report["flight_dumps"]]
    lines += [f"node-{u['node']} {u['pod']}: unreachable: {u['error']}" for u in report["unreachable"]]
    return "\n".join(lines)
