"""Cluster + mode + overrides -> Deployment: every name, address and variable a backend needs. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mlenv.config.model import RENDEZVOUS_PORT, Cluster
from mlenv.config.quantity import half_of
from mlenv.errors import ConfigError, Problem

MODES = ("rdma", "tcp")
WORKSPACE_CLAIM = "ml-dev-workspace"
DATASETS_CLAIM = "ml-datasets"
IPC_LOCK_SCC = "mlenv-ipc-lock"
DEFAULT_SHM = "8Gi"


@dataclass(frozen=True)
class StoragePlan:
    """Volumes: shared claims (``rwx``) or per-pod ``volumeClaimTemplates``."""

    mode: str
    storage_class: str | None
    workspace_size: str
    datasets_size: str
    shm_size: str
    workspace_claim: str = WORKSPACE_CLAIM
    datasets_claim: str = DATASETS_CLAIM

    @property
    def shared(self) -> bool:
        """True when every pod mounts the same workspace volume."""
        return self.mode == "rwx"


@dataclass(frozen=True)
class Deployment:
    """What to create, with which names, and the environment every node gets."""

    cluster: Cluster
    mode: str
    nodes: int
    procs_per_node: int
    image: str
    app: str
    namespace: str
    service_account: str
    headless_service: str
    master_addr: str
    master_port: int
    labels: Mapping[str, str]
    selector: Mapping[str, str]
    annotations: Mapping[str, str]
    nccl_env: Mapping[str, str]
    env: Mapping[str, str]
    storage: StoragePlan
    rdma_networks: tuple[str, ...]
    rdma_resources: Mapping[str, int]
    ipc_lock: bool
    ipc_lock_scc: str | None
    warnings: tuple[str, ...]

    def pod_dns(self, ordinal: int) -> str:
        """Stable DNS name of pod ``ordinal`` behind the headless Service."""
        return f"{self.app}-{ordinal}.{self.headless_service}.{self.namespace}.svc.cluster.local"


def nccl_env(cluster: Cluster, mode: str) -> dict[str, str]:
    """NCCL variables that the cluster file asks for in ``mode``; nccl.env entries win."""
    env: dict[str, str] = {}
    if cluster.nccl_debug:
        env["NCCL_DEBUG"] = cluster.nccl_debug
    rdma, tcp = cluster.rdma, cluster.tcp
    if mode == "rdma":
        env["NCCL_IB_DISABLE"] = "0"
        if rdma.devices:
            env["NCCL_IB_HCA"] = "=" + ",".join(rdma.devices)
        if rdma.interfaces:
            env["NCCL_SOCKET_IFNAME"] = ",".join(rdma.interfaces)
        elif tcp.interface_exclude:
            env["NCCL_SOCKET_IFNAME"] = tcp.interface_exclude
        optional = {
            "NCCL_IB_GID_INDEX": rdma.gid_index if isinstance(rdma.gid_index, int) else None,
            "NCCL_NET_GDR_LEVEL": rdma.gdr_level,
            "NCCL_CROSS_NIC": rdma.cross_nic,
            "NCCL_IB_TIMEOUT": rdma.ib_timeout,
            "NCCL_MIN_NCHANNELS": rdma.min_nchannels,
        }
        env.update({name: str(value) for name, value in optional.items() if value is not None})
    else:
        env["NCCL_IB_DISABLE"] = "1"
        if tcp.interface_exclude:
            env["NCCL_SOCKET_IFNAME"] = tcp.interface_exclude
    if tcp.p2p_level:
        env["NCCL_P2P_LEVEL"] = tcp.p2p_level
    env.update(cluster.nccl_env)
    return env


def _problem(cluster: Cluster, path: tuple[str, ...], message: str) -> ConfigError:
    line, col = cluster.where(path)
    return ConfigError([Problem(cluster.source, line, col, ".".join(path), message)])


def _check_mode(cluster: Cluster, mode: str) -> None:
    if mode not in MODES:
        raise ConfigError(f"unknown mode '{mode}': expected rdma or tcp (MODE=rdma or MODE=tcp)")
    if mode == "rdma" and not cluster.rdma.enabled:
        raise _problem(cluster, ("network", "rdma", "enabled"),
                       "RDMA mode requested but this cluster has rdma.enabled: false; "
                       "use MODE=tcp (--mode tcp), or set network.rdma.enabled: true if it has RDMA")


def _check_nodes(cluster: Cluster, nodes: int) -> None:
    if nodes < 1:
        raise ConfigError(f"--nodes must be at least 1, got {nodes}")
    pinned = len(cluster.gpu_nodes)
    if pinned and nodes > pinned:
        raise _problem(cluster, ("nodes", "gpu_nodes"),
                       f"{nodes} nodes requested but only {pinned} are pinned in nodes.gpu_nodes "
                       f"(one pod per node); use --nodes {pinned} or fewer, or pin more nodes")


def _storage(cluster: Cluster) -> StoragePlan:
    memory_limit = cluster.limits.get("memory")
    shm = cluster.storage.shm_size or (half_of(memory_limit) if memory_limit else DEFAULT_SHM)
    return StoragePlan(
        mode=cluster.storage.mode,
        storage_class=cluster.storage.storage_class,
        workspace_size=cluster.storage.workspace_size,
        datasets_size=cluster.storage.datasets_size,
        shm_size=shm,
    )


def _warnings(cluster: Cluster, mode: str) -> tuple[str, ...]:
    warnings = list(cluster.warnings)
    if mode == "rdma" and not cluster.rdma.networks and not cluster.rdma.resources:
        warnings.append(
            "RDMA mode without network.rdma.networks or network.rdma.resources: pods will get no RDMA device "
            "and NCCL will fall back to sockets; add the Multus network names "
            "(oc get network-attachment-definitions) or the device-plugin resource (e.g. rdma/rdma: 1)")
    return tuple(warnings)


def plan(cluster: Cluster, mode: str | None = None, nodes: int | None = None,
         image: str | None = None) -> Deployment:
    """Decide everything about a deployment of ``cluster``; raises ConfigError for impossible requests."""
    if image is not None and (not image or any(char.isspace() for char in image)):
        raise ConfigError(f"--image: expected a container image reference without spaces, got {image!r}")
    chosen_mode = mode or cluster.default_mode
    _check_mode(cluster, chosen_mode)
    node_count = cluster.gpus.default_nodes if nodes is None else nodes
    _check_nodes(cluster, node_count)
    app, namespace = cluster.app_name, cluster.info.namespace
    headless = f"{app}-headless"
    master_addr = f"{app}-0.{headless}.{namespace}.svc.cluster.local"
    selector = {"app": f"{app}-multi", "app.kubernetes.io/instance": app}
    labels = {
        **selector,
        "app.kubernetes.io/name": app,
        "app.kubernetes.io/managed-by": "mlenv",
        "app.kubernetes.io/part-of": "mlenv",
    }
    annotations = {"mlenv.io/cluster": cluster.info.name, "mlenv.io/mode": chosen_mode}
    if cluster.info.description:
        annotations["mlenv.io/description"] = cluster.info.description
    nccl = nccl_env(cluster, chosen_mode)
    env = {
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(RENDEZVOUS_PORT),
        "MLENV_NUM_NODES": str(node_count),
        "MLENV_PROCS_PER_NODE": str(cluster.gpus.procs_per_node),
        "MLENV_APP_NAME": app,
        "MLENV_NETWORK_MODE": chosen_mode,
        **nccl,
    }
    ipc_lock_scc = IPC_LOCK_SCC if cluster.security.ipc_lock and cluster.backend == "openshift" else None
    return Deployment(
        cluster=cluster,
        mode=chosen_mode,
        nodes=node_count,
        procs_per_node=cluster.gpus.procs_per_node,
        image=image or cluster.image,
        app=app,
        namespace=namespace,
        service_account=cluster.security.service_account,
        headless_service=headless,
        master_addr=master_addr,
        master_port=RENDEZVOUS_PORT,
        labels=labels,
        selector=selector,
        annotations=annotations,
        nccl_env=nccl,
        env=env,
        storage=_storage(cluster),
        rdma_networks=cluster.rdma.networks if chosen_mode == "rdma" else (),
        rdma_resources=cluster.rdma.resources if chosen_mode == "rdma" else {},
        ipc_lock=cluster.security.ipc_lock,
        ipc_lock_scc=ipc_lock_scc,
        warnings=_warnings(cluster, chosen_mode),
    )
