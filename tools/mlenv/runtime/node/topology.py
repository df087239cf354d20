"""Who am I: node rank, node count, processes per node and master address.

Each supported world (a torchrun worker, Slurm, Run:ai/PyTorchJob/Kubeflow Trainer, an mlenv
StatefulSet pod) fills what it knows; the mlenv env contract (``MLENV_*``, ``MASTER_ADDR``,
``MASTER_PORT``) then overrides field by field, because the backend that set it knows best.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

from .nodelist import expand_nodelist

DEFAULT_APP_NAME = "ml-dev-env"
DEFAULT_MASTER_PORT = 29500


class TopologyError(ValueError):
    """The environment does not say, or contradicts itself about, where this node stands."""


@dataclass(frozen=True)
class Topology:
    """Where this node stands in the job."""

    node_rank: int
    num_nodes: int
    procs_per_node: int | None
    master_addr: str
    master_port: int
    source: str

    def to_dict(self) -> dict[str, object]:
        """The JSON shape of ``topology --json``."""
        return asdict(self)


@dataclass(frozen=True)
class _World:
    """What one kind of environment says; None means it does not know."""

    source: str
    node_rank: int | None = None
    num_nodes: int | None = None
    procs_per_node: int | None = None
    master_addr: str | None = None


MACHINE_VARIABLE = "MLENV_MACHINE"
"""The machine a pod runs on, as its scheduler names it: mlenv's Kubernetes pods get their node's name
(``spec.nodeName``, through the downward API)."""


def host_name(environ: Mapping[str, str]) -> str:
    """The machine this node runs on, as the scheduler names it (what records and exclusions say): a pod's
    Kubernetes node (``MLENV_MACHINE``); else :func:`own_name`."""
    return environ.get(MACHINE_VARIABLE, "").strip() or own_name(environ)


def own_name(environ: Mapping[str, str]) -> str:
    """This node's own name: the scheduler's in a Slurm step (``SLURMD_NODENAME``); else ``HOSTNAME`` as a container
    runtime or mlenv's local backend sets it for the pod or node, never inside a Slurm job (srun copies the batch
    shell's to every node); else the kernel's."""
    slurm = environ.get("SLURMD_NODENAME", "").strip()
    container = "" if "SLURM_JOB_ID" in environ else environ.get("HOSTNAME", "").strip()
    return slurm or container or socket.gethostname()


def detect_topology(environ: Mapping[str, str], hostname: str | None = None) -> Topology:
    """Work out this node's place in the job from ``environ`` and the pod name (``hostname``, else
    :func:`own_name`)."""
    env = _Env(environ)
    host = hostname if hostname is not None else own_name(environ)
    partial_contract = "MLENV_NODE_RANK" in environ or "MLENV_NUM_NODES" in environ
    fallback = _World("mlenv") if partial_contract else _World("single", node_rank=0, num_nodes=1)
    world = next((w for w in (detect(env, host) for detect in _WORLDS) if w is not None), fallback)
    node_rank = env.integer("MLENV_NODE_RANK", world.node_rank)
    num_nodes = env.integer("MLENV_NUM_NODES", world.num_nodes)
    procs = env.integer("MLENV_PROCS_PER_NODE", world.procs_per_node)
    master_addr = env.text("MASTER_ADDR") or world.master_addr or ("127.0.0.1" if num_nodes == 1 else None)
    port = env.integer("MASTER_PORT", env.integer("PET_MASTER_PORT"))
    complete_contract = "MLENV_NODE_RANK" in environ and "MLENV_NUM_NODES" in environ
    source = "mlenv" if complete_contract else world.source
    if node_rank is None or num_nodes is None:
        raise TopologyError(f"{source}: cannot tell the node rank and the node count; "
                            "set MLENV_NODE_RANK and MLENV_NUM_NODES")
    if master_addr is None:
        raise TopologyError(f"{source}: cannot tell the master address; set MASTER_ADDR")
    port = DEFAULT_MASTER_PORT if port is None else port
    topology = Topology(node_rank, num_nodes, procs, master_addr, port, source)
    _validate(topology)
    return topology


def _validate(t: Topology) -> None:
    if t.num_nodes < 1:
        raise TopologyError(f"number of nodes must be at least 1, got {t.num_nodes}")
    if not 0 <= t.node_rank < t.num_nodes:
        raise TopologyError(f"node rank {t.node_rank} is outside 0..{t.num_nodes - 1}")
    if t.procs_per_node is not None and t.procs_per_node < 1:
        raise TopologyError(f"processes per node must be at least 1, got {t.procs_per_node}")
    if not 0 < t.master_port < 65536:
        raise TopologyError(f"master port {t.master_port} is not a TCP port")


class _Env:
    """Typed, validated access to environment variables."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    def text(self, name: str) -> str | None:
        value = self._environ.get(name, "").strip()
        return value or None

    def integer(self, name: str, default: int | None = None) -> int | None:
        value = self.text(name)
        return default if value is None else _parse_int(name, value)

    def upper_bound(self, name: str) -> int | None:
        """Integer, or the upper bound of an elastic ``MIN:MAX`` range."""
        value = self.text(name)
        return None if value is None else _parse_int(name, value.rpartition(":")[2])

    def count(self, name: str) -> int | None:
        """Integer, or None for non-numeric values such as torchrun's ``gpu`` or ``auto``."""
        value = self.text(name)
        return int(value) if value is not None and value.isdigit() else None


