"""Schema + semantic validation of a cluster file, producing a frozen ``Cluster``."""

from __future__ import annotations

from typing import Any

from mlenv.config.load import JsonPath, LoadedFile, format_path
from mlenv.config.model import (
    DEFAULT_APP,
    DEFAULT_IMAGE,
    DEFAULT_KUBERNETES_VERSION,
    Cluster,
    ClusterInfo,
    Gpus,
    LocalSettings,
    Rdma,
    Scheduling,
    Security,
    Storage,
    Tcp,
)
from mlenv.config.quantity import parse_quantity
from mlenv.config.schema import schema_problems, show_value
from mlenv.errors import ConfigError, Problem

DEFAULT_LOCAL_SUBNET = "10.77.0.0/24"


class _Reader:
    """Reads fields from the loaded data by path, collecting semantic problems as it goes."""

    def __init__(self, loaded: LoadedFile) -> None:
        self.loaded = loaded
        self.data: dict[str, Any] = loaded.data
        self.problems: list[Problem] = []

    def get(self, *path: str, default: Any = None) -> Any:
        node: Any = self.data
        for key in path:
            if not isinstance(node, dict) or node.get(key) is None:
                return default
            node = node[key]
        return node

    def problem(self, path: JsonPath, message: str) -> None:
        line, col = self.loaded.position(path)
        self.problems.append(Problem(self.loaded.path, line, col, format_path(path), message))

    def integer(self, *path: str, default: int | None = None, minimum: int = 0,
                maximum: int | None = None) -> int | None:
        """An integer that the file may write as a quoted string ("3"), checked against its range."""
        value = self.get(*path)
        if value is None:
            return default
        number = int(value)
        if number < minimum or (maximum is not None and number > maximum):
            expected = f"{minimum}-{maximum}" if maximum is not None else f">= {minimum}"
            self.problem(path, f"expected an integer {expected}, got {show_value(value)}")
        return number

    def names(self, *path: str) -> tuple[str, ...]:
        """A comma-separated string or a YAML list, as a tuple of names."""
        value = self.get(*path)
        if value is None:
            return ()
        items = value.split(",") if isinstance(value, str) else value
        return tuple(str(item).strip() for item in items if str(item).strip())

    def quantity(self, *path: str, default: str | None = None) -> str | None:
        value = self.get(*path)
        if value is None:
            return default
        if parse_quantity(value) is None:
            self.problem(path, f"expected a Kubernetes quantity such as 128Gi, 500Mi, 32 or 500m, "
                               f"got {show_value(value)}")
        return str(value)


def _storage(reader: _Reader) -> Storage:
    class_rwx = reader.get("storage", "class_rwx")
    mode = reader.get("storage", "mode", default="rwx" if class_rwx else "volumeClaimTemplates")
    storage = Storage(
        mode=mode,
        class_rwx=class_rwx,
        class_rwo=reader.get("storage", "class_rwo"),
        workspace_size=reader.quantity("storage", "workspace_size", default="100Gi") or "100Gi",
        datasets_size=reader.quantity("storage", "datasets_size", default="500Gi") or "500Gi",
        shm_size=reader.quantity("storage", "shm_size"),
    )
    if reader.get("backend") != "local" and not storage.storage_class:
        needed = "class_rwx" if mode == "rwx" else "class_rwo"
        reader.problem(("storage", "mode"), f"storage mode {mode} needs storage.{needed}; "
                                            f"set it to a storage class from 'oc get storageclass'")
    return storage


def _rdma(reader: _Reader) -> Rdma:
    gid = reader.get("network", "rdma", "gid_index")
    gid_index: int | str | None = gid if gid in (None, "auto") else int(gid)
    if isinstance(gid_index, int) and gid_index > 255:
        reader.problem(("network", "rdma", "gid_index"), f'expected an integer 0-255 or "auto", got {gid}')
    gdr = reader.get("network", "rdma", "gdr_level")
    resources = reader.get("network", "rdma", "resources", default={})
    return Rdma(
        enabled=bool(reader.get("network", "rdma", "enabled", default=False)),
        devices=reader.names("network", "rdma", "devices"),
        interfaces=reader.names("network", "rdma", "interfaces"),
        gid_index=gid_index,
        gdr_level=None if gdr is None else str(gdr),
        cross_nic=reader.integer("network", "rdma", "cross_nic", maximum=2),
        ib_timeout=reader.integer("network", "rdma", "ib_timeout", minimum=1, maximum=31),
        min_nchannels=reader.integer("network", "rdma", "min_nchannels", minimum=1, maximum=64),
        networks=tuple(reader.get("network", "rdma", "networks", default=[])),
        resources={name: int(count) for name, count in resources.items()},
    )


