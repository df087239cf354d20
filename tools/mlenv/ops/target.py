"""Which deployment a command acts on: the recorded one (current, or named by --cluster), else the cluster
file's plan. Recorded deployments are operated from their handle alone, so an edited (or broken) cluster file
never stops status, exec or clean."""

# Imported where used, measured with python -X importtime on top of this module: mlenv.plan (~8 ms) and mlenv.ui
# (~12 ms, its rich parts apart), which status of a recorded deployment needs neither of.
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlenv import state
from mlenv.config.model import Cluster
from mlenv.core.capabilities import Handle
from mlenv.core.clusters import load_plan
from mlenv.core.registry import Backend, get
from mlenv.errors import MlenvError, UsageError, shown


def backend_of(name: str) -> Backend:
    """The backend called ``name``, handed mlenv's records."""
    return get(name, state.RECORDS)


if TYPE_CHECKING:  # planning (config, schema, quantities) is imported only where a file is planned
    from mlenv.plan import JobPlan


@dataclass(frozen=True)
class Target:
    """A backend and the handle to act on; ``recorded`` when it comes from .mlenv/state.json."""

    backend: Backend
    handle: Handle
    recorded: state.Deployment | None
    plan: JobPlan | None = None


def file_cluster(target: Target, reading: str) -> Cluster | None:
    """The deployment's cluster file as validated, if it still loads; else a warning that ``reading`` (the
    settings wanted from it) were not read, and None."""
    from mlenv.ui import warn

    plan = target.plan
    if plan is None and target.recorded is not None:
        try:
            plan = recorded_plan(target.recorded)
        except MlenvError as exc:
            warn(f"{reading} not read: {str(exc).splitlines()[0]}")
            return None
    return plan.cluster if plan else None


def recorded_plan(deployment: state.Deployment) -> JobPlan:
    """Plan a recorded deployment again from its cluster file, with the mode, nodes and image it was deployed
    with; bad values there blame the record, not options the user never passed."""
    from mlenv.plan import MAX_NODES, MODES

    wrong = []
    if deployment.mode not in MODES:
        wrong.append(f"mode {deployment.mode!r} (expected rdma or tcp)")
    if not 1 <= deployment.nodes <= MAX_NODES:
        wrong.append(f"nodes {deployment.nodes} (expected 1-{MAX_NODES})")
    if deployment.image is not None and (not isinstance(deployment.image, str) or not deployment.image.isprintable()
                                         or any(c.isspace() for c in deployment.image) or not deployment.image):
        wrong.append(f"image {deployment.image!r} (expected an image reference without spaces)")
    if wrong:
        raise UsageError(f"the deployment {deployment.name} recorded in {shown(str(state.state_file()))} has "
                         f"{', '.join(wrong)}; deploy it with CLUSTER=FILE (and MODE=, NODES=) to record it afresh")
    return load_plan(deployment.cluster_file, deployment.mode, deployment.nodes, deployment.image)


def resolve(cluster_ref: str | None) -> Target:
    """The recorded deployment named by ``cluster_ref`` (a deployment name, a cluster name or a file), the
    current one without it, else the cluster file's plan (not deployed)."""
    if cluster_ref is None:
        deployment = state.current()
        return Target(backend_of(deployment.backend), deployment.handle, deployment)
    recorded = state.load()
    try:
        deployment = state.find(recorded, cluster_ref)
    except UsageError:
        job = load_plan(cluster_ref)
        backend = backend_of(job.cluster.backend)
        return Target(backend, backend.deploy.prepare(job).handle, None, job)
    return Target(backend_of(deployment.backend), deployment.handle, deployment)
