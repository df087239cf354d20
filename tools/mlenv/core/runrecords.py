"""``status``'s ``latest_run`` from what each node's supervisor recorded of a run (docs/runs.md), however a backend
reads the records (the runtime's ``jobs --json`` on every node, or the shared run directory on Slurm): one place,
so every backend answers the same shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlenv.runtime.runlayout import run_state

NodeJob = Mapping[str, Any]
"""One node's share of a run in the shape of an entry of the runtime's ``jobs --json``: ``state``, ``exit_code``,
``attempt``, ``ranks``, ``first_failure``, ``transport``, ``stacks``, ``idle``."""


def node_state(job: NodeJob | None) -> str:
    """A node's entry of ``run_states``: its state, with the exit code once it ended (``failed (7)``), or ``-``."""
    if job is None:
        return "-"
    code = job.get("exit_code")
    return f"{job.get('state', '?')} ({code})" if code is not None else str(job.get("state", "?"))


def latest_run(run_id: str, jobs: Mapping[int, NodeJob | None]) -> dict[str, Any]:
    """Run ``run_id`` from its nodes' shares (node ordinal -> share, None where the node has none):
    ``{"id", "state", "attempt", "ranks", "first_failure", "transport": {"node-N": {"verdict", "plugin", "devices",
    "nccl_version"}}, "stacks", "idle": {"node-N": {...}}|null, "nodes": {ordinal: state}}`` (``stacks``: the hang
    watchdog's capture of the whole job, on node 0; ``idle``: each node's idle GPUs while the job is flagged idle)."""
    known = [job for job in jobs.values() if job is not None]
    failures = [job["first_failure"] for job in known if job.get("first_failure")]  # the same on every node
    return {"id": run_id, "state": run_state([str(job.get("state")) for job in known]),
            "attempt": max((int(job.get("attempt", 0)) for job in known), default=0),
            "ranks": sorted((rank for job in known for rank in job.get("ranks", [])), key=lambda rank: rank["rank"]),
            "first_failure": failures[0] if failures else None,
            "transport": {f"node-{ordinal}": job["transport"] for ordinal, job in sorted(jobs.items())
                          if job is not None and job.get("transport")},
            "stacks": next((job["stacks"] for job in known if job.get("stacks")), None),
            "idle": {f"node-{ordinal}": job["idle"] for ordinal, job in sorted(jobs.items())
                     if job is not None and job.get("idle")} or None,
            "nodes": {ordinal: node_state(job) for ordinal, job in jobs.items()}}
