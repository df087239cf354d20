"""GPU state per node: ``mlenv status --gpus`` and ``mlenv top``. The runtime's ``gpus --json`` runs on every node
at once through the backend's exec; a node that cannot be reached is named while the others answer."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from mlenv.core.capabilities import Handle, NodeAccess
from mlenv.ops.fanout import runtime_json, select_nodes
from mlenv.runtime.node.gpus import render_node


def gather(backend: NodeAccess, handle: Handle, only: int | None = None) -> list[dict[str, Any]]:
    """Each node's GPU report (``node``, ``pod`` and the runtime's answer), or ``node``, ``pod`` and
    ``error`` for a node that did not answer; every node of the deployment appears, in ordinal order."""
    nodes = select_nodes(backend, handle, only)
    answers = runtime_json(backend, handle, nodes, "gpus", "--json")
    reports = []
    for ordinal, answer in sorted(answers.items()):
        head = {"node": ordinal, "pod": answer.node.name}
        if answer.data is None:
            reports.append({**head, "error": answer.error})
            continue
        reports.append({**head, **answer.data})
    if only is None:
        seen = {node.ordinal for node in nodes}
        reports += [{"node": n, "pod": f"node-{n}", "error": "not running"} for n in range(handle.nodes)
                    if n not in seen]
    return sorted(reports, key=lambda report: int(report["node"]))


def render(reports: Sequence[dict[str, Any]]) -> str:
    """Every node's report as text: a heading line per node, then its tables (or why it did not answer)."""
    blocks = []
    for report in reports:
        title = f"node-{report['node']} {report['pod']}"
        if "error" in report:
            blocks.append(f"{title}: unreachable: {report['error']}")
            continue
        run = f", run {report['run_id']}" if report.get("run_id") else ""
        blocks.append(f"{title} (host {report.get('host')}{run})\n{render_node(report)}")
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
