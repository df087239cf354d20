"""A kubelet that really runs pods on this machine (``FakeKube(run_pods=True)``).

A scheduled pod's containers run with their command and args, env (downward API fields included), working directory
and volumes (claims as directories shared by every pod that mounts them, emptyDirs per pod, projected volumes of
ServiceAccount tokens, ConfigMaps and downward API fields), each in PID and mount namespaces of its own (the pod's
network shared), and their security context (:mod:`security`: user, groups, capabilities, no_new_privs, a read-only
root; volumes group-owned by the fsGroup as the kubelet makes them); see :mod:`container`. As root with iproute2
each pod gets a network namespace with its pod IP on a bridge of its own (the local backend's plumbing,
:mod:`mlenv.backends.local.net`); otherwise pods share this machine's network and their pod IP is 127.0.0.1. Every
pod's /etc/hosts names the pods of its headless Service.

Restarts follow ``restartPolicy`` with the kubelet's doubling back-off (CrashLoopBackOff while waiting). The first
container is the pod's status; the others (sidecars) start once it runs and are started again, after the first
back-off, whenever they end while it does.
``delete`` is graceful: SIGTERM to PID 1, SIGKILL after the grace period. ``shutdown`` ends everything.
"""

from __future__ import annotations

import base64
import contextlib
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlenv.backends.local import net

from . import security
from .container import Container, Sandbox, Terminated
from .incluster import MOUNT_PATH, Access, InCluster, write_files

CLUSTER_DOMAIN = "cluster.local"
POD_SUBNET_BITS = 16
MAX_BACKOFF = 300.0
BRIDGE_NIC = "eth0"
REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
FIELD = re.compile(r"metadata\.(labels|annotations)\['(.+)'\]")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``$$`` escapes; unknown references stay as written)."""
    return REFERENCE.sub(lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def field_value(pod: dict[str, Any], path: str) -> str:
    """A downward-API ``fieldRef.fieldPath`` of ``pod``."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    found = FIELD.fullmatch(path)
    if found:
        return str((meta.get(found.group(1)) or {}).get(found.group(2), ""))
    values = {"metadata.name": meta["name"], "metadata.namespace": meta.get("namespace", ""),
              "metadata.uid": meta["uid"], "spec.nodeName": spec.get("nodeName", ""),
              "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
              "status.podIP": status.get("podIP", ""), "status.hostIP": status.get("hostIP", "")}
    return str(values.get(path, ""))


def home(uid: int) -> str:
    """HOME for ``uid``: its home directory in this machine's (the "image's") passwd, else ``/``, as CRI-O sets it."""
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return "/"


SecretLookup = Callable[[str, str], "dict[str, Any] | None"]
"""(namespace, name) -> the Secret as stored, or None."""


class MountError(Exception):
    """A volume that cannot be set up (the kubelet's ``FailedMount``: the pod stays ContainerCreating)."""


def write_projected(directory: Path, files: Mapping[str, bytes], mode: int) -> None:
    """A projected volume's files in ``directory`` (its earlier files removed), owned by root, mode ``mode``."""
    for old in directory.iterdir():
        old.unlink()
    for name, content in files.items():
        path = directory / name
        path.write_bytes(content)
        path.chmod(mode)


def write_secret(directory: Path, secret: dict[str, Any] | None, volume: dict[str, Any], group: int | None) -> None:
    """A ``secret`` volume's files in ``directory`` as the kubelet writes them: one file per key, its decoded value,
    mode ``defaultMode`` (0644), owned by root and the pod's fsGroup; nothing for a missing ``optional`` Secret,
    MountError for a missing required one."""
    source = volume["secret"]
    if secret is None and not source.get("optional"):
        name, secret_name = volume["name"], source.get("secretName")
        raise MountError(f'MountVolume.SetUp failed for volume "{name}" : secret "{secret_name}" not found')
    for old in directory.iterdir():
        old.unlink()
    for key, value in ((secret or {}).get("data") or {}).items():
        path = directory / key
        path.write_bytes(base64.b64decode(value))
        path.chmod(int(source.get("defaultMode", 0o644)))
        if group is not None:
            os.chown(path, 0, group)


