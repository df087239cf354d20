"""GPU state per node: ``mlenv status --gpus`` and ``mlenv top``. The runtime's ``gpus --json`` runs on every node
at once through the backend's exec; a node that cannot be reached is named while the others answer."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from mlenv.core.capabilities import Handle, NodeAccess
from mlenv.ops.fanout import runtime_json, select_nodes
from mlenv.runtime.node.gpus import render_node
from mlenv.runtime.records.jsonvalue import JsonObject


@dataclass(frozen=True)
class GpuReport:
    """One node's GPU state: the runtime's ``gpus --json`` answer there, or why there is none (``error``)."""

    node: int
    pod: str
    answer: JsonObject | None
    error: str | None = None

    def to_json(self) -> JsonObject:
        """``node``, ``pod`` and the runtime's answer, or ``node``, ``pod`` and ``error`` (docs/json.md)."""
        return {"node": self.node, "pod": self.pod,
                **(self.answer if self.answer is not None else {"error": self.error})}


def gather(backend: NodeAccess, handle: Handle, only: int | None = None) -> list[GpuReport]:
    """Each node's GPU report, or why it did not answer; every node of the deployment appears, in ordinal order."""
    nodes = select_nodes(backend, handle, only)
    answers = runtime_json(backend, handle, nodes, "gpus", "--json")
    reports = [GpuReport(ordinal, answer.node.name, answer.data, None if answer.data is not None else answer.error)
               for ordinal, answer in answers.items()]
    if only is None:
        seen = {node.ordinal for node in nodes}
        reports += [GpuReport(n, f"node-{n}", None, "not running") for n in range(handle.nodes) if n not in seen]
    return sorted(reports, key=lambda report: report.node)


def render(reports: Sequence[GpuReport]) -> str:
    """Every node's report as text: a heading line per node, then its tables (or why it did not answer)."""
    blocks = []
    for report in reports:
        title = f"node-{report.node} {report.pod}"
        if report.answer is None:
            blocks.append(f"{title}: unreachable: {report.error}")
            continue
        run = f", run {report.answer['run_id']}" if report.answer.get("run_id") else ""
        blocks.append(f"{title} (host {report.answer.get('host')}{run})\n{render_node(report.answer)}")
    return "\n".join(blocks)


def top(backend: NodeAccess, handle: Handle, only: int | None, interval: float, count: int | None) -> int:
    """Refresh the GPU state of every node every ``interval`` seconds (``count`` times, or until Ctrl-C)."""
    shown = 0
    clear = "\033[H\033[2J" if sys.stdout.isatty() else ""
    try:
        while count is None or shown < count:
            started = time.monotonic()
            reports = gather(backend, handle, only)
            stamp = time.strftime("%H:%M:%S")
            sys.stdout.write(f"{clear}mlenv top: {handle.name} at {stamp} (every {interval:g} s, Ctrl-C ends)\n"
                             f"{render(reports)}\n")
            sys.stdout.flush()
            shown += 1
            if count is None or shown < count:
                time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        return 0
    return 0
