"""Schema + semantic validation of a cluster file, producing a frozen ``Cluster``.

What the backend registry says about the file's backend decides the backend-dependent rules: whether
``cluster.namespace`` and a storage class are needed, whether ``gpus.per_node: 0`` is allowed, which common
sections it ignores (a warning), and which settings parser reads its own section.
"""

from __future__ import annotations

from decimal import Decimal

from mlenv.config.load import LoadedFile
from mlenv.config.model import (
    DEFAULT_APP,
    DEFAULT_GRACE_SECONDS,
    DEFAULT_IMAGE,
    DEFAULT_NODES,
    Bind,
    Cluster,
    ClusterInfo,
    Container,
    Gpus,
    Rdma,
    Scheduling,
    Security,
    Storage,
    Tcp,
    TopologyRequest,
)
from mlenv.config.quantity import QuantityError, half_of, parse_bandwidth, parse_quantity, parse_seconds
from mlenv.config.reader import BackendTable, ClusterReader, env_text
from mlenv.config.schema import schema_problems
from mlenv.errors import ConfigError


def _amount(quantity: str) -> Decimal | None:
    try:
        return parse_quantity(quantity)
    except QuantityError:
        return None  # reported where it was read


def _info(reader: ClusterReader) -> ClusterInfo:
    return ClusterInfo(name=reader.get("cluster", "name"), api=reader.get("cluster", "api"),
                       namespace=reader.get("cluster", "namespace"),
                       description=reader.get("cluster", "description"))


def _gpu_nodes(reader: ClusterReader) -> tuple[str, ...]:
    if "nodes" not in reader.backend.uses:  # warned as ignored: it pins nothing for this backend
        return ()
    nodes = tuple(reader.get("nodes", "gpu_nodes", default=[]))
    first: dict[str, int] = {}
    for index, node in enumerate(nodes):
        if node in first:
            reader.problem(("nodes", "gpu_nodes", index), f"{node} is listed twice (first as gpu_nodes[{first[node]}]);"
                                                          f" one pod runs per node, so list each node once")
        first.setdefault(node, index)
    return nodes


def _storage(reader: ClusterReader) -> Storage:
    class_rwx = reader.get("storage", "class_rwx")
    mode = reader.get("storage", "mode", default="rwx" if class_rwx else "volumeClaimTemplates")
    storage = Storage(
        mode=mode,
        class_rwx=class_rwx,
        class_rwo=reader.get("storage", "class_rwo"),
        workspace_size=reader.quantity("storage", "workspace_size", default="100Gi", positive=True) or "100Gi",
        datasets_size=reader.quantity("storage", "datasets_size", default="500Gi", positive=True) or "500Gi",
        shm_size=reader.quantity("storage", "shm_size", positive=True),
    )
    if reader.backend.creates_volumes and not storage.storage_class:
        needed = "class_rwx" if mode == "rwx" else "class_rwo"
        reader.problem(("storage", "mode"), f"storage mode {mode} needs storage.{needed}; "
                                            f"set it to a storage class from 'oc get storageclass'")
    return storage


def _rdma(reader: ClusterReader) -> Rdma:
    gid = reader.get("network", "rdma", "gid_index")
    gid_index: int | str | None = gid if gid in (None, "auto") else reader.integer("network", "rdma", "gid_index")
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
        resources={name: reader.integer("network", "rdma", "resources", name, minimum=1) or 0 for name in resources},
    )


def _tcp(reader: ClusterReader) -> Tcp:
    p2p = reader.get("network", "tcp", "p2p_level")
    return Tcp(interface_exclude=reader.get("network", "tcp", "interface_exclude"),
               p2p_level=None if p2p is None else str(p2p),
               interfaces=dict(reader.get("network", "tcp", "interfaces", default={})))


MAX_RESTARTS = 100
"""The most restarts a run may ask for: mlenv never retries forever."""