def container_env(pod: dict[str, Any], container: dict[str, Any], uid: int = 0,
                  services: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment: the test environment's PATH (the "image"; this Python's directory first, so ``python3`` is
    the one running the tests), HOSTNAME, the ``services`` variables (``KUBERNETES_SERVICE_HOST``...), then the
    container's ``env`` in order."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/bin:/bin")])
    env = {"PATH": path, "HOME": home(uid), "HOSTNAME": pod["metadata"]["name"], **(services or {})}
    for item in container.get("env") or []:
        source = item.get("valueFrom") or {}
        if "fieldRef" in source:
            env[item["name"]] = field_value(pod, source["fieldRef"].get("fieldPath", ""))
        else:
            env[item["name"]] = expand(str(item.get("value", "")), env)
    return env


@dataclass
class View:
    """What the kubelet reports for a pod's container: the status fields the controller writes."""

    state: dict[str, Any]
    last_state: dict[str, Any]
    restarts: int
    running: bool
    phase: str
    container_id: str


@dataclass
class PodRun:
    """One pod on this kubelet: its directory, network, current container and history."""

    pod: dict[str, Any]
    directory: Path
    netns: str | None
    access: Access
    current: Container | None = None
    last: Terminated | None = None
    restarts: int = 0
    next_start: float = 0.0
    back_off: float = 0.0
    stopping: bool = False
    failure: str = ""
    failure_reason: str = "CreateContainerError"
    done: threading.Event = field(default_factory=threading.Event)
    sidecars: dict[str, Container] = field(default_factory=dict)
    """The running (or ended) containers after the first, by name."""
    sidecar_starts: dict[str, int] = field(default_factory=dict)
    """How often each was started (its log's number)."""
    sidecar_next: dict[str, float] = field(default_factory=dict)
    """When each may be started again once it ended (monotonic)."""

    @property
    def uid(self) -> str:
        """The pod's uid."""
        return str(self.pod["metadata"]["uid"])