def _check_resources(reader: _Reader) -> tuple[dict[str, str], dict[str, str]]:
    requests = {k: str(v) for k in ("memory", "cpu")
                if (v := reader.quantity("resources", "requests", k)) is not None}
    limits = {k: str(v) for k in ("memory", "cpu")
              if (v := reader.quantity("resources", "limits", k)) is not None}
    for key in set(requests) & set(limits):
        low, high = parse_quantity(requests[key]), parse_quantity(limits[key])
        if low is not None and high is not None and low > high:
            reader.problem(("resources", "requests", key),
                           f"request {requests[key]} is larger than the limit {limits[key]}; "
                           f"lower the request or raise resources.limits.{key}")
    return requests, limits


def _gpus(reader: _Reader, backend: str, gpu_nodes: tuple[str, ...]) -> Gpus:
    per_node = reader.integer("gpus", "per_node", default=0 if backend == "local" else 1,
                              minimum=0 if backend == "local" else 1, maximum=64) or 0
    default_nodes = reader.integer("gpus", "default_nodes", default=2, minimum=1, maximum=1024) or 1
    procs = reader.integer("gpus", "procs_per_node", default=per_node or 2, minimum=1, maximum=64) or 1
    if gpu_nodes and default_nodes > len(gpu_nodes):
        reader.problem(("gpus", "default_nodes"),
                       f"{default_nodes} nodes requested but only {len(gpu_nodes)} are pinned in nodes.gpu_nodes; "
                       f"lower gpus.default_nodes or pin more nodes")
    return Gpus(per_node=per_node, type=reader.get("gpus", "type"), default_nodes=default_nodes,
                procs_per_node=procs)


def _warnings(cluster_rdma: Rdma, security: Security, backend: str) -> tuple[str, ...]:
    warnings = []
    if security.requires_privileged_scc and backend == "openshift":
        warnings.append("security.requires_privileged_scc is ignored: mlenv never uses the privileged SCC; "
                        "with security.ipc_lock: true it renders a minimal SCC that allows only IPC_LOCK "
                        "(mlenv render --admin)")
    if cluster_rdma.enabled and not cluster_rdma.devices and cluster_rdma.gid_index is None:
        warnings.append("network.rdma has no devices and no gid_index: the in-pod runtime will detect them")
    return tuple(warnings)


def build_cluster(loaded: LoadedFile) -> Cluster:
    """Turn a schema-valid file into a ``Cluster``, raising ConfigError with every semantic problem."""
    reader = _Reader(loaded)
    backend = reader.get("backend", default="openshift")
    gpu_nodes = tuple(reader.get("nodes", "gpu_nodes", default=[]))
    requests, limits = _check_resources(reader)
    security = Security(
        service_account=reader.get("security", "service_account", default="ml-dev-sa"),
        requires_privileged_scc=bool(reader.get("security", "requires_privileged_scc", default=False)),
        ipc_lock=bool(reader.get("security", "ipc_lock", default=False)),
    )
    rdma = _rdma(reader)
    cluster = Cluster(
        source=loaded.path,
        info=ClusterInfo(
            name=reader.get("cluster", "name"),
            api=reader.get("cluster", "api"),
            namespace=reader.get("cluster", "namespace"),
            description=reader.get("cluster", "description"),
        ),
        backend=backend,
        kubernetes_version=str(reader.get("kubernetes_version", default=DEFAULT_KUBERNETES_VERSION)).lstrip("v"),
        app_name=reader.get("app", "name", default=DEFAULT_APP),
        image=reader.get("image", default=DEFAULT_IMAGE),
        gpu_nodes=gpu_nodes,
        storage=_storage(reader),
        rdma=rdma,
        tcp=Tcp(
            interface_exclude=reader.get("network", "tcp", "interface_exclude"),
            p2p_level=None if (p2p := reader.get("network", "tcp", "p2p_level")) is None else str(p2p),
        ),
        security=security,
        gpus=_gpus(reader, backend, gpu_nodes),
        requests=requests,
        limits=limits,
        nccl_debug=reader.get("nccl", "debug") or None,
        nccl_env={k: _env_text(v) for k, v in reader.get("nccl", "env", default={}).items()},
        scheduling=Scheduling(
            tolerations=tuple(reader.get("scheduling", "tolerations", default=[])),
            node_selector=dict(reader.get("scheduling", "nodeSelector", default={})),
        ),
        local=LocalSettings(
            isolation=reader.get("local", "isolation", default="auto"),
            interfaces=tuple(reader.get("local", "interfaces", default=[])),
            subnet=reader.get("local", "subnet", default=DEFAULT_LOCAL_SUBNET),
            root=reader.get("local", "root"),
        ),
        notes=reader.get("notes"),
        warnings=_warnings(rdma, security, backend),
        positions=dict(loaded.positions),
    )
    if reader.problems:
        raise ConfigError(sorted(reader.problems, key=lambda p: (p.line or 0, p.column or 0)))
    return cluster


def _env_text(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def validate(loaded: LoadedFile) -> Cluster:
    """Schema-check then semantically check ``loaded``; all problems are reported at once."""
    problems = schema_problems(loaded)
    if problems:
        raise ConfigError(problems)
    return build_cluster(loaded)
