"""The local backend: "pods" on this machine. Each pod is a network namespace with its own address, NIC name
and /etc/hosts on a private bridge (``namespaces``, root with iproute2), or a plain directory whose
processes share loopback (``processes``). Each pod has a directory whose ``workspace/`` is its /workspace."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import shutil
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from mlenv.backends.base import CopyTarget, Pod, PodStatus
from mlenv.backends.local import net as localnet
from mlenv.backends.local import proc as localproc
from mlenv.config.discover import project_root
from mlenv.errors import OperationError, UsageError
from mlenv.plan import Deployment
from mlenv.ui import info

NAMESPACES, PROCESSES = "namespaces", "processes"
DEFAULT_NIC = "eth0"
POD_FILE = "pod.json"


@dataclass(frozen=True)
class LocalPod:
    """What deploy decided about one pod, recorded in its directory as pod.json."""

    ordinal: int
    name: str
    mode: str
    ip: str
    nic: str
    netns: str | None
    prefixlen: int
    master_port: int
    """Pod 0's rendezvous port: the deployment's in namespaces; in processes mode, where every pod shares
    the host's loopback, a free port chosen once so that two local clusters never meet."""


def base_dir(deployment: Deployment) -> Path:
    """Where the pod directories live: ``local.root``, else <project>/.mlenv/local/<namespace>."""
    root = deployment.cluster.local.root
    if root:
        return (project_root() / root).resolve()
    return project_root() / ".mlenv" / "local" / deployment.namespace


def pod_dir(deployment: Deployment, ordinal: int) -> Path:
    """The directory of pod ``ordinal``."""
    return base_dir(deployment) / f"{deployment.app}-{ordinal}"


def workspace_dir(deployment: Deployment, ordinal: int) -> Path:
    """The pod's /workspace: its own, or one shared by every pod when the storage is RWX."""
    if deployment.storage.shared:
        return base_dir(deployment) / "shared-workspace"
    return pod_dir(deployment, ordinal) / "workspace"


def netns_prefix(deployment: Deployment) -> str:
    """``mlenv-<app>-<digest of the pods' directory>-``: namespaces are machine-wide, so two checkouts (or
    cluster namespaces) deploying the same app never share, reconfigure or delete each other's."""
    digest = hashlib.sha256(str(base_dir(deployment).resolve()).encode()).hexdigest()[:8]
    return f"mlenv-{deployment.app}-{digest}-"


def netns_name(deployment: Deployment, ordinal: int) -> str:
    """Network namespace of pod ``ordinal``."""
    return f"{netns_prefix(deployment)}{ordinal}"


def bridge_netns(deployment: Deployment) -> str:
    """The namespace that holds the deployment's bridge."""
    return f"{netns_prefix(deployment)}br"


def _isolation(deployment: Deployment) -> str:
    wanted = deployment.cluster.local.isolation
    if wanted == PROCESSES or (wanted == "auto" and not localnet.available()):
        return PROCESSES
    if not localnet.available():
        raise OperationError("local.isolation is namespaces but network namespaces need root and iproute2 "
                             "(ip); run as root (sudo), install iproute2, or set local.isolation: processes")
    return NAMESPACES


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _master_port(deployment: Deployment, mode: str) -> int:
    """The deployment's port with namespaces; with processes the one chosen before, else a free one."""
    if mode == NAMESPACES:
        return deployment.master_port
    recorded = _read_pod(deployment, 0)
    return recorded.master_port if recorded and recorded.mode == PROCESSES else _free_port()


def _plan_pods(deployment: Deployment, mode: str) -> list[LocalPod]:
    subnet = ipaddress.ip_network(deployment.cluster.local.subnet, strict=False)
    hosts = list(subnet.hosts())
    if mode == NAMESPACES and deployment.nodes + 1 > len(hosts):
        raise UsageError(f"local.subnet {subnet} has room for {len(hosts) - 1} pods, not {deployment.nodes}")
    interfaces = deployment.cluster.local.interfaces
    port = _master_port(deployment, mode)
    pods = []
    for i in range(deployment.nodes):
        if mode == NAMESPACES:
            nic = interfaces[i] if i < len(interfaces) else DEFAULT_NIC
            pods.append(LocalPod(i, f"{deployment.app}-{i}", mode, str(hosts[i + 1]), nic,
                                 netns_name(deployment, i), subnet.prefixlen, port))
        else:
            pods.append(LocalPod(i, f"{deployment.app}-{i}", mode, "127.0.0.1", "lo", None, 8, port))
    return pods


