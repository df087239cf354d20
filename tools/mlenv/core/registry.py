"""Every backend, by name, in one table: where its code lives (imported only when used), the capabilities it
implements and what of a cluster file it reads. Adding a backend is its module, one line here, and, when it has a
section of its own, its schema fragment (``mlenv/backends/<name>.schema.json``, validating that section) and its
settings parser.

What a backend cannot do is declared here and only here: its entry's ``unsupported`` (``core.capabilities.Feature``
-> why, and what to do instead). An operation checks what it needs once, before acting: ``require`` (a feature),
or the capability it asks the made backend for (``backend.jobs``); a lacking backend is one UsageError line (exit 2)
naming the backend, the feature and why, never an AttributeError.
The cluster-file rules (section, settings parser, ...) are handed down to ``mlenv.config`` from here
(``CONFIG_RULES``, through ``core.clusters``): config imports nothing above it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import import_module
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from mlenv.config.reader import BackendTable
from mlenv.core.capabilities import (
    CHECKS,
    DEPLOY,
    JOBS,
    NODE_ACCESS,
    PREEMPTS,
    Capability,
    Checks,
    Deploy,
    Feature,
    Handle,
    Jobs,
    NodeAccess,
    Preempts,
)
from mlenv.core.recorded import ExcludedNode, SubmittedJob
from mlenv.errors import UsageError

if TYPE_CHECKING:
    from pathlib import Path

    from mlenv.config.reader import ClusterReader

C = TypeVar("C")

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
    rules: str | None = None
    """``module:function`` checking the common sections by its own rules: ``function(reader)`` reports with
    ``reader.problem`` / ``reader.warn`` (OpenShift's SCC); imported only for files of this backend."""
    unsupported: Mapping[Feature, str] = MappingProxyType({})
    """The features it lacks -> why, and what to do instead (``the X backend cannot <feature>; <this>``); it
    supports every other one (the conformance suite runs each capability it supports)."""
    keeps_records: bool = False
    """Reads and records itself what it submitted (batch jobs) or what runs left out without mlenv (nodes a
    detached run moved its pods off): its factory takes the ``Records`` it is handed
    (``mlenv.state.RECORDS``), as backends never import state."""
    discover: str | None = None
    """``module:function`` writing ``clusters/NAME.yaml`` from the logged-in cluster (``mlenv discover``):
    ``function(name, namespace, force) -> Path``; imported only by that command."""
    task_launcher: str | None = None
    """The scheduler's own command that starts one process per GPU across the nodes (``srun``), which runs NVIDIA's
    nccl-tests (``nccl-test --tool nccl-tests``); None: the runtime's launcher does (mpirun from node 0)."""

    def parse_settings(self, reader: ClusterReader) -> object | None:
        """Its own section, parsed by the function ``settings`` names (None without one)."""
        return None if self.settings is None else _function(self.settings)(reader)

    def check_common(self, reader: ClusterReader) -> None:
        """Its own rules on the common sections, by the function ``rules`` names (none without one)."""
        if self.rules is not None:
            _function(self.rules)(reader)

    def supports(self, feature: Feature) -> bool:
        """Whether it has ``feature`` (it is not declared unsupported)."""
        return feature not in self.unsupported

    def require(self, *features: Feature) -> None:
        """Nothing when it has every one of ``features``; else UsageError (one line, exit 2) naming the backend and
        each lacking feature with why."""
        lacking = [f"cannot {feature.value}; {self.unsupported[feature]}" for feature in features
                   if feature in self.unsupported]
        if lacking:
            raise UsageError(f"the {self.name} backend {'; it also '.join(lacking)}")


NO_SPARES = "a Slurm allocation holds spare nodes (an ssh cluster lists its spare hosts in ssh.spares)"
NO_DISCOVER = "write clusters/NAME.yaml yourself (mlenv discover reads a Kubernetes cluster)"
NO_PREEMPTION = "its nodes are not taken away under a run by a scheduler (Kubernetes pods are)"
NOT_TAKEN_AWAY = {Feature.PREEMPTION: NO_PREEMPTION, Feature.TAKE_AWAY: NO_PREEMPTION}
RUNAI_PREEMPTION = ("its pods are not told when they are taken away under a run (no PID 1 of mlenv's there): the "
                    "run ends; launch it again")
KUBERNETES_LACKS = {Feature.SPARE_NODES: NO_SPARES}

BACKENDS: dict[str, BackendInfo] = {
    info.name: info for info in (
        BackendInfo("openshift", "mlenv.backends.kubernetes.backend:openshift", kube_family=True, keeps_records=True,
                    creates_volumes=True, uses=KUBERNETES_FIELDS, settings="mlenv.backends.kubernetes.rules:parse",
                    rules="mlenv.backends.kubernetes.rules:check_openshift",
                    unsupported={**KUBERNETES_LACKS, Feature.DISCOVER: NO_DISCOVER}),
        BackendInfo("kubernetes", "mlenv.backends.kubernetes.backend:kubernetes", kube_family=True, keeps_records=True,
                    creates_volumes=True, uses=KUBERNETES_FIELDS, settings="mlenv.backends.kubernetes.rules:parse",
                    rules="mlenv.backends.kubernetes.rules:check",
                    discover="mlenv.backends.kubernetes.discover:run_discover",
                    unsupported=KUBERNETES_LACKS),
        BackendInfo("local", "mlenv.backends.local.backend:LocalBackend", section="local",
                    settings="mlenv.backends.local.settings:parse", cpu_nodes=True,
                    uses=frozenset({"app", "storage"}),
                    unsupported={Feature.SPARE_NODES: NO_SPARES, Feature.DISCOVER: NO_DISCOVER,
                                 **NOT_TAKEN_AWAY}),
        BackendInfo("slurm", "mlenv.backends.slurm.backend:SlurmBackend", section="slurm",
                    settings="mlenv.backends.slurm.settings:parse", cpu_nodes=True, uses=CONTAINER_FIELDS,
                    machines=("slurm", "nodelist"), keeps_records=True, task_launcher="srun",
                    unsupported={Feature.DISCOVER: NO_DISCOVER, Feature.PREEMPTION: (
                        "Slurm warns a batch job before it ends it: slurm.signal gives the ranks the checkpoint "
                        "signal and slurm.requeue resumes the job, capped by --max-restarts")}),
        BackendInfo("runai", "mlenv.backends.runai.backend:RunaiBackend", section="runai",
                    settings="mlenv.backends.runai.settings:parse",
                    rules="mlenv.backends.kubernetes.rules:check_resources",
                    uses=frozenset({"app", "image", "storage", "security"}),
                    unsupported={Feature.SPARE_NODES: NO_SPARES, Feature.DISCOVER: NO_DISCOVER,
                                 Feature.NODE_EXCLUSION: (
                                     "the runai CLI places a workload's pods by node pool (--node-pools) or node "
                                     "label (--node-type) only, never away from one node: cordon the node "
                                     "(kubectl cordon NODE) or have it taken out of the project's node pools, then "
                                     "mlenv nodes --forget-excluded"),
                                 Feature.PREEMPTION: RUNAI_PREEMPTION, Feature.TAKE_AWAY: RUNAI_PREEMPTION}),
        BackendInfo("ssh", "mlenv.backends.ssh.backend:SshBackend", section="ssh",
                    settings="mlenv.backends.ssh.settings:parse", cpu_nodes=True, uses=frozenset({"app"}),
                    machines=("ssh", "hosts"),
                    unsupported={Feature.SPARE_NODES: "list spare hosts in the cluster file's ssh.spares instead",
                                 Feature.DISCOVER: NO_DISCOVER, **NOT_TAKEN_AWAY}),
    )
}
DEFAULT_BACKEND = "openshift"


def _function(path: str) -> Callable[[ClusterReader], Any]:
    """The function ``module:function`` names, imported now."""
    module, _, function = path.partition(":")
    found: Callable[[ClusterReader], Any] = getattr(import_module(module), function)
    return found


def discoverer(name: str) -> Callable[[str, str | None, bool], Path]:
    """The ``discover`` function of backend ``name``; UsageError where it lacks the feature."""
    info = BACKENDS[name]
    info.require(Feature.DISCOVER)
    module, _, function = str(info.discover).partition(":")
    found: Callable[[str, str | None, bool], Path] = getattr(import_module(module), function)
    return found


CONFIG_RULES = BackendTable(BACKENDS, DEFAULT_BACKEND, SELECTIVE_FIELDS)
"""What mlenv.config needs of the registry, handed down to it (core.clusters)."""


class Records(Protocol):
    """What a backend may read and record of mlenv's records (``mlenv.state.RECORDS`` provides it), by deployment
    name: the recorded handle, the batch jobs submitted whether or not the cluster is deployed, and the nodes left
    out of the next runs."""

    def handle_of(self, name: str) -> Handle | None:
        """The recorded deployment's handle, if ``name`` is recorded."""

    def jobs_of(self, name: str) -> tuple[SubmittedJob, ...]:
        """The jobs recorded for ``name``, oldest first."""

    def add_job(self, name: str, job: SubmittedJob, keep: int) -> None:
        """Record ``job`` for ``name``, keeping the newest ``keep``."""

    def update_job(self, name: str, job: SubmittedJob) -> None:
        """Record ``job`` in place of the recorded job with its id of ``name`` (nothing when none is recorded)."""

    def exclude(self, name: str, nodes: dict[int, tuple[str, str]]) -> None:
        """Record ``nodes`` (node number -> (host, why)) as excluded from the next runs of ``name``."""

    def excluded_of(self, name: str) -> tuple[ExcludedNode, ...]:
        """The nodes excluded from the next runs of ``name``."""


@dataclass(frozen=True)
class Backend:
    """A backend made by ``get``: ask it for the capability an operation needs."""

    info: BackendInfo
    impl: object

    @property
    def name(self) -> str:
        return self.info.name

    def need(self, capability: Capability[C]) -> C:
        """The backend as ``capability``; UsageError (``BackendInfo.require``) when it lacks the feature."""
        self.info.require(capability.feature)
        impl = self.impl
        if not isinstance(impl, capability.protocol):  # the entry claims what its class does not declare
            raise TypeError(f"{type(impl).__name__} does not implement {capability.protocol.__name__}: declare "
                            f"{capability.feature} unsupported in core/registry.py")
        return impl

    @property
    def deploy(self) -> Deploy:
        return self.need(DEPLOY)

    @property
    def access(self) -> NodeAccess:
        return self.need(NODE_ACCESS)

    @property
    def jobs(self) -> Jobs:
        return self.need(JOBS)

    @property
    def preempts(self) -> Preempts:
        """Where a run can be preempted from outside as its scheduler does (Feature.TAKE_AWAY): the drill's."""
        return self.need(PREEMPTS)

    @property
    def checks(self) -> Checks:
        return self.need(CHECKS)


def get(name: str, records: Records) -> Backend:
    """A backend called ``name``, made now (it reads what it needs of this machine when made); a backend that keeps
    records is handed ``records``."""
    info = BACKENDS.get(name)
    if info is None:
        raise UsageError(f"unknown backend {name!r}: expected one of {', '.join(sorted(BACKENDS))}")
    module, _, attribute = info.factory.partition(":")
    factory: Any = getattr(import_module(module), attribute)
    return Backend(info, factory(records) if info.keeps_records else factory())
