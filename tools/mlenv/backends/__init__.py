"""Backends: the only code that talks to the outside world (oc/kubectl, ip netns, subprocesses)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlenv.backends.base import Backend
    from mlenv.config.model import Cluster
    from mlenv.plan import Deployment


def dry_run_text(deployment: Deployment) -> str:
    """Exactly what ``deploy`` would create, as YAML: the manifests, or the local pods."""
    from mlenv.backends.kubernetes.render import render, to_yaml

    if deployment.cluster.backend == "local":
        from dataclasses import asdict

        from mlenv.backends.local.backend import LocalBackend

        pods = [{**asdict(pod), "env": {**deployment.env, "MLENV_NODE_RANK": str(pod.ordinal)}}
                for pod in LocalBackend().planned_pods(deployment)]
        return to_yaml([{"backend": "local", "namespace": deployment.namespace, "pods": pods}])
    return to_yaml(render(deployment).objects)


def backend_for(cluster: Cluster) -> Backend:
    """The backend that operates ``cluster`` (imported lazily: each pulls in its own tools)."""
    if cluster.backend == "local":
        from mlenv.backends.local.backend import LocalBackend

        return LocalBackend()
    from mlenv.backends.kubernetes.backend import OpenShiftBackend

    return OpenShiftBackend(cli="kubectl" if cluster.backend == "kubernetes" else "oc")