def _parse_int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise TopologyError(f"{name}={text!r} is not an integer") from None


def _torchrun_worker(env: _Env, hostname: str) -> _World | None:
    """Inside a process that torchrun started: the agent's group rank is the node rank."""
    if env.text("GROUP_RANK") is None or env.text("GROUP_WORLD_SIZE") is None:
        return None
    return _World(
        "torchrun",
        node_rank=env.integer("GROUP_RANK"),
        num_nodes=env.integer("GROUP_WORLD_SIZE"),
        procs_per_node=env.integer("LOCAL_WORLD_SIZE"),
        master_addr=env.text("MASTER_ADDR"),
    )


def _slurm(env: _Env, hostname: str) -> _World | None:
    """A Slurm allocation: the first host of the node list is the master."""
    if env.text("SLURM_JOB_ID") is None or env.text("SLURM_NODEID") is None:
        return None
    nodelist = env.text("SLURM_JOB_NODELIST") or env.text("SLURM_NODELIST")
    try:
        hosts = expand_nodelist(nodelist) if nodelist else []
    except ValueError as err:
        raise TopologyError(str(err)) from None
    num_nodes = env.integer("SLURM_JOB_NUM_NODES", env.integer("SLURM_NNODES", len(hosts) or None))
    return _World(
        "slurm",
        node_rank=env.integer("SLURM_NODEID"),
        num_nodes=num_nodes,
        procs_per_node=env.count("SLURM_GPUS_ON_NODE"),
        master_addr=hosts[0] if hosts else None,
    )


def _pytorchjob(env: _Env, hostname: str) -> _World | None:
    """Run:ai, Kubeflow PyTorchJob and Trainer: torchrun's ``PET_*`` variables; ``RANK`` is the pod's rank."""
    if env.text("PET_NNODES") is None:
        return None
    return _World(
        "pytorchjob",
        node_rank=env.integer("PET_NODE_RANK", env.integer("RANK")),
        num_nodes=env.upper_bound("PET_NNODES"),
        procs_per_node=env.count("PET_NPROC_PER_NODE") or env.count("RUNAI_NUM_OF_GPUS"),
        master_addr=env.text("PET_MASTER_ADDR"),
    )


def _statefulset(env: _Env, hostname: str) -> _World | None:
    """An mlenv StatefulSet pod ``<app>-N``; the master is pod 0 behind the headless Service."""
    app = env.text("MLENV_APP_NAME") or DEFAULT_APP_NAME
    match = re.fullmatch(re.escape(app) + r"-(\d+)", hostname.split(".")[0])
    if match is None:
        return None
    return _World("statefulset", node_rank=int(match.group(1)), master_addr=f"{app}-0.{app}-headless")


_WORLDS: tuple[Callable[[_Env, str], _World | None], ...] = (
    _torchrun_worker,
    _slurm,
    _pytorchjob,
    _statefulset,
)
