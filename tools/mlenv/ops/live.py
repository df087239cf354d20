"""The one launch of a deployment at a time: a launch while a run of the deployment is live is refused, where the
backend gives every run the same ports (a second run would meet the first one's rendezvous and control channel)."""

from __future__ import annotations

from mlenv.errors import UsageError
from mlenv.ops.target import Target
from mlenv.runtime.records.runlayout import HUNG, REQUEUED, RESTARTING, RUNNING


def refuse_while_live(target: Target) -> None:
    """UsageError naming the deployment's latest run and ``mlenv stop`` when it is still running on a node (its
    backend's ``run_states``) and the backend cannot give a new run ports of its own."""
    if target.recorded is None or not target.recorded.runs or target.backend.jobs.runs_own_ports(target.handle):
        return
    latest = str(target.recorded.runs[-1].get("id"))
    states = target.backend.jobs.run_states(target.handle, latest)
    live = sorted(node for node, state in states.items()
                  if state.split(" ")[0] in (RUNNING, HUNG, RESTARTING, REQUEUED))
    if live:
        name = target.handle.name
        raise UsageError(f"run {latest} of {name} is still running (node {', '.join(map(str, live))}), and a second "
                         f"run would share its ports: wait for it to end, or stop it first (mlenv stop -c {name})")
