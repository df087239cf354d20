"""``mlenv stacks``: the Python stack of every rank of the latest run, on every node at once (the runtime's
``stacks --json`` through the backend's exec), grouped by identical stack, the odd ones out first."""

from __future__ import annotations

from dataclasses import dataclass

from mlenv.core.capabilities import Handle, NodeAccess
from mlenv.errors import OperationError, UsageError
from mlenv.ops.fanout import runtime_json, select_nodes
from mlenv.runtime.forensics.culprit import culprit_of
from mlenv.runtime.forensics.stacks import group, render
from mlenv.runtime.records.jsonvalue import JsonObject, JsonValue
from mlenv.runtime.records.states import RunState

OVER = (RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED)


@dataclass(frozen=True)
class Unreachable:
    """A node that did not answer, and its last words."""

    node: int
    pod: str
    error: str

    def to_json(self) -> JsonObject:
        return {"node": self.node, "pod": self.pod, "error": self.error}


@dataclass(frozen=True)
class StacksReport:
    """The stacks of one run's ranks: ``groups`` of identical stacks, ``collectives`` who is behind in collective
    sequence (:func:`~mlenv.runtime.forensics.culprit.culprit_of`), the NCCL flight recorder dumps, and the nodes
    that did not answer."""

    run: str
    ranks: list[JsonObject]
    groups: list[dict[str, object]]
    collectives: JsonObject
    flight_dumps: list[str]
    unreachable: list[Unreachable]

    def to_json(self) -> dict[str, object]:
        """``stacks --json`` (docs/json.md)."""
        return {"run": self.run, "ranks": self.ranks, "groups": self.groups, "collectives": self.collectives,
                "flight_dumps": self.flight_dumps, "unreachable": [node.to_json() for node in self.unreachable]}


def _objects(value: JsonValue) -> list[JsonObject]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def take(backend: NodeAccess, handle: Handle, only: int | None = None, *, native: bool = False,
         method: str = "auto", run_id: str | None = None) -> StacksReport:
    """The stacks of the latest run, or of ``run_id``; OperationError when there is no run or the latest is over,
    UsageError when run ``run_id`` is over."""
    nodes = select_nodes(backend, handle, only)
    args = ["stacks", "--json", "--method", method, *(["--native"] if native else []),
            *(["--run", run_id] if run_id is not None else [])]
    answers = runtime_json(backend, handle, nodes, *args)
    unreachable = [Unreachable(n, a.node.name, a.error) for n, a in sorted(answers.items()) if a.data is None]
    found = [a.data for _, a in sorted(answers.items()) if a.data is not None and a.data.get("run")]
    if not found:
        said = "; ".join(f"node-{u.node}: {u.error}" for u in unreachable)
        raise OperationError(f"no run of mlenv's on the nodes of {handle.name}: nothing to sample "
                             f"(mlenv launch starts one){f'; {said}' if said else ''}")
    run = str(max(found, key=lambda data: str(data.get("started_at") or ""))["run"])
    mine = [data for data in found if data["run"] == run]
    if all(data.get("state") in OVER for data in mine):
        states = ", ".join(sorted({str(data.get("state")) for data in mine}))
        over = f"run {run} is over ({states}): stacks samples a running job"
        if run_id is not None:  # asked of a finished run: the user can fix that
            raise UsageError(f"{over}; mlenv logs {run} shows what it printed")
        raise OperationError(over)
    ranks = sorted((rank for data in mine for rank in _objects(data.get("ranks"))), key=lambda r: int(str(r["rank"])))
    records: dict[str, JsonValue] = {rank: record for data in mine
                                            for rank, record in _object(data.get("collectives")).items()
                                            if isinstance(record, dict)}
    return StacksReport(run, ranks, group(ranks), culprit_of(ranks, records).to_json(),
                        [str(path) for data in mine for path in _list(data.get("flight_dumps"))], unreachable)


def _object(value: JsonValue) -> JsonObject:
    return value if isinstance(value, dict) else {}


def _list(value: JsonValue) -> list[JsonValue]:
    return value if isinstance(value, list) else []


def text(report: StacksReport) -> str:
    """The groups, then what else there is to look at and which nodes did not answer."""
    methods = sorted({str(rank["method"]) for rank in report.ranks if rank.get("method")})
    lines = [f"run {report.run}: {len(report.ranks)} ranks" + (f", sampled by {' and '.join(methods)}"
                                                              if methods else "")]
    if report.ranks:
        lines.append(f"collectives: {report.collectives['text']}")
    lines.append(render(report.groups) if report.ranks else "no running rank")
    if report.flight_dumps:
        lines.append("NCCL flight recorder dumps:")
        lines += [f"    {path}" for path in report.flight_dumps]
    lines += [f"node-{u.node} {u.pod}: unreachable: {u.error}" for u in report.unreachable]
    return "\n".join(lines)
