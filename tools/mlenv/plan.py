"""Cluster + mode + overrides -> JobPlan: what every backend needs, in no backend's terms. Pure.

Kubernetes names (Services, labels, DNS), Slurm options or ssh hosts are decided by each backend's ``prepare``
from this plan; the plan knows none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from mlenv.config.model import RENDEZVOUS_PORT, Cluster
from mlenv.config.quantity import half_of
from mlenv.errors import ConfigError, Problem

MODES = ("rdma", "tcp")
MAX_NODES = 1024
DEFAULT_SHM = "8Gi"


class StorageIntent(NamedTuple):
    """What storage the job wants: one workspace shared by every node, or one per node, and their sizes."""

    shared: bool
    storage_class: str | None
    workspace_size: str
    datasets_size: str
    shm_size: str


class JobPlan(NamedTuple):
    """Everything decided about running ``cluster``'s environment, for any backend."""

    cluster: Cluster
    name: str
    """The deployment's name (the cluster's): how state, ``mlenv use`` and messages call it."""
    app: str
    """The application name: prefix of node names, job names, workloads."""
    mode: str
    nodes: int
    procs_per_node: int
    gpus_per_node: int
    image: str
    """Container image of Kubernetes-family backends (the file's ``image``, or ``--image``)."""
    env: Mapping[str, str]
    """The env contract every node gets: MLENV_NUM_NODES, MLENV_PROCS_PER_NODE, MASTER_PORT, the NCCL variables
    and the file's ``env:``. MLENV_NODE_RANK and MASTER_ADDR are added by the backend, which knows them."""
    nccl_env: Mapping[str, str]
    storage: StorageIntent
    rdma_networks: tuple[str, ...]
    rdma_resources: Mapping[str, int]
    ipc_lock: bool
    warnings: tuple[str, ...]
    spares: int = 0
    """Nodes held beyond ``nodes`` to take an excluded node's place (``deploy --spares``; a Slurm allocation)."""
    excluded: tuple[str, ...] = ()
    """Machines the deployment keeps off (the excluded nodes ``mlenv nodes`` lists): Kubernetes pods get a node
    affinity against them."""


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
        raise ConfigError(f"--mode: expected rdma or tcp, got {mode!r} (MODE=rdma or MODE=tcp)")
    if mode == "rdma" and not cluster.rdma.enabled:
        raise _problem(cluster, ("network", "rdma", "enabled"),
                       "RDMA mode requested but this cluster has rdma.enabled: false; "
                       "use MODE=tcp (--mode tcp), or set network.rdma.enabled: true if it has RDMA")


def _check_nodes(cluster: Cluster, nodes: int) -> None:
    if not 1 <= nodes <= MAX_NODES:
        raise ConfigError(f"--nodes: expected an integer 1-{MAX_NODES}, got {nodes}")
    pinned = len(set(cluster.gpu_nodes))
    if pinned and nodes > pinned:
        raise _problem(cluster, ("nodes", "gpu_nodes"),
                       f"{nodes} nodes requested but only {pinned} distinct nodes are pinned in nodes.gpu_nodes "
                       f"(one pod per node); use --nodes {pinned} or fewer, or pin more nodes")


def _storage(cluster: Cluster) -> StorageIntent:
    memory_limit = cluster.limits.get("memory")
    shm = cluster.storage.shm_size or (half_of(memory_limit) if memory_limit else DEFAULT_SHM)
    return StorageIntent(
        shared=cluster.storage.mode == "rwx",
        storage_class=cluster.storage.storage_class,
        workspace_size=cluster.storage.workspace_size,
        datasets_size=cluster.storage.datasets_size,
        shm_size=shm,
    )


def plan(cluster: Cluster, mode: str | None = None, nodes: int | None = None,
         image: str | None = None) -> JobPlan:
    """Decide everything about running ``cluster``; raises ConfigError for impossible requests."""
    if image is not None and (not image or any(char.isspace() or not char.isprintable() for char in image)):
        raise ConfigError(f"--image: expected a container image reference without spaces, got {image!r}")
    chosen_mode = mode or cluster.default_mode
    _check_mode(cluster, chosen_mode)
    node_count = cluster.gpus.default_nodes if nodes is None else nodes
    _check_nodes(cluster, node_count)
    nccl = nccl_env(cluster, chosen_mode)
    env = {
        "MASTER_PORT": str(RENDEZVOUS_PORT),
        "MLENV_NUM_NODES": str(node_count),
        "MLENV_PROCS_PER_NODE": str(cluster.gpus.procs_per_node),
        "MLENV_APP_NAME": cluster.app_name,
        "MLENV_NETWORK_MODE": chosen_mode,
        **({"MLENV_NCCL_TESTS": cluster.nccl_tests} if cluster.nccl_tests != "auto" else {}),
        **cluster.env,
        **nccl,
    }
    return JobPlan(
        cluster=cluster,
        name=cluster.info.name,
        app=cluster.app_name,
        mode=chosen_mode,
        nodes=node_count,
        procs_per_node=cluster.gpus.procs_per_node,
        gpus_per_node=cluster.gpus.per_node,
        image=image or cluster.image,
        env=env,
        nccl_env=nccl,
        storage=_storage(cluster),
        rdma_networks=cluster.rdma.networks if chosen_mode == "rdma" else (),
        rdma_resources=cluster.rdma.resources if chosen_mode == "rdma" else {},
        ipc_lock=cluster.security.ipc_lock,
        warnings=cluster.warnings,
    )