def _busbw_gbytes(reader: ClusterReader) -> float | None:
    """``network.expected_busbw`` in GB/s; the unit is required, because bytes and bits differ eightfold."""
    value = reader.get("network", "expected_busbw")
    if value is None:
        return None
    try:
        return parse_bandwidth(value)
    except QuantityError as exc:
        reader.problem(("network", "expected_busbw"), str(exc))
        return None


def _nccl_tests(value: str | bool | None) -> str:
    """``network.nccl_tests``: ``auto`` when left out; YAML reads a bare ``off`` as false."""
    return "off" if value is False else str(value or "auto")


def _security(reader: ClusterReader) -> Security:
    security = Security(
        service_account=reader.get("security", "service_account", default="ml-dev-sa"),
        ipc_lock=bool(reader.get("security", "ipc_lock", default=False)),
        network_policy=bool(reader.get("security", "network_policy", default=True)),
        run_as_user=reader.integer("security", "run_as_user", maximum=2**31 - 1),
    )
    return security


def _resources(reader: ClusterReader, storage: Storage) -> tuple[dict[str, str], dict[str, str]]:
    requests = {k: v for k in ("memory", "cpu") if (v := reader.quantity("resources", "requests", k)) is not None}
    limits = {k: v for k in ("memory", "cpu") if (v := reader.quantity("resources", "limits", k)) is not None}
    for key in set(requests) & set(limits):
        low, high = _amount(requests[key]), _amount(limits[key])
        if low is not None and high is not None and low > high:
            reader.problem(("resources", "requests", key),
                           f"request {requests[key]} is larger than the limit {limits[key]}; "
                           f"lower the request or raise resources.limits.{key}")
    memory = limits.get("memory")
    if storage.shm_size is None and memory is not None and _amount(memory) is not None and half_of(memory) == "0":
        reader.problem(("resources", "limits", "memory"),
                       f"{memory} is too small: /dev/shm gets half the memory limit, which would be 0 bytes; raise "
                       f"resources.limits.memory or set storage.shm_size")
    return requests, limits


def _machine_count(reader: ClusterReader) -> int:
    """How many machines the backend's own list names (BackendInfo.machines), 0 without one."""
    path = reader.backend.machines
    listed = reader.get(*path) if path else None
    return len(listed) if isinstance(listed, list) else 0


def _gpus(reader: ClusterReader, gpu_nodes: tuple[str, ...]) -> Gpus:
    least = 0 if reader.backend.cpu_nodes else 1
    per_node = reader.integer("gpus", "per_node", default=least, minimum=least, maximum=64) or 0
    default_nodes = reader.integer("gpus", "default_nodes", default=_machine_count(reader) or DEFAULT_NODES,
                                   minimum=1, maximum=1024) or 1
    procs = reader.integer("gpus", "procs_per_node", default=per_node or 2, minimum=1, maximum=64) or 1
    pinned = len(set(gpu_nodes))
    if pinned and default_nodes > pinned:
        reader.problem(("gpus", "default_nodes"),
                       f"{default_nodes} nodes requested but only {pinned} are pinned in nodes.gpu_nodes; "
                       f"lower gpus.default_nodes or pin more nodes")
    return Gpus(per_node=per_node, type=reader.get("gpus", "type"), default_nodes=default_nodes,
                procs_per_node=procs)


def _scheduling(reader: ClusterReader) -> Scheduling:
    topology = reader.get("scheduling", "topology")
    return Scheduling(tolerations=tuple(reader.get("scheduling", "tolerations", default=[])),
                      node_selector=dict(reader.get("scheduling", "nodeSelector", default={})),
                      grace_period=parse_seconds(reader.get("scheduling", "grace_period",
                                                            default=DEFAULT_GRACE_SECONDS)),
                      admission=reader.get("scheduling", "admission", default="none"),
                      queue=reader.get("scheduling", "queue"),
                      priority_class=reader.get("scheduling", "priority_class"),
                      topology=None if topology is None else TopologyRequest(*next(iter(topology.items()))),
                      move_faulty_pods=bool(reader.get("scheduling", "move_faulty_pods", default=False)))


