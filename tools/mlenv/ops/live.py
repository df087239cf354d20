"""The one launch of a deployment at a time: a launch while a run of the deployment is live is refused, where the
backend gives every run the same ports (a second run would meet the first one's rendezvous and control channel);
``mlenv drill`` refuses on any backend while a run is live (it never shares a deployment with the user's run). A
launch looks for a live run and records its own under the deployment's launch lock (``state.launching``), so two
launches never both find none."""

from __future__ import annotations

from mlenv import state
from mlenv.errors import UsageError
from mlenv.ops.target import Target
from mlenv.runtime.records.states import RunState

LIVE = frozenset({RunState.RUNNING, RunState.HUNG, RunState.RESTARTING, RunState.REQUEUED})
"""The states of a node's share that runs, or will again (a restart, a requeue)."""


def live_run(target: Target) -> tuple[str, str] | None:
    """The deployment's latest run and where it is live, when it is: the nodes it still runs on (its backend's
    ``run_states``), else the launch that holds it (``state.running``: recorded, its nodes not yet told, or
    attached)."""
    if target.recorded is None or not target.recorded.runs:
        return None
    latest = target.recorded.runs[-1].id
    states = target.backend.jobs.run_states(target.handle, latest)
    live = sorted(node for node, end in states.items() if end is not None and end.state in LIVE)
    if live:
        return latest, f"node {', '.join(map(str, live))}"
    return (latest, "its mlenv launch goes on") if state.run_going(target.handle.name) else None


def refuse_while_live(target: Target) -> None:
    """A launch's refusal: UsageError naming the live run and ``mlenv stop`` where the backend cannot give a new
    run ports of its own."""
    if not target.backend.jobs.runs_own_ports(target.handle):
        refuse_beside_live(target, "a second run would share its ports")


def refuse_beside_live(target: Target, why: str) -> None:
    """UsageError naming the deployment's live run, ``why`` nothing may start beside it, and ``mlenv stop``."""
    found = live_run(target)
    if found is not None:
        name = target.handle.name
        raise UsageError(f"run {found[0]} of {name} is still running ({found[1]}), and "
                         f"{why}: wait for it to end, or stop it first (mlenv stop -c {name})")
