"""What a pod gets to reach the API server from inside the cluster, as on a real one.

Every pod gets ``KUBERNETES_SERVICE_HOST``, ``KUBERNETES_SERVICE_PORT`` and ``KUBERNETES_SERVICE_PORT_HTTPS``: with a
network namespace of its own, the ``kubernetes`` Service's address (kubeadm's ``10.96.0.1:443``), which the fake
answers inside that namespace (a listening socket made there, served by the same HTTPS handler); on this machine's
network, the fake's own address. Unless ``automountServiceAccountToken`` says false (the pod's field, else its
ServiceAccount's), it also gets :data:`MOUNT_PATH` with ``token`` (bound to the pod: it authenticates as
``system:serviceaccount:NS:SA`` only while that pod exists), ``ca.crt`` (the CA of the server's certificate, whose
names include both addresses) and ``namespace``.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .resources import by_kind
from .store import Store

TLS_DIR = Path(__file__).parent / "tls"
CA = TLS_DIR / "ca.pem"
SERVICE_HOST, SERVICE_PORT = "10.96.0.1", 443
MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
CLONE_NEWNET = 0x40000000

Serve = Callable[[socket.socket], Callable[[], None]]
"""Serve the API on a listening socket; returns what stops that."""


@dataclass(frozen=True)
class Bound:
    """Whom a pod's token names, and the pod it is bound to."""

    namespace: str
    account: str
    pod: str
    uid: str

    @property
    def user(self) -> str:
        """The ServiceAccount's user name."""
        return f"system:serviceaccount:{self.namespace}:{self.account}"


@dataclass(frozen=True)
class Access:
    """What the kubelet gives a pod's container: environment, and the files of :data:`MOUNT_PATH` (empty: not
    mounted)."""

    env: dict[str, str]
    files: dict[str, bytes] = field(default_factory=dict)


def automount(pod: dict[str, Any], account: dict[str, Any] | None) -> bool:
    """Whether the pod gets its token: the pod spec's ``automountServiceAccountToken`` wins, else the
    ServiceAccount's, else true."""
    for source in ((pod.get("spec") or {}), (account or {})):
        if source.get("automountServiceAccountToken") is not None:
            return bool(source["automountServiceAccountToken"])
    return True


def listen_in(netns: str, address: tuple[str, int]) -> socket.socket:
    """A listening TCP socket at ``address`` inside network namespace ``netns`` (``/run/netns/NAME``), the address
    added to that namespace's loopback; made by a thread that enters the namespace and then ends."""
    subprocess.run(["ip", "-n", netns, "addr", "add", f"{address[0]}/32", "dev", "lo"], check=True,
                   capture_output=True)
    made: list[socket.socket | BaseException] = []

    def enter_and_listen() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(f"/run/netns/{netns}", "rb") as handle:
                if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), f"setns into {netns}")
            made.append(socket.create_server(address))
        except BaseException as exc:  # handed to the caller
            made.append(exc)

    thread = threading.Thread(target=enter_and_listen, name=f"listen-{netns}")
    thread.start()
    thread.join()
    if isinstance(made[0], BaseException):
        raise made[0]
    return made[0]


class InCluster:
    """The API server's side of in-cluster access: tokens it issued (and whom they name) and the listeners in the
    pods' network namespaces. ``address()`` is the fake's own (host, port); ``serve`` serves a listening socket."""

    def __init__(self, store: Store, address: Callable[[], tuple[str, int]], serve: Serve) -> None:
        self.store = store
        self.address = address
        self.serve = serve
        self._tokens: dict[str, Bound] = {}
        self._stops: dict[str, Callable[[], None]] = {}
        self._lock = threading.Lock()

    def user(self, token: str) -> str | None:
        """The ServiceAccount a token authenticates as, while the pod it is bound to exists (same uid)."""
        with self._lock:
            bound = self._tokens.get(token)
        if bound is None:
            return None
        pod = self.store.get(by_kind("Pod"), bound.namespace, bound.pod)
        return bound.user if pod is not None and pod["metadata"].get("uid") == bound.uid else None

    def attach(self, pod: dict[str, Any], netns: str | None) -> Access:
        """Make the API reachable from the pod (in ``netns``, or on this machine's network for None) and, unless
        automount is off, issue its token."""
        meta = pod["metadata"]
        namespace, uid = meta.get("namespace", "default"), str(meta["uid"])
        host, port = self.address()
        if netns is not None:
            host, port = SERVICE_HOST, SERVICE_PORT
            stop = self.serve(listen_in(netns, (host, port)))
            with self._lock:
                self._stops[uid] = stop
        env = {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": str(port),
               "KUBERNETES_SERVICE_PORT_HTTPS": str(port)}
        account_name = str((pod.get("spec") or {}).get("serviceAccountName") or "default")
        if not automount(pod, self.store.get(by_kind("ServiceAccount"), namespace, account_name)):
            return Access(env)
        token = self.issue(pod)
        return Access(env, {"token": token.encode(), "ca.crt": CA.read_bytes(), "namespace": namespace.encode()})

    def issue(self, pod: dict[str, Any]) -> str:
        """A new token of the pod's ServiceAccount bound to the pod (what automount and a projected
        ``serviceAccountToken`` source get)."""
        meta = pod["metadata"]
        account_name = str((pod.get("spec") or {}).get("serviceAccountName") or "default")
        token = f"fakekube-sa-{secrets.token_urlsafe(24)}"
        with self._lock:
            self._tokens[token] = Bound(meta.get("namespace", "default"), account_name, str(meta["name"]),
                                        str(meta["uid"]))
        return token

    def detach(self, uid: str) -> None:
        """The pod is gone: forget its tokens and stop serving in its namespace."""
        with self._lock:
            self._tokens = {t: b for t, b in self._tokens.items() if b.uid != uid}
            stop = self._stops.pop(uid, None)
        if stop is not None:
            stop()


def write_files(directory: Path, files: dict[str, bytes]) -> None:
    """The token directory as the kubelet projects it: readable by any user (0644 files in a 0755 directory)."""
    directory.mkdir(mode=0o755, exist_ok=True)
    for name, content in files.items():
        path = directory / name
        path.write_bytes(content)
        os.chmod(path, 0o644)