def _seconds_or_none(written: int | str | None) -> int | None:
    """A duration the schema accepted, in seconds; None when not written."""
    return None if written is None else parse_seconds(written)


def _container(reader: ClusterReader) -> Container | None:
    if reader.get("container") is None:
        return None
    binds = tuple(Bind(host=bind["host"], container=bind["container"], options=bind.get("options") or "rw")
                  for bind in reader.get("container", "binds", default=[]))
    return Container(runtime=reader.get("container", "runtime", default="apptainer"),
                     image=reader.get("container", "image"),
                     nv=bool(reader.get("container", "nv", default=True)), binds=binds,
                     env=reader.env("container", "env"))


def _warn_ignored_sections(reader: ClusterReader, table: BackendTable) -> None:
    """Sections the file's backend does not read are a warning, never silently dropped."""
    backend = reader.backend
    owners = {info.section: info.name for info in table.backends.values() if info.section}
    for key in reader.data:
        if key in table.selective and key not in backend.uses:
            reader.warn(f"{key}: is ignored: backend {backend.name} does not use it")
        elif key in owners and owners[key] != backend.name:
            reader.warn(f"{key}: is ignored: backend is {backend.name}")


def build_cluster(loaded: LoadedFile, table: BackendTable) -> Cluster:
    """Turn a schema-valid file into a ``Cluster``, raising ConfigError with every semantic problem; ``table``
    is the backend registry's rules, handed down by ``mlenv.core.clusters``."""
    reader = ClusterReader(loaded, table.backends[loaded.data.get("backend") or table.default])
    _warn_ignored_sections(reader, table)
    reader.backend.check_common(reader)  # the backend's own rules on the common sections (Kubernetes')
    gpu_nodes = _gpu_nodes(reader)
    storage = _storage(reader)
    requests, limits = _resources(reader, storage)
    rdma = _rdma(reader)
    if rdma.enabled and not rdma.devices and rdma.gid_index is None:
        reader.warn("network.rdma has no devices and no gid_index: the in-pod runtime will detect them")
    cluster = Cluster(
        source=loaded.path,
        info=_info(reader),
        backend=reader.backend.name,
        app_name=str(reader.get("app", "name", default=DEFAULT_APP)),
        image=reader.get("image", default=DEFAULT_IMAGE),
        gpu_nodes=gpu_nodes,
        storage=storage,
        rdma=rdma,
        tcp=_tcp(reader),
        security=_security(reader),
        gpus=_gpus(reader, gpu_nodes),
        requests=requests,
        limits=limits,
        nccl_debug=reader.get("nccl", "debug") or None,
        nccl_env={k: env_text(v) for k, v in reader.get("nccl", "env", default={}).items()},
        scheduling=_scheduling(reader),
        env=reader.env("env"),
        container=_container(reader),
        expected_busbw_gbytes=_busbw_gbytes(reader),
        expect_transport=reader.get("network", "expect_transport"),
        nccl_tests=_nccl_tests(reader.get("network", "nccl_tests")),
        max_restarts=reader.integer("launch", "max_restarts", default=0, minimum=0, maximum=MAX_RESTARTS) or 0,
        settings=reader.backend.parse_settings(reader),
        notes=reader.get("notes"),
        hang_timeout=reader.get("launch", "hang_timeout"),
        node_silence=reader.get("launch", "node_silence"),
        drill_targets=dict(reader.get("drill", "targets", default={})),
        idle_seconds=_seconds_or_none(reader.get("launch", "idle_minutes")),
        idle_util=reader.get("launch", "idle_util"),
        warnings=tuple(reader.warnings),
        positions=dict(loaded.positions),
    )
    if reader.problems:
        raise ConfigError(sorted(reader.problems, key=lambda p: (p.line or 0, p.column or 0)))
    return cluster


def validate(loaded: LoadedFile, table: BackendTable) -> Cluster:
    """Schema-check then semantically check ``loaded`` against the registry's ``table``; all problems are
    reported at once."""
    problems = schema_problems(loaded, table)
    if problems:
        raise ConfigError(problems)
    return build_cluster(loaded, table)
