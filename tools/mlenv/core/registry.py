"""Every backend, by name, in one table: where its code lives (imported only when used) and what of a cluster
file it reads. Adding a backend is its module, one line here, and, when it has a section of its own, its schema
fragment (``mlenv/backends/<name>.schema.json``, validating that section) and its settings parser."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, NamedTuple, cast

from mlenv.errors import UsageError

if TYPE_CHECKING:
    from mlenv.core.capabilities import Backend

KUBERNETES_FIELDS = frozenset({"kubernetes_version", "app", "image", "nodes", "storage", "security", "resources",
                               "scheduling"})
"""Common sections that only Kubernetes-family backends read."""

CONTAINER_FIELDS = frozenset({"container"})
"""Common sections for backends that start the container on each node themselves (Slurm with Apptainer)."""

SELECTIVE_FIELDS = KUBERNETES_FIELDS | CONTAINER_FIELDS
"""Common sections a backend reads only when its ``uses`` names them; in a file for another backend they are a
validate warning. Every other common section (cluster, network, gpus, nccl, env, notes) every backend reads."""


class BackendInfo(NamedTuple):
    """One backend: how to make it, and what it reads of a cluster file."""

    name: str
    factory: str
    """``module:callable`` returning the backend object; imported lazily."""
    section: str | None = None
    """Its own top-level section of the cluster file (validated by its schema fragment), if any."""
    settings: str | None = None
    """``module:function`` parsing its section: ``function(reader: mlenv.config.reader.ClusterReader)`` returns a
    frozen dataclass (``Cluster.settings``) and reports bad values with ``reader.problem``. Imported only for files
    of this backend, so keep the module's own imports cheap."""
    kube_family: bool = False
    """Talks to a Kubernetes API: ``cluster.namespace`` is required and system namespaces are refused."""
    creates_volumes: bool = False
    """Creates persistent volumes: a storage class is required."""
    cpu_nodes: bool = False
    """``gpus.per_node: 0`` (CPU nodes, gloo) is allowed, and the default."""
    uses: frozenset[str] = frozenset()
    """Which of SELECTIVE_FIELDS it reads; the others in a file for it are a validate warning naming it."""
    machines: tuple[str, ...] | None = None
    """Path of the file's list of machines, one node each (``ssh.hosts``): ``gpus.default_nodes`` defaults to
    its length instead of 2, so every listed machine is used unless the file asks for fewer."""


BACKENDS: dict[str, BackendInfo] = {
    info.name: info for info in (
        BackendInfo("openshift", "mlenv.backends.kubernetes.backend:openshift", kube_family=True,
                    creates_volumes=True, uses=KUBERNETES_FIELDS),
        BackendInfo("kubernetes", "mlenv.backends.kubernetes.backend:kubernetes", kube_family=True,
                    creates_volumes=True, uses=KUBERNETES_FIELDS),
        BackendInfo("local", "mlenv.backends.local.backend:LocalBackend", section="local",
                    settings="mlenv.backends.local.settings:parse", cpu_nodes=True,
                    uses=frozenset({"app", "storage"})),
        BackendInfo("slurm", "mlenv.backends.slurm.backend:SlurmBackend", section="slurm",
                    settings="mlenv.backends.slurm.settings:parse", cpu_nodes=True, uses=CONTAINER_FIELDS,
                    machines=("slurm", "nodelist")),
        BackendInfo("runai", "mlenv.backends.runai.backend:RunaiBackend", section="runai",
                    settings="mlenv.backends.runai.settings:parse",
                    uses=frozenset({"app", "image", "storage", "security"})),
        BackendInfo("ssh", "mlenv.backends.ssh.backend:SshBackend", section="ssh",
                    settings="mlenv.backends.ssh.settings:parse", cpu_nodes=True, uses=frozenset({"app"}),
                    machines=("ssh", "hosts")),
    )
}
DEFAULT_BACKEND = "openshift"


def get(name: str) -> Backend:
    """A backend called ``name``, made now (it reads what it needs of this machine when made)."""
    info = BACKENDS.get(name)
    if info is None:
        raise UsageError(f"unknown backend {name!r}: expected one of {', '.join(sorted(BACKENDS))}")
    module, _, attribute = info.factory.partition(":")
    return cast("Backend", getattr(import_module(module), attribute)())
