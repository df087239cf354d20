"""The validated cluster: frozen dataclasses built only by ``mlenv.config.validate``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from mlenv.config.positions import JsonPath, nearest_position

DEFAULT_APP = "ml-dev-env"
DEFAULT_NODES = 2
"""``gpus.default_nodes`` when the file sets neither it nor a list of machines (BackendInfo.machines)."""
DEFAULT_IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"
RENDEZVOUS_PORT = 29500


class ClusterInfo(NamedTuple):
    """Which cluster, API server and namespace the file describes."""

    name: str
    api: str | None
    namespace: str | None
    """Required, and never a system namespace, for Kubernetes-family backends; optional for the others."""
    description: str | None


class Storage(NamedTuple):
    """Shared RWX claims, or one volume per pod (``volumeClaimTemplates``)."""

    mode: str
    class_rwx: str | None
    class_rwo: str | None
    workspace_size: str
    datasets_size: str
    shm_size: str | None

    @property
    def storage_class(self) -> str | None:
        """The storage class that the chosen mode uses."""
        return self.class_rwx if self.mode == "rwx" else self.class_rwo


class Rdma(NamedTuple):
    """RDMA (InfiniBand / RoCE) settings; ``gid_index`` "auto" leaves detection to the in-pod runtime."""

    enabled: bool
    devices: tuple[str, ...]
    interfaces: tuple[str, ...]
    gid_index: int | str | None
    gdr_level: str | None
    cross_nic: int | None
    ib_timeout: int | None
    min_nchannels: int | None
    networks: tuple[str, ...]
    resources: Mapping[str, int]


class Tcp(NamedTuple):
    """Socket transport settings."""

    interface_exclude: str | None
    p2p_level: str | None
    interfaces: Mapping[str, str]
    """Host name -> socket interface, overriding the runtime's route-based choice on that host."""


class Security(NamedTuple):
    """ServiceAccount, the one extra capability mlenv may ask for, the user id and network isolation."""

    service_account: str
    ipc_lock: bool
    network_policy: bool
    """Isolate the pods with a NetworkPolicy (default true)."""
    run_as_user: int | None


class Gpus(NamedTuple):
    """GPUs per node, default node count and processes per node."""

    per_node: int
    type: str | None
    default_nodes: int
    procs_per_node: int


DEFAULT_GRACE_SECONDS = 30
"""Kubernetes' own default terminationGracePeriodSeconds."""


class TopologyRequest(NamedTuple):
    """Kueue's topology-aware placement: every pod in one domain of a node label (``required``), or as few as fit
    (``preferred``)."""

    mode: str
    """``required`` or ``preferred``."""
    level: str
    """The node label whose values are the domains (``topology.kubernetes.io/zone``)."""


class Scheduling(NamedTuple):
    """Extra tolerations and node selector for the pods, their termination grace, and who admits them."""

    tolerations: tuple[Mapping[str, object], ...]
    node_selector: Mapping[str, str]
    grace_period: int = DEFAULT_GRACE_SECONDS
    """Seconds between SIGTERM and SIGKILL when a pod is deleted (terminationGracePeriodSeconds)."""
    admission: str = "none"
    """Gang admission of all the pods at once: ``none``, ``kueue`` or ``volcano``."""
    queue: str | None = None
    """Kueue's LocalQueue or Volcano's queue."""
    priority_class: str | None = None
    """The pods' PriorityClass."""
    topology: TopologyRequest | None = None
    move_faulty_pods: bool = False
    """A detached run's pods may move themselves off a node judged faulty (a Role to patch their StatefulSet)."""


@dataclass(frozen=True)
class Bind:
    """A host directory bound into the container (``--bind host:container:options``)."""

    host: str
    container: str
    options: str
    """``rw`` (default) or ``ro``."""


@dataclass(frozen=True)
class Container:
    """The container that backends without Kubernetes start on each node (Apptainer/Singularity)."""

    runtime: str
    image: str
    """A ``.sif`` path or a ``docker://``, ``oras://`` or ``library://`` reference."""
    nv: bool
    """Pass the NVIDIA GPUs and driver in (``--nv``)."""
    binds: tuple[Bind, ...]
    env: Mapping[str, str]
    """Set inside the container; values may use $VARS, which the container expands."""


class Cluster(NamedTuple):
    """A validated cluster file."""

    source: str
    info: ClusterInfo
    backend: str
    app_name: str
    image: str
    gpu_nodes: tuple[str, ...]
    storage: Storage
    rdma: Rdma
    tcp: Tcp
    security: Security
    gpus: Gpus
    requests: Mapping[str, str]
    limits: Mapping[str, str]
    nccl_debug: str | None
    nccl_env: Mapping[str, str]
    scheduling: Scheduling
    env: Mapping[str, str]
    """Plain variables every node gets (OMP_NUM_THREADS, HF_HOME); mlenv's own names are refused."""
    container: Container | None
    expected_busbw_gbytes: float | None
    """The all-reduce bus bandwidth the network should reach, in GB/s (decimal gigabytes per second)."""
    expect_transport: str | None
    """``network.expect_transport``: rdma, sockets or any, what NCCL must prove at launch; None: the mode's default."""
    max_restarts: int
    """launch.max_restarts: how many times a failed run is started again (0: never)."""
    settings: object | None
    """The backend's own section parsed by its settings parser (BackendInfo.settings), e.g. LocalSettings."""
    notes: str | None
    hang_timeout: float | None = None
    """launch.hang_timeout: the default of ``mlenv launch --hang-timeout``."""
    node_silence: float | None = None
    """launch.node_silence: seconds a silent node is waited for before it is lost (None: the runtime's 15)."""
    drill_targets: Mapping[str, float] = field(default_factory=dict)
    """``drill.targets``: seconds per phase of ``mlenv drill`` (dead_rank, lost_node, hang_extra, resumed) over its
    defaults."""
    idle_seconds: int | None = None
    """launch.idle_minutes in seconds: GPUs under ``idle_util`` this long flag a run idle (None: not watched)."""
    idle_util: float | None = None
    """launch.idle_util: the utilization percent under which a GPU is idle (None: the default, 5)."""
    nccl_tests: str = "auto"
    """``network.nccl_tests``: where ``nccl-test --tool nccl-tests`` finds NVIDIA's nccl-tests on the nodes: ``auto``
    (the usual places), ``off`` (never), or the directory holding ``all_reduce_perf``."""
    warnings: tuple[str, ...] = ()
    positions: Mapping[JsonPath, tuple[int, int]] = MappingProxyType({})

    def where(self, json_path: JsonPath) -> tuple[int | None, int | None]:
        """Line and column of a field (or its nearest present ancestor) in the source file."""
        return nearest_position(self.positions, json_path) or (None, None)

    @property
    def default_mode(self) -> str:
        """``rdma`` when the cluster has RDMA enabled, else ``tcp``."""
        return "rdma" if self.rdma.enabled else "tcp"