class Kubelet:
    """Runs the pods the controller hands it; ``on_change`` is called (from a worker thread) whenever a container
    ends or a pod finished terminating, so the controller writes the new status at once."""

    def __init__(self, root: Path, on_change: Callable[[], None], restart_backoff: float = 10.0,
                 network: bool | None = None, secret: SecretLookup | None = None,
                 cluster: InCluster | None = None, config_map: SecretLookup | None = None) -> None:
        self.root = root
        self.cluster = cluster
        """The API server's side of pods' in-cluster access (None: pods get neither its address nor tokens)."""
        self.secret = secret
        """Reads the Secrets of the pods' ``secret`` volumes."""
        self.config_map = config_map
        """Reads the ConfigMaps of the pods' ``projected`` volumes."""
        self.on_change = on_change
        self.restart_backoff = restart_backoff
        self.network = net.available() if network is None else network and net.available()
        """Pods get network namespaces (``network``: None when this process can make them, i.e. root)."""
        self.user_namespace = os.geteuid() != 0
        self.prefix = f"fk{secrets.token_hex(3)}"
        self.bridge = f"{self.prefix}-br"
        self._runs: dict[str, PodRun] = {}
        self._ports = iter(range(1_000_000))
        self._lock = threading.Lock()
        self._closed = False
        if self.network:
            net.ensure_bridge(self.bridge)

    # --- the controller's side ------------------------------------------------------------------------------

    def pod_ip(self, ordinal: int) -> str:
        """The IP of the ``ordinal``-th pod scheduled (its own namespace), or 127.0.0.1 (the machine's network)."""
        return f"10.128.{ordinal // 250}.{ordinal % 250 + 2}" if self.network else "127.0.0.1"

    def sync(self, pod: dict[str, Any], peers: Sequence[dict[str, Any]],
             services: Iterable[dict[str, Any]] = ()) -> View:
        """Make ``pod`` run (starting, or restarting after its back-off); its /etc/hosts names the ``peers`` of its
        headless Service and the headless ``services`` of its namespace (the cluster DNS it has instead).
        Returns what its status should say."""
        with self._lock:
            run = self._runs.get(pod["metadata"]["uid"])
            if self._closed:
                return View({"waiting": {"reason": "ContainerCreating"}}, {}, 0, False, "Pending", "")
            if run is None:
                run = self._runs[pod["metadata"]["uid"]] = self._new_run(pod)
            run.pod = pod
            self._write_hosts(run, peers, services)
            if run.current is None and not run.failure and not run.stopping and time.monotonic() >= run.next_start:
                self._start(run)
            if run.current is not None and not run.stopping:
                self._start_sidecars(run)
            return self._view(run)

    def waiting(self) -> bool:
        """Whether some pod waits out a back-off (the controller must come back even if nothing changes)."""
        with self._lock:
            return any(r.current is None and not r.stopping and not r.failure for r in self._runs.values())

    def delete(self, uid: str, grace: float, gone: Callable[[], None]) -> None:
        """Terminate pod ``uid`` in the background (SIGTERM, SIGKILL after ``grace``), then call ``gone``."""
        with self._lock:
            run = self._runs.get(uid)
            if run is None or run.stopping:
                if run is None:
                    gone()
                return
            run.stopping = True
        threading.Thread(target=self._terminate, args=(run, grace, gone), name=f"stop-{uid[:8]}",
                         daemon=True).start()

    def prune(self, alive: set[str]) -> None:
        """Terminate pods that vanished from the API without a graceful delete (garbage collection)."""
        with self._lock:
            orphans = [r for uid, r in self._runs.items() if uid not in alive and not r.stopping]
        for run in orphans:
            grace = float((run.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            self.delete(run.uid, grace, lambda: None)

    def shutdown(self) -> None:
        """Kill every pod's processes now and remove their namespaces and the bridge; nothing starts after."""
        with self._lock:
            self._closed = True
            runs = list(self._runs.values())
        for run in runs:
            run.stopping = True
            for container in [run.current, *run.sidecars.values()]:
                if container is not None:
                    container.stop(0)
            self._release(run)
        if self.network:
            net.delete_namespace(self.bridge)

    # --- what the API server asks -----------------------------------------------------------------------------

    def running(self, uid: str, name: str | None = None) -> Container | None:
        """The running container of pod ``uid`` (its first, or the sidecar ``name``), or None."""
        with self._lock:
            run = self._runs.get(uid)
            current = None if run is None else run.sidecars.get(name) if name in run.sidecars else run.current
        return current if current is not None and not current.ended.is_set() else None

    def log(self, uid: str, previous: bool, name: str | None = None) -> tuple[Path, threading.Event] | None:
        """(log file, set once that container ended) of the current or ``previous`` container (the first, or the
        sidecar ``name``: its current one), or None."""
        with self._lock:
            run = self._runs.get(uid)
            if run is None:
                return None
            if name in run.sidecars:
                return (None if previous else (run.sidecars[name].log, run.sidecars[name].ended))
            waits = run.current is None and not run.stopping  # to be restarted: its last log is the previous one
            index = run.restarts - (1 if previous or waits else 0)
            if index < 0:
                return None
            ended = run.current.ended if run.current is not None and not previous else _ENDED
            return run.directory / f"container-{index}.log", ended

    # --- inside -----------------------------------------------------------------------------------------------

    def _new_run(self, pod: dict[str, Any]) -> PodRun:
        meta = pod["metadata"]
        directory = self.root / f"{meta.get('namespace', 'default')}_{meta['name']}_{meta['uid'][:8]}"
        directory.mkdir(parents=True)
        netns = None
        if self.network:
            index = next(self._ports)
            netns = f"{self.prefix}-{index}"
            ip = (pod.get("status") or {}).get("podIP", "")
            net.ensure_pod(self.bridge, f"p{index}", netns, BRIDGE_NIC, f"{ip}/{POD_SUBNET_BITS}")
        access = self.cluster.attach(pod, netns) if self.cluster is not None else Access({})
        if access.files:
            write_files(directory / "serviceaccount", access.files)
        return PodRun(pod, directory, netns, access)

    def _mounts(self, run: PodRun, container: dict[str, Any],
                context: security.Security) -> list[tuple[str, str, bool]]:
        """(source, container path, read-only) of the container's volumeMounts, /etc/hosts, and the ServiceAccount
        token's directory (read-only) when the pod has one. A new emptyDir is
        world-writable (0777), a new claim root's (0755, as a provisioner makes it); with an fsGroup every volume
        is made the group's (:func:`own_volume`)."""
        namespace = run.pod["metadata"].get("namespace", "default")
        sources: dict[str, Path] = {}
        for volume in (run.pod.get("spec") or {}).get("volumes") or []:
            claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
            source = self.root / "claims" / namespace / claim if claim else run.directory / "volumes" / volume["name"]
            if "secret" in volume:
                source.mkdir(parents=True, exist_ok=True)
                found = self.secret(namespace, str(volume["secret"].get("secretName"))) if self.secret else None
                write_secret(source, found, volume, context.fs_group)
                sources[volume["name"]] = source
                continue
            if "projected" in volume:
                source.mkdir(parents=True, exist_ok=True)
                write_projected(source, self._projected(run.pod, volume), int(volume["projected"].get(
                    "defaultMode", 0o644)))
                sources[volume["name"]] = source
                continue
            if not source.exists():
                source.mkdir(parents=True)
                if not claim:
                    source.chmod(0o777)
            if context.fs_group is not None:
                own_volume(source, context.fs_group, context.fs_group_on_root_mismatch)
            sources[volume["name"]] = source
        mounts = []
        for mount in container.get("volumeMounts") or []:
            source = sources.get(mount["name"])
            if source is None:
                raise OSError(f'volume "{mount["name"]}" of mount {mount["mountPath"]} is not a volume of the pod')
            sub = mount.get("subPath")
            if sub:
                source = source / sub
                source.mkdir(parents=True, exist_ok=True)
            mounts.append((str(source), str(mount["mountPath"]), bool(mount.get("readOnly"))))
        token = [(str(run.directory / "serviceaccount"), MOUNT_PATH, True)] if run.access.files else []
        return [*mounts, (str(run.directory / "hosts"), "/etc/hosts", False), *token]

    def _write_hosts(self, run: PodRun, peers: Sequence[dict[str, Any]], services: Iterable[dict[str, Any]]) -> None:
        """The pod's /etc/hosts: localhost; for the pods of its headless Service (``subdomain``) their IPs and
        names (``pod.service.namespace.svc.cluster.local`` and shorter); for each headless Service of its namespace
        with a selector, the IPs of the pods it selects under its names. Written in place: it is bound."""
        spec = run.pod.get("spec") or {}
        namespace = run.pod["metadata"].get("namespace", "")
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        for service in services:
            sspec, name = service.get("spec") or {}, service["metadata"]["name"]
            selector = sspec.get("selector") or {}
            if service["metadata"].get("namespace") != namespace or sspec.get("clusterIP") != "None" or not selector:
                continue
            for peer in peers:
                ip = (peer.get("status") or {}).get("podIP")
                labels = peer["metadata"].get("labels") or {}
                if ip and peer["metadata"].get("namespace") == namespace and selector.items() <= labels.items():
                    lines.append(f"{ip}\t{name}.{namespace}.svc.{CLUSTER_DOMAIN} {name}.{namespace}.svc {name}")
        for peer in peers:
            pspec, ip = peer.get("spec") or {}, (peer.get("status") or {}).get("podIP")
            if not ip or not spec.get("subdomain") or pspec.get("subdomain") != spec["subdomain"]:
                continue
            host, namespace = pspec.get("hostname") or peer["metadata"]["name"], peer["metadata"]["namespace"]
            fqdn = f"{host}.{pspec['subdomain']}.{namespace}.svc.{CLUSTER_DOMAIN}"
            lines.append(f"{ip}\t{fqdn} {host}.{pspec['subdomain']}.{namespace}.svc {host}.{pspec['subdomain']} "
                         f"{host}")
        text = "\n".join(lines) + "\n"
        hosts = run.directory / "hosts"
        if not hosts.exists() or hosts.read_text() != text:
            with hosts.open("r+" if hosts.exists() else "w") as out:  # overwritten, then cut: never read empty
                out.write(text)
                out.truncate()

    def _projected(self, pod: dict[str, Any], volume: dict[str, Any]) -> dict[str, bytes]:
        """A ``projected`` volume's files: a token bound to the pod (``serviceAccountToken``, whatever
        ``automountServiceAccountToken`` says), ConfigMap keys, downward-API fields; MountError for a missing
        ConfigMap (or key) that is not optional, or a source fakekube cannot honour."""
        namespace, files = pod["metadata"].get("namespace", "default"), {}
        for source in volume["projected"].get("sources") or []:
            if "serviceAccountToken" in source and self.cluster is not None:
                files[str(source["serviceAccountToken"].get("path", "token"))] = self.cluster.issue(pod).encode()
            elif "configMap" in source:
                wanted = source["configMap"]
                found = self.config_map(namespace, str(wanted.get("name"))) if self.config_map else None
                if found is None and not wanted.get("optional"):
                    raise MountError(f'MountVolume.SetUp failed for volume "{volume["name"]}" : configmap '
                                     f'"{wanted.get("name")}" not found')
                data = (found or {}).get("data") or {}
                for item in wanted.get("items") or [{"key": key, "path": key} for key in data]:
                    if item["key"] in data:
                        files[str(item["path"])] = str(data[item["key"]]).encode()
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    files[str(item["path"])] = field_value(pod, item["fieldRef"]["fieldPath"]).encode()
            else:
                raise MountError(f'fakekube cannot honour the projected source {sorted(source)} of volume '
                                 f'"{volume["name"]}"')
        return files

    def _launch(self, run: PodRun, container: dict[str, Any], context: security.Security, name: str,
                log: Path) -> Container:
        """Start ``container`` of the pod in a root of its own (``name``); OSError or MountError when it cannot."""
        pod = run.pod
        env = container_env(pod, container, context.uid, run.access.env)
        argv = [expand(str(a), env) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
        if not argv:
            raise OSError("no command: fakekube does not pull images, so the container must name its command")
        sandbox = Sandbox(run.directory / name, self._mounts(run, container, context),
                          str((pod.get("spec") or {}).get("hostname") or pod["metadata"]["name"]),
                          str(container.get("workingDir") or "/"), argv, env, run.netns, self.user_namespace,
                          context, str(self.root))
        return Container.start(sandbox, log, run.directory / f"{name}.json")

    def _start_sidecars(self, run: PodRun) -> None:
        """Start the pod's containers after the first that do not run (one that ended: after the first back-off);
        one that cannot start says why in its log."""
        for container in ((run.pod.get("spec") or {}).get("containers") or [])[1:]:
            name = str(container.get("name", ""))
            running = run.sidecars.get(name)
            if (running is not None and not running.ended.is_set()) or time.monotonic() < run.sidecar_next.get(name, 0):
                continue
            count = run.sidecar_starts[name] = run.sidecar_starts.get(name, -1) + 1
            log = run.directory / f"{name}-{count}.log"
            try:
                started = self._launch(run, container, self._security(run.pod, container), f"rootfs-{name}", log)
            except (security.Refused, MountError, OSError) as exc:
                log.write_text(f"fakekube: container {name} did not start: {exc}\n")
                run.sidecar_next[name] = time.monotonic() + self.restart_backoff
                continue
            run.sidecars[name], run.sidecar_next[name] = started, time.monotonic() + self.restart_backoff

    def _start(self, run: PodRun) -> None:
        pod = run.pod
        container = (pod.get("spec") or {}).get("containers", [{}])[0]
        try:
            context = self._security(pod, container)
        except security.Refused as refused:
            run.failure, run.failure_reason = refused.message, refused.reason
            return
        try:
            run.current = self._launch(run, container, context, "rootfs",
                                       run.directory / f"container-{run.restarts}.log")
        except MountError as exc:
            run.failure, run.failure_reason = str(exc), "ContainerCreating"
            return
        except OSError as exc:
            said = _last_line(run.directory / f"container-{run.restarts}.log")
            run.failure = f"{exc}: {said}" if said else str(exc)
            return
        threading.Thread(target=self._watch, args=(run, run.current), name=f"watch-{run.uid[:8]}",
                         daemon=True).start()

    def _security(self, pod: dict[str, Any], container: dict[str, Any]) -> security.Security:
        """The container's security context; without root (a user namespace mapping only root) only uid and gid
        0 with no other groups can be honoured."""
        context = security.effective(pod, container)
        if self.user_namespace and (context.uid or context.gid or context.groups):
            raise security.Refused("CreateContainerError",
                                   f"fakekube runs without root: it cannot run a container as uid {context.uid}, gid "
                                   f"{context.gid}, groups {list(context.groups)}: run the tests as root")
        return context

    def _watch(self, run: PodRun, container: Container) -> None:
        """Wait for the container's end, record it, arrange the restart, and tell the controller."""
        container.ended.wait()
        with self._lock:
            run.last, run.current = container.terminated, None
            policy = (run.pod.get("spec") or {}).get("restartPolicy", "Always")
            code = container.terminated.exit_code if container.terminated else 1
            restart = policy == "Always" or (policy == "OnFailure" and code != 0)
            if restart and not run.stopping:
                run.back_off = min(self.restart_backoff * 2 ** run.restarts, MAX_BACKOFF) if run.restarts else 0.0
                run.next_start = time.monotonic() + run.back_off
                run.restarts += 1
            elif not run.stopping:
                run.stopping = True  # Succeeded or Failed: never started again
        self.on_change()

    def _view(self, run: PodRun) -> View:
        last = run.last.document() if run.last else {}
        name = run.pod["metadata"]["name"]
        if run.failure:
            state = {"waiting": {"reason": run.failure_reason, "message": run.failure}}
            return View(state, last, run.restarts, False, "Pending", "")
        if run.current is not None:
            started = {"running": {"startedAt": run.current.started_at}}
            return View(started, last, run.restarts, True, "Running", run.current.container_id)
        if run.stopping and run.last is not None:
            phase = "Succeeded" if run.last.exit_code == 0 else "Failed"
            return View(run.last.document(), {}, run.restarts, False, phase, run.last.container_id)
        if run.last is None:
            return View({"waiting": {"reason": "ContainerCreating"}}, {}, 0, False, "Pending", "")
        message = (f"back-off {run.back_off:g}s restarting failed container="
                   f"{(run.pod['spec'].get('containers') or [{}])[0].get('name', '')} "
                   f"pod={name}_{run.pod['metadata'].get('namespace', '')}({run.uid})")
        return View({"waiting": {"reason": "CrashLoopBackOff", "message": message}}, last, run.restarts, False,
                    "Running", run.last.container_id)

    def _terminate(self, run: PodRun, grace: float, gone: Callable[[], None]) -> None:
        for sidecar in run.sidecars.values():
            sidecar.signal(signal.SIGTERM)
        for container in [run.current, *run.sidecars.values()]:
            if container is not None:
                container.stop(grace)
        self._release(run)
        gone()
        self.on_change()

    def _release(self, run: PodRun) -> None:
        """Forget the pod: its network namespace and directory (claims stay: they are the volumes' data)."""
        with self._lock:
            self._runs.pop(run.uid, None)
        if self.cluster is not None:
            self.cluster.detach(run.uid)
        if run.netns:
            net.delete_namespace(run.netns)
        with contextlib.suppress(OSError):
            shutil.rmtree(run.directory)
        run.done.set()


def own_volume(source: Path, group: int, on_root_mismatch: bool) -> None:
    """Make a volume the ``group``'s as the kubelet does for an fsGroup: every file and directory gets that group
    and group read-write (directories also search and setgid, so new files get the group); with
    ``fsGroupChangePolicy: OnRootMismatch`` nothing happens when the volume's root already is so."""
    if on_root_mismatch:
        info = source.stat()
        if info.st_gid == group and info.st_mode & 0o2770 == 0o2770:
            return
    for directory, _, files in os.walk(source):
        for path in [directory, *(os.path.join(directory, f) for f in files)]:
            with contextlib.suppress(FileNotFoundError):  # removed meanwhile by a pod sharing the volume
                info = os.lstat(path)
                if not stat.S_ISLNK(info.st_mode):
                    os.lchown(path, -1, group)
                    os.chmod(path, stat.S_IMODE(info.st_mode) | (0o2770 if stat.S_ISDIR(info.st_mode) else 0o660))


def _last_line(path: Path) -> str:
    """The last line of a file (''  when there is none)."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


_ENDED = threading.Event()
_ENDED.set()
