"""The validated cluster: frozen dataclasses built only by ``mlenv.config.validate``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mlenv.config.load import JsonPath, nearest_position

DEFAULT_APP = "ml-dev-env"
DEFAULT_IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"
DEFAULT_KUBERNETES_VERSION = "1.30"
RENDEZVOUS_PORT = 29500


@dataclass(frozen=True)
class ClusterInfo:
    """Which cluster, API server and namespace the file describes."""

    name: str
    api: str | None
    namespace: str
    description: str | None


@dataclass(frozen=True)
class Storage:
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


@dataclass(frozen=True)
class Rdma:
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


@dataclass(frozen=True)
class Tcp:
    """Socket transport settings."""

    interface_exclude: str | None
    p2p_level: str | None


@dataclass(frozen=True)
class Security:
    """ServiceAccount and the one extra capability mlenv may ask for."""

    service_account: str
    requires_privileged_scc: bool
    ipc_lock: bool


@dataclass(frozen=True)
class Gpus:
    """GPUs per node, default node count and processes per node."""

    per_node: int
    type: str | None
    default_nodes: int
    procs_per_node: int


@dataclass(frozen=True)
class Scheduling:
    """Extra tolerations and node selector for the pods."""

    tolerations: tuple[Mapping[str, object], ...]
    node_selector: Mapping[str, str]


@dataclass(frozen=True)
class LocalSettings:
    """How the ``local`` backend makes its pods."""

    isolation: str
    interfaces: tuple[str, ...]
    subnet: str
    root: str | None


@dataclass(frozen=True)
class Cluster:
    """A validated cluster file."""

    source: str
    info: ClusterInfo
    backend: str
    kubernetes_version: str
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
    local: LocalSettings
    notes: str | None
    warnings: tuple[str, ...] = ()
    positions: Mapping[JsonPath, tuple[int, int]] = field(default_factory=dict, compare=False, repr=False)

    def where(self, json_path: JsonPath) -> tuple[int | None, int | None]:
        """Line and column of a field (or its nearest present ancestor) in the source file."""
        return nearest_position(self.positions, json_path) or (None, None)

    @property
    def default_mode(self) -> str:
        """``rdma`` when the cluster has RDMA enabled, else ``tcp``."""
        return "rdma" if self.rdma.enabled else "tcp"
