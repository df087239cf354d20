"""``mlenv nodes``: where a deployment's nodes run now (a pod's Kubernetes node), the nodes excluded from its next
runs, and ``--forget-excluded`` to clear them."""

from __future__ import annotations

from mlenv import state
from mlenv.core.capabilities import Feature, NodeStatus
from mlenv.errors import MlenvError
from mlenv.ops.target import Target
from mlenv.runtime.records.jsonvalue import JsonObject
from mlenv.ui import info, print_json, table, warn


def show_excluded(target: Target, forget: bool, as_json: bool) -> int:
    """Print (or clear, then print what was cleared) the excluded nodes of ``target``'s deployment, or of its
    cluster when it is not deployed (its Slurm batch jobs'), after the machine each node of the deployment runs on.
    Forgetting changes nothing on the cluster (on Kubernetes the next launch lets the pods back); where the
    deployment's nodes are gone from the cluster (deleted by hand) it says so."""
    name = target.handle.name
    placed = _placed(target)
    listed = state.forget_excluded(name) if forget else state.load().excluded_of(name)
    if as_json:
        shown = [entry.to_json() for entry in listed]
        print_json({"cluster": name, "excluded": [] if forget else shown, "forgotten": shown if forget else None,
                    "nodes": None if placed is None else [_node(status) for status in placed]})
        return 0
    if placed:
        table(f"{name}: its nodes", ["NODE", "POD", "MACHINE", "READY"],
              [[f"node-{s.ordinal}", s.name, s.node or "-", "yes" if s.ready else "no"] for s in placed])
    elif placed is not None:
        info(f"{name}: none of its nodes is on the cluster (deleted by hand?): nothing there to keep off or let back; "
             "mlenv deploy makes them again")
    if forget:
        nodes = ", ".join(f"node-{entry.node}" for entry in listed)
        info(f"{name}: {len(listed)} excluded node{'' if len(listed) == 1 else 's'} forgotten"
             + (f" ({nodes})" if listed else ""))
        return 0
    if not listed:
        print(f"{name}: no node is excluded")
        return 0
    table(f"{name}: excluded from the next runs", ["NODE", "HOST", "SINCE", "WHY"],
          [[f"node-{e.node}", e.host, e.since or "-", e.reason or "-"] for e in listed])
    return 0


def _placed(target: Target) -> list[NodeStatus] | None:
    """The deployment's nodes as its backend sees them now; None where it is not deployed, or they could not be
    read (said)."""
    if target.recorded is None or not target.backend.info.supports(Feature.DEPLOY):
        return None
    try:
        return target.backend.deploy.status(target.handle)
    except MlenvError as exc:
        warn(f"{target.handle.name}: where its nodes run was not read: {str(exc).splitlines()[0]}")
        return None


def _node(status: NodeStatus) -> JsonObject:
    """One node of ``nodes --json``'s ``nodes``."""
    return {"node": status.ordinal, "pod": status.name, "host": status.node, "ready": status.ready}
