"""The local backend: "pods" on this machine. Each pod is a network namespace with its own address, NIC name
and /etc/hosts on a private bridge (``namespaces``, root with iproute2), or a plain directory whose
processes share loopback (``processes``). Each pod has a directory whose ``workspace/`` is its /workspace.

What this machine can do (root, iproute2, setpriv) and where the project lives are read once, when the backend is
made; ``prepare`` is then pure. Deploy marks every directory it makes as its own; clean deletes only marked ones.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import shutil
import sys
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlenv.backends.kubeapi.naming import pod_dns
from mlenv.backends.local import net as localnet
from mlenv.backends.local import proc as localproc
from mlenv.backends.local.settings import LocalSettings
from mlenv.config.discover import project_root
from mlenv.core.capabilities import (
    Check,
    Checks,
    CopyTarget,
    Deploy,
    Handle,
    Jobs,
    Node,
    NodeAccess,
    NodeStatus,
    Recorder,
    Request,
)
from mlenv.core.fanout import FanoutJobs
from mlenv.core.remote import RUNTIME_DIR, read_secrets
from mlenv.errors import OperationError, UsageError, shown
from mlenv.plan import JobPlan
from mlenv.render.yamlsafe import to_yaml
from mlenv.ui import info

NAMESPACES, PROCESSES = "namespaces", "processes"
DEFAULT_NIC = "eth0"
POD_FILE = "pod.json"
"""A deployed pod's record; removed by clean (the directory and its workspace may stay)."""
OWNER = ".mlenv-owner"
"""In every pod directory mlenv made: the deployment's digest. Only such directories are ever deleted."""
SHARED_WORKSPACE = "shared-workspace"
OWNER_FILE = f"{RUNTIME_DIR}/owner"
"""Marks a shared workspace as made by mlenv (inside .mlenv/, which sync never deletes)."""
PORT_RANGE = (20000, 40000)


@dataclass(frozen=True)
class LocalPod:
    """What deploy decided about one pod, recorded in its directory as pod.json (which also marks it as ours)."""

    ordinal: int
    name: str
    mode: str
    ip: str
    nic: str
    netns: str | None
    prefixlen: int
    master_port: int


@dataclass(frozen=True)
class Layout:
    """Where a local deployment lives, from its handle."""

    base: Path
    app: str
    owner: str
    shared: bool
    pods: tuple[LocalPod, ...]
    namespace: str = ""
    """The namespace its pods' DNS names are in (none while it is being planned)."""

    def pod_dir(self, ordinal: int) -> Path:
        """The directory of pod ``ordinal``."""
        return self.base / f"{self.app}-{ordinal}"

    def workspace(self, ordinal: int) -> Path:
        """The pod's /workspace: its own, or one shared by every pod when the storage is RWX."""
        return self.base / SHARED_WORKSPACE if self.shared else self.pod_dir(ordinal) / "workspace"

    @property
    def netns_prefix(self) -> str:
        """``mlenv-<app>-<digest>-``: namespaces are machine-wide, so two checkouts deploying the same app never
        share, reconfigure or delete each other's."""
        return f"mlenv-{self.app}-{self.owner}-"

    @property
    def bridge(self) -> str:
        """The namespace that holds the deployment's bridge."""
        return f"{self.netns_prefix}br"


def _settings(plan: JobPlan) -> LocalSettings:
    settings = plan.cluster.settings
    if not isinstance(settings, LocalSettings):
        raise UsageError(f"{plan.cluster.source}: backend local needs its local: settings")
    return settings


def _owner(base: str) -> str:
    return hashlib.sha256(base.encode()).hexdigest()[:8]


def _marked(directory: Path, marker: str, layout: Layout) -> bool:
    """Whether ``directory`` carries ``layout``'s owner mark (``marker`` names the file inside it)."""
    try:
        return (directory / marker).read_text().strip() == layout.owner
    except OSError:
        return False


