"""Backends: the only code that talks to the outside world (oc/kubectl, ip netns, subprocesses)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlenv.backends.base import Backend
    from mlenv.config.model import Cluster
    from mlenv.plan import Deployment


def dry_run_text(deployment: Deployment) -> str:
    """Exactly what ``deploy`` would send, as text."""
    from mlenv.render.kubernetes import render, to_yaml

    return to_yaml(render(deployment).objects)


def backend_for(cluster: Cluster) -> Backend:
    """The backend that operates ``cluster`` (imported lazily: each pulls in its own tools)."""
    if cluster.backend == "local":
        from mlenv.backends.local import LocalBackend

        return LocalBackend()
    from mlenv.backends.openshift import OpenShiftBackend

    return OpenShiftBackend(cli="kubectl" if cluster.backend == "kubernetes" else "oc")