def _dns_names(deployment: Deployment, ordinal: int) -> list[str]:
    full = deployment.pod_dns(ordinal)
    parts = full.split(".")
    return [full, ".".join(parts[:3]), ".".join(parts[:2]), parts[0]]


def _read_pod(deployment: Deployment, ordinal: int) -> LocalPod | None:
    try:
        return LocalPod(**json.loads((pod_dir(deployment, ordinal) / POD_FILE).read_text()))
    except (FileNotFoundError, ValueError, TypeError):
        return None


def _existing_ordinals(deployment: Deployment) -> set[int]:
    """Ordinals that have a pod directory or a namespace, whatever the node count planned now."""
    found = set()
    pattern = re.compile(re.escape(deployment.app) + r"-(\d+)")
    base = base_dir(deployment)
    if base.is_dir():
        found |= {int(m.group(1)) for p in base.iterdir() if (m := pattern.fullmatch(p.name))}
    if localnet.available():
        prefix = re.compile(re.escape(netns_prefix(deployment)) + r"(\d+)")
        found |= {int(m.group(1)) for name in localnet.namespaces() if (m := prefix.fullmatch(name))}
    return found


def _venv_bin() -> str:
    return str(Path(sys.executable).parent)


class LocalBackend:
    """Pods on this machine: network namespaces (root) or plain directories and processes."""

    name = "local"

    def planned_pods(self, deployment: Deployment) -> list[LocalPod]:
        """What deploy would create: each pod's isolation, address, NIC and namespace (changes nothing)."""
        return _plan_pods(deployment, _isolation(deployment))

    def deploy(self, deployment: Deployment, timeout: int, on_applied: Callable[[], None] | None = None) -> None:
        """Create or converge the pods; leftovers of an interrupted run are reused or made again."""
        mode = _isolation(deployment)
        pods = _plan_pods(deployment, mode)
        if on_applied is not None:
            on_applied()
        extra = sorted(o for o in _existing_ordinals(deployment) if o >= deployment.nodes)
        if extra:  # scaled down: like a StatefulSet, the pods go and their data stays
            self._remove(deployment, extra, delete_data=False)
        entries = [(p.ip, _dns_names(deployment, p.ordinal)) for p in pods]
        if mode == NAMESPACES:
            localnet.ensure_bridge(bridge_netns(deployment))
        for pod in pods:
            directory = pod_dir(deployment, pod.ordinal)
            if mode == NAMESPACES and pod.netns:
                localnet.ensure_pod(bridge_netns(deployment), f"p{pod.ordinal}", pod.netns, pod.nic,
                                    f"{pod.ip}/{pod.prefixlen}")
                localnet.write_etc(pod.netns, entries)
            directory.mkdir(parents=True, exist_ok=True)
            workspace_dir(deployment, pod.ordinal).mkdir(parents=True, exist_ok=True)
            (directory / POD_FILE).write_text(json.dumps(asdict(pod), indent=2) + "\n")
            where = f"netns {pod.netns}, {pod.nic} {pod.ip}/{pod.prefixlen}" if pod.netns else "loopback"
            message = f"pod {pod.name} ready ({mode}: {where})"
            with (directory / "pod.log").open("a") as log:
                log.write(f"{message}, workspace {workspace_dir(deployment, pod.ordinal)}\n")
            info(message)

    def status(self, deployment: Deployment) -> list[PodStatus]:
        """Every pod that exists or is planned, with its address, NIC, isolation mode and running jobs."""
        existing = _existing_ordinals(deployment)
        if not existing:
            return []
        rows = []
        for ordinal in sorted(set(range(deployment.nodes)) | existing):
            pod = _read_pod(deployment, ordinal)
            name = f"{deployment.app}-{ordinal}"
            if pod is None:
                kept = workspace_dir(deployment, ordinal).is_dir()
                rows.append(PodStatus(name, ordinal, None, "Missing", False, 0, 0, None,
                                      detail="no pod; its workspace is kept" if kept else "not deployed"))
                continue
            ready = pod.netns is None or localnet.configured(pod.netns, pod.nic, f"{pod.ip}/{pod.prefixlen}")
            jobs = len(localproc.running(pod_dir(deployment, ordinal)))
            extra = {"mode": pod.mode, "nic": pod.nic, "jobs": str(jobs)}
            rows.append(PodStatus(name, ordinal, pod.netns or socket.gethostname(),
                                  "Running" if ready else "Broken", ready, 0, 0, pod.ip,
                                  detail=None if ready else "network broken: mlenv deploy repairs it",
                                  extra=extra))
        return rows

    def pods(self, deployment: Deployment) -> list[Pod]:
        """The deployed pods; OperationError when the local cluster is not deployed."""
        pods = []
        for ordinal in range(deployment.nodes):
            pod = _read_pod(deployment, ordinal)
            if pod is None:
                raise OperationError(f"pod {deployment.app}-{ordinal} of the local cluster is not deployed: "
                                     "run mlenv deploy (make deploy-cluster CLUSTER=local) first")
            pods.append(Pod(ordinal, pod.name, str(workspace_dir(deployment, ordinal)), pod.ip, ready=True))
        return pods

    def exec_argv(self, deployment: Deployment, pod: Pod, argv: Sequence[str], *,
                  env: Mapping[str, str] | None = None, interactive: bool = False,
                  stop_on_stdin_eof: bool = False) -> list[str]:
        """``env -C <workspace> K=V... sh -c <record PID> argv``, inside the pod's namespace when it has one.

        Local processes are stopped through their recorded process groups, so ``stop_on_stdin_eof`` needs nothing.
        """
        local = _read_pod(deployment, pod.ordinal)
        if local is None:
            raise OperationError(f"pod {pod.name} is not deployed: run mlenv deploy first")
        directory = pod_dir(deployment, pod.ordinal)
        variables = {
            **deployment.env,
            "MLENV_NODE_RANK": str(pod.ordinal),
            "PYTHONPATH": f"{pod.workspace}/.mlenv",
            "PATH": os.pathsep.join([_venv_bin(), os.environ.get("PATH", os.defpath)]),
            "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR",
                                                   str(project_root() / ".cache" / "torch_extensions")),
            localproc.MARKER: str(directory),
        }
        if local.netns is None:
            variables.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(local.master_port), NCCL_SOCKET_IFNAME="lo",
                             GLOO_SOCKET_IFNAME="lo")
        variables.update(env or {})
        command = ["env", "-C", pod.workspace, *(f"{k}={v}" for k, v in variables.items()),
                   *localproc.recorded(directory, argv)]
        return [*localnet.exec_prefix(local.netns), *command] if local.netns else command

    def copy_target(self, deployment: Deployment, pod: Pod) -> CopyTarget:
        """The pod's workspace is a directory on this machine: plain local rsync."""
        return CopyTarget(destination=pod.workspace.rstrip("/") + "/")

    def logs_argv(self, deployment: Deployment, pod: Pod, follow: bool) -> list[str]:
        """The pod's own log: when it came up and which commands ran in it."""
        return ["tail", "-n", "+1", *(["-F"] if follow else []), str(pod_dir(deployment, pod.ordinal) / "pod.log")]

    def data_volumes(self, deployment: Deployment) -> list[str]:
        """The pod directories (with their workspaces) that ``clean --delete-data`` deletes."""
        paths = [pod_dir(deployment, o) for o in sorted(_existing_ordinals(deployment))]
        if deployment.storage.shared:
            paths.append(workspace_dir(deployment, 0))
        return [str(p) for p in paths if p.exists()]

    def clean(self, deployment: Deployment, delete_data: bool) -> None:
        """Stop every process started in the pods, delete namespaces, bridge and /etc/netns entries; the
        workspaces stay unless ``delete_data``. Cleaning twice is fine."""
        self._remove(deployment, sorted(_existing_ordinals(deployment)), delete_data)
        if localnet.available():
            localnet.delete_namespace(bridge_netns(deployment))
        base = base_dir(deployment)
        if delete_data:
            if deployment.storage.shared:
                shutil.rmtree(workspace_dir(deployment, 0), ignore_errors=True)
            if base.is_dir() and not any(base.iterdir()):
                base.rmdir()

    def _remove(self, deployment: Deployment, ordinals: Sequence[int], delete_data: bool) -> None:
        directories = [pod_dir(deployment, o) for o in ordinals]
        stopped = localproc.stop(directories)
        if stopped:
            info(f"stopped {stopped} process(es) in {deployment.app}")
        for ordinal, directory in zip(ordinals, directories, strict=True):
            if localnet.available():
                localnet.delete_namespace(netns_name(deployment, ordinal))
            if delete_data:
                shutil.rmtree(directory, ignore_errors=True)
            elif directory.is_dir():
                for entry in directory.iterdir():
                    if entry.is_dir() and entry.name != "workspace":
                        shutil.rmtree(entry)
                    elif not entry.is_dir():
                        entry.unlink()
            info(f"pod {deployment.app}-{ordinal} removed" + (" with its data" if delete_data else ""))