def _layout(data: Mapping[str, Any], shared: bool) -> Layout:
    """A handle's recorded directories and pods."""
    return Layout(Path(str(data["base"])), str(data["app"]), str(data["owner"]), shared,
                  tuple(LocalPod(**pod) for pod in data["pods"]), str(data["namespace"]))


def _read_pod(directory: Path) -> LocalPod | None:
    try:
        return LocalPod(**json.loads((directory / POD_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _venv_bin() -> str:
    return str(Path(sys.executable).parent)


class LocalBackend(FanoutJobs, Deploy, NodeAccess, Jobs, Checks):
    """Pods on this machine: network namespaces (root) or plain directories and processes."""

    name = "local"
    torch_fix = "make install-train"
    """What doctor and launch name when a node cannot import torch: the nodes run the Python of mlenv's virtualenv,
    which that installs PyTorch and DeepSpeed into."""

    def __init__(self, project: Path | None = None, namespaces_available: bool | None = None) -> None:
        self.project = project or project_root()
        self.namespaces_available = localnet.available() if namespaces_available is None else namespaces_available
        # what the pods' commands get of this machine's environment, read once: exec_argv only builds
        self.path = os.pathsep.join([_venv_bin(), os.environ.get("PATH", os.defpath)])
        self.torch_extensions = os.environ.get("TORCH_EXTENSIONS_DIR",
                                               str(self.project / ".cache" / "torch_extensions"))
        self.setpriv = shutil.which("setpriv") is not None

    def _isolation(self, settings: LocalSettings) -> str:
        if settings.isolation == PROCESSES or (settings.isolation == "auto" and not self.namespaces_available):
            return PROCESSES
        if not self.namespaces_available:
            raise OperationError("local.isolation is namespaces but network namespaces need root and iproute2 "
                                 "(ip); run as root (sudo), install iproute2, or set local.isolation: processes")
        return NAMESPACES

    def _base(self, plan: JobPlan, settings: LocalSettings) -> str:
        if settings.root:
            return os.path.normpath(os.path.join(self.project, os.path.expanduser(settings.root)))
        return os.path.join(self.project, ".mlenv", "local", plan.cluster.info.namespace or plan.name)

    def prepare(self, plan: JobPlan) -> Request:
        """PURE: every pod's isolation, address, NIC, namespace and directory, as YAML."""
        settings = _settings(plan)
        mode = self._isolation(settings)
        base = self._base(plan, settings)
        owner = _owner(base)
        subnet = ipaddress.ip_network(settings.subnet, strict=False)
        hosts = list(subnet.hosts())
        if mode == NAMESPACES and plan.nodes + 1 > len(hosts):
            raise UsageError(f"local.subnet {subnet} has room for {len(hosts) - 1} pods, not {plan.nodes}")
        # processes share the host's loopback: a port of this deployment's own, so two local clusters never meet
        port = int(plan.env["MASTER_PORT"]) if mode == NAMESPACES else (
            PORT_RANGE[0] + zlib.crc32(base.encode()) % (PORT_RANGE[1] - PORT_RANGE[0]))
        layout = Layout(Path(base), plan.app, owner, plan.storage.shared, ())
        pods = tuple(
            LocalPod(i, f"{plan.app}-{i}", mode, str(hosts[i + 1]),
                     settings.interfaces[i] if i < len(settings.interfaces) else DEFAULT_NIC,
                     f"{layout.netns_prefix}{i}", subnet.prefixlen, port) if mode == NAMESPACES
            else LocalPod(i, f"{plan.app}-{i}", mode, "127.0.0.1", "lo", None, 8, port)
            for i in range(plan.nodes))
        namespace = plan.cluster.info.namespace or plan.name
        master = pod_dns(plan.app, namespace, 0) if mode == NAMESPACES else "127.0.0.1"
        env = {**plan.env, "MASTER_ADDR": master, "MASTER_PORT": str(port)}
        if mode == PROCESSES:
            env.update(NCCL_SOCKET_IFNAME="lo", GLOO_SOCKET_IFNAME="lo")
        data = {"base": base, "app": plan.app, "owner": owner, "namespace": namespace,
                "pods": [asdict(pod) for pod in pods]}
        handle = Handle(self.name, plan.name, plan.nodes, plan.mode, plan.storage.shared, env, data)
        text = to_yaml([{"backend": "local", "base": base, "isolation": mode, "env": env,
                         "pods": [asdict(pod) for pod in pods]}])
        return Request(handle, text, {"pods.yaml": text}, pods)

    @staticmethod
    def layout(handle: Handle) -> Layout:
        """The recorded directories and pods of ``handle``."""
        return handle.decoded(_layout, handle.shared_workspace)

    def _check_ours(self, layout: Layout) -> None:
        """Refuse to adopt directories someone else made where the pods go."""
        theirs = [layout.pod_dir(p.ordinal) for p in layout.pods
                  if layout.pod_dir(p.ordinal).exists() and not _marked(layout.pod_dir(p.ordinal), OWNER, layout)]
        shared = layout.base / SHARED_WORKSPACE
        if layout.shared and shared.exists() and not _marked(shared, OWNER_FILE, layout):
            theirs.append(shared)
        if theirs:
            raise OperationError(f"{shown(str(theirs[0]))} exists and was not made by this deployment: move it "
                                 "away, or set local.root in the cluster file to another directory")

    def apply(self, request: Request, record: Recorder) -> Handle:
        """Create or converge the pods; leftovers of an interrupted run are reused or made again."""
        layout = self.layout(request.handle)
        self._check_ours(layout)
        record(request.handle)
        extra = sorted(o for o in self._existing(layout) if o >= len(layout.pods))
        if extra:  # scaled down: like a StatefulSet, the pods go and their data stays
            self._remove(layout, extra, delete_data=False)
        entries = [(p.ip, _dns_names(layout.app, layout.namespace, p.ordinal)) for p in layout.pods]
        if any(p.netns for p in layout.pods):
            localnet.ensure_bridge(layout.bridge)
        for pod in layout.pods:
            self._make_pod(layout, pod, entries)
        return request.handle

    def _make_pod(self, layout: Layout, pod: LocalPod, entries: list[tuple[str, list[str]]]) -> None:
        directory = layout.pod_dir(pod.ordinal)
        if pod.netns:
            localnet.ensure_pod(layout.bridge, f"p{pod.ordinal}", pod.netns, pod.nic, f"{pod.ip}/{pod.prefixlen}")
            localnet.write_etc(pod.netns, entries)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / OWNER).write_text(layout.owner + "\n")
        (directory / POD_FILE).write_text(json.dumps(asdict(pod), indent=2) + "\n")
        workspace = layout.workspace(pod.ordinal)
        workspace.mkdir(parents=True, exist_ok=True)
        if layout.shared:
            (workspace / OWNER_FILE).parent.mkdir(exist_ok=True)
            (workspace / OWNER_FILE).write_text(layout.owner + "\n")
        where = f"netns {pod.netns}, {pod.nic} {pod.ip}/{pod.prefixlen}" if pod.netns else "loopback"
        message = f"pod {pod.name} ready ({pod.mode}: {where})"
        with (directory / "pod.log").open("a") as log:
            log.write(f"{message}, workspace {workspace}\n")
        info(message)

    def wait_ready(self, handle: Handle, timeout: float, record: Recorder) -> None:
        """Local pods are ready once made; a broken one is named."""
        broken = [row.name for row in self.status(handle) if not row.ready]
        if broken:
            raise OperationError(f"pods not ready: {', '.join(broken)}; mlenv status shows why")

    def _existing(self, layout: Layout) -> set[int]:
        """Ordinals that have a pod directory of this deployment or a namespace, whatever the node count now."""
        found = set()
        pattern = re.compile(re.escape(layout.app) + r"-(\d+)")
        if layout.base.is_dir():
            found |= {int(m.group(1)) for p in layout.base.iterdir()
                      if (m := pattern.fullmatch(p.name)) and _marked(p, OWNER, layout)}
        if self.namespaces_available:
            prefix = re.compile(re.escape(layout.netns_prefix) + r"(\d+)")
            found |= {int(m.group(1)) for name in localnet.namespaces() if (m := prefix.fullmatch(name))}
        return found

    def status(self, handle: Handle) -> list[NodeStatus]:
        """Every pod that exists or is planned, with its address, NIC, isolation mode and running jobs."""
        layout = self.layout(handle)
        existing = self._existing(layout)
        if not existing:
            return []
        rows = []
        ordinals = sorted(set(range(len(layout.pods))) | existing)
        counted = dict(zip(ordinals, localproc.jobs([layout.pod_dir(ordinal) for ordinal in ordinals]), strict=True))
        for ordinal in ordinals:
            pod = _read_pod(layout.pod_dir(ordinal))
            name = f"{layout.app}-{ordinal}"
            if pod is None or not _marked(layout.pod_dir(ordinal), OWNER, layout):
                kept = layout.workspace(ordinal).is_dir()
                rows.append(NodeStatus(name, ordinal, None, "Missing", False, 0, 0, None,
                                       detail="no pod; its workspace is kept" if kept else "not deployed"))
                continue
            ready = pod.netns is None or localnet.configured(pod.netns, pod.nic, f"{pod.ip}/{pod.prefixlen}")
            extra: dict[str, str | int] = {"mode": pod.mode, "nic": pod.nic, "jobs": counted[ordinal]}
            rows.append(NodeStatus(name, ordinal, pod.netns or "localhost", "Running" if ready else "Broken", ready,
                                   0, 0, pod.ip, detail=None if ready else "network broken: mlenv deploy repairs it",
                                   extra=extra))
        return rows

    def nodes(self, handle: Handle) -> list[Node]:
        """The deployed pods; OperationError when the local cluster is not deployed."""
        layout = self.layout(handle)
        nodes = []
        for planned in layout.pods:
            pod = _read_pod(layout.pod_dir(planned.ordinal))
            if pod is None or not _marked(layout.pod_dir(planned.ordinal), OWNER, layout):
                raise OperationError(f"pod {planned.name} of the local cluster is not deployed: run mlenv deploy "
                                     f"(make deploy-cluster CLUSTER={handle.name}) first")
            nodes.append(Node(pod.ordinal, pod.name, str(layout.workspace(pod.ordinal)), pod.ip, ready=True))
        return nodes

    def exec_argv(self, handle: Handle, node: Node, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  interactive: bool = False, stop_on_stdin_eof: bool = False,
                  secrets: Sequence[str] = ()) -> list[str]:
        """PURE: ``env -C <workspace> K=V... sh -c <record PID> argv``, inside the pod's network namespace and a UTS
        namespace of its own, named as the pod (``hostname``), when it has one (its /etc/hosts knows the name).

        mlenv stops local processes through their recorded process groups while it lives; with ``stop_on_stdin_eof``
        the command also gets SIGTERM when mlenv dies however it dies (SIGKILL), as a remote one when its stdin closes:
        its parent-death signal (``setpriv --pdeathsig``; mlenv starts it, and every wrapper execs).
        """
        layout = self.layout(handle)
        pod = layout.pods[node.ordinal]
        directory = layout.pod_dir(node.ordinal)
        variables = {
            **handle.env,
            "MLENV_NODE_RANK": str(node.ordinal),
            "HOSTNAME": node.name,  # local pods share the host's name; the runtime names its records by this
            "PYTHONPATH": f"{node.workspace}/{RUNTIME_DIR}",
            "PATH": self.path,
            "TORCH_EXTENSIONS_DIR": self.torch_extensions,
            localproc.MARKER: str(directory),
            **(env or {}),
        }
        command = list(argv)
        if stop_on_stdin_eof and not interactive and self.setpriv:
            command = ["setpriv", "--pdeathsig", "TERM", "--", *command]
        if secrets:
            command = ["sh", "-c", f'{read_secrets(secrets)}exec "$@"', "sh", *command]
        wrapped = ["env", "-C", node.workspace, *(f"{k}={v}" for k, v in variables.items()),
                   *localproc.recorded(directory, command)]
        if not pod.netns:
            return wrapped
        return [*localnet.exec_prefix(pod.netns), "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                node.name, *wrapped]

    def copy_target(self, handle: Handle, node: Node) -> CopyTarget:
        """The pod's workspace is a directory on this machine: plain local rsync."""
        return CopyTarget(destination=node.workspace.rstrip("/") + "/")

    def data_volumes(self, handle: Handle) -> list[str]:
        """The pod directories (with their workspaces) that ``clean --delete-data`` deletes."""
        layout = self.layout(handle)
        paths = [layout.pod_dir(o) for o in sorted(self._existing(layout))]
        if layout.shared and _marked(layout.workspace(0), OWNER_FILE, layout):
            paths.append(layout.workspace(0))
        return [str(p) for p in paths if p.exists()]

    def clean(self, handle: Handle, delete_data: bool) -> None:
        """Stop every process started in the pods, delete namespaces, bridge and /etc/netns entries; the
        workspaces stay unless ``delete_data``. Only what this deployment marked as its own goes."""
        layout = self.layout(handle)
        existing = sorted(self._existing(layout))
        shared_ours = layout.shared and _marked(layout.workspace(0), OWNER_FILE, layout)
        if not existing and not (delete_data and shared_ours):
            info(f"nothing to clean: no pods of {layout.app} in {layout.base}")
            return
        self._remove(layout, existing, delete_data)
        if self.namespaces_available:
            localnet.delete_namespace(layout.bridge)
        if delete_data:
            if shared_ours:
                shutil.rmtree(layout.workspace(0), ignore_errors=True)
            if layout.base.is_dir() and not any(layout.base.iterdir()):
                layout.base.rmdir()

    def _remove(self, layout: Layout, ordinals: Sequence[int], delete_data: bool) -> None:
        directories = [layout.pod_dir(o) for o in ordinals]
        stopped = localproc.stop(directories)
        if stopped:
            info(f"stopped {stopped} process(es) in {layout.app}")
        removed = 0
        for ordinal, directory in zip(ordinals, directories, strict=True):
            if self.namespaces_available:
                localnet.delete_namespace(f"{layout.netns_prefix}{ordinal}")
            if not _marked(directory, OWNER, layout):
                continue
            deployed = (directory / POD_FILE).exists()  # else cleaned before: only its workspace is left
            if delete_data:
                shutil.rmtree(directory, ignore_errors=True)
            else:
                for entry in directory.iterdir():
                    if entry.is_dir() and entry.name != "workspace":
                        shutil.rmtree(entry)
                    elif not entry.is_dir() and entry.name != OWNER:
                        entry.unlink()
            if deployed or delete_data:
                removed += 1
                info(f"pod {layout.app}-{ordinal} removed" + (" with its data" if delete_data else ""))
        if not removed and not stopped:
            info(f"nothing to clean: the pods of {layout.app} were cleaned before (their workspaces stay; "
                 "--delete-data deletes them)")

    def checks(self, plan: JobPlan) -> list[Check]:
        """Root (for namespaces), iproute2, rsync and setpriv (an attached launch's nodes stop when mlenv dies)."""
        checks = []
        root = os.geteuid() == 0
        checks.append(Check("root", "PASS" if root else "WARN",
                            "running as root" if root else "not root: pods are processes sharing loopback",
                            None if root else "run as root for network-namespace pods"))
        for tool, package in (("ip", "iproute2"), ("rsync", "rsync"), ("setpriv", "util-linux")):
            found = shutil.which(tool)
            checks.append(Check(tool, "PASS" if found else ("FAIL" if tool == "rsync" else "WARN"),
                                found or f"{tool} not found", None if found else f"apt-get install {package}"))
        return checks


def _dns_names(app: str, namespace: str, ordinal: int) -> list[str]:
    """The names a pod answers to, as a StatefulSet pod behind its headless Service does."""
    full = pod_dns(app, namespace, ordinal)
    parts = full.split(".")
    return [full, ".".join(parts[:3]), ".".join(parts[:2]), parts[0]]
