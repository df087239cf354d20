"""``mlenv deploy``: prepare the request, record the deployment before the first change, apply, wait for Ready.

A deploy that fails is recorded as such (``state.failed``): a first one can be cleaned but is not made current;
a re-deploy leaves the deployment before it operated as it was (a running job can still be seen, followed and
stopped), with what the attempt created kept for clean."""

# Imported where used (render calls prepared alone): mlenv.core.registry, mlenv.state and ops.target (each hundreds
# of ms with what they import, measured with python -X importtime on a busy host) only to deploy.
from __future__ import annotations

from typing import TYPE_CHECKING

from mlenv.errors import MlenvError, UsageError, shown
from mlenv.ui import warn

if TYPE_CHECKING:
    from mlenv.core.capabilities import Handle, Request
    from mlenv.plan import JobPlan


def prepared(job: JobPlan) -> Request:
    """The backend's request for ``job``, with every warning of the plan and the request printed once."""
    from mlenv.ops.target import backend_of

    request = backend_of(job.cluster.backend).deploy.prepare(job)
    for message in (*job.warnings, *request.warnings):
        warn(message)
    return request


def with_spares(job: JobPlan, spares: int) -> JobPlan:
    """``job`` holding ``spares`` nodes more than it uses (``deploy --spares``); UsageError where the backend lacks
    the feature."""
    from mlenv.core.capabilities import Feature
    from mlenv.core.registry import BACKENDS

    if spares:
        BACKENDS[job.cluster.backend].require(Feature.SPARE_NODES)
    return job._replace(spares=spares)


def with_excluded(job: JobPlan) -> JobPlan:
    """``job`` kept off the machines excluded from its deployment's runs (``mlenv nodes`` lists them; a Kubernetes
    deployment's pods get a node affinity against them, so deploying again keeps them off)."""
    from mlenv import state

    excluded = {entry.host for entry in state.load().excluded_of(job.name)}
    return job._replace(excluded=tuple(sorted(excluded)))


def _check_name(job: JobPlan, cluster_file: str) -> None:
    """A deployment name belongs to one cluster file; another live file of the same name must be cleaned first."""
    from pathlib import Path

    from mlenv import state

    known = state.load().deployments.get(job.name)
    if known is not None and known.cluster_file != cluster_file and Path(known.cluster_file).exists():
        raise UsageError(f"a deployment named {job.name} is already recorded for {shown(known.cluster_file)}: "
                         f"clean it first (mlenv clean -c {job.name}) or give {shown(job.cluster.source)} another "
                         "cluster.name")


def deploy(job: JobPlan, image: str | None, timeout: float) -> Handle:
    """Apply ``job`` and wait until every node is ready; re-running converges. ``image``: the --image override
    to remember."""
    from pathlib import Path

    from mlenv import state
    from mlenv.ops.target import backend_of

    backend = backend_of(job.cluster.backend).deploy
    request = prepared(job)
    cluster_file = str(Path(job.cluster.source).resolve())
    _check_name(job, cluster_file)

    def record(handle: Handle) -> None:
        state.record(state.Deployment(handle.name, handle.backend, cluster_file, job.mode, job.nodes, image, handle))

    with state.deploying(job.name):
        try:
            handle = backend.apply(request, record)
            backend.wait_ready(handle, timeout, record)
        except MlenvError as exc:
            state.failed(job.name, str(exc))
            raise
        except KeyboardInterrupt:
            state.failed(job.name, "interrupted")
            raise
        state.succeeded(job.name)
    return handle
