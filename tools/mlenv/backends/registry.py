"""Every backend, by name, in one table: where its code lives (imported only when used) and what of a cluster
file it reads. Adding a backend is its module, one line here, and its schema fragment
(``mlenv/backends/<name>.schema.json``, validating its own section of the cluster file)."""

from __future__ import annotations

from dataclasses import dataclass

KUBERNETES_FIELDS = frozenset({"kubernetes_version", "app", "image", "nodes", "storage", "security", "resources",
                               "scheduling"})
"""Common sections that only Kubernetes-family backends read."""


@dataclass(frozen=True)
class BackendInfo:
    """One backend: how to make it, and what it reads of a cluster file."""

    name: str
    factory: str
    """``module:callable`` returning the backend object; imported lazily."""
    section: str | None = None
    """Its own top-level section of the cluster file (validated by its schema fragment), if any."""
    kube_family: bool = False
    """Talks to a Kubernetes API: ``cluster.namespace`` is required and system namespaces are refused."""
    creates_volumes: bool = False
    """Creates persistent volumes: a storage class is required."""
    cpu_nodes: bool = False
    """``gpus.per_node: 0`` (CPU nodes, gloo) is allowed."""
    uses: frozenset[str] = frozenset()
    """Which of KUBERNETES_FIELDS it reads; the others in a file for it are a validate warning naming it."""


BACKENDS: dict[str, BackendInfo] = {
    info.name: info for info in (
        BackendInfo("openshift", "mlenv.backends.kubernetes.backend:openshift", kube_family=True,
                    creates_volumes=True, uses=KUBERNETES_FIELDS),
        BackendInfo("kubernetes", "mlenv.backends.kubernetes.backend:kubernetes", kube_family=True,
                    creates_volumes=True, uses=KUBERNETES_FIELDS),
        BackendInfo("local", "mlenv.backends.local.backend:LocalBackend", section="local", cpu_nodes=True,
                    uses=frozenset({"app", "storage"})),
    )
}
DEFAULT_BACKEND = "openshift"
