"""FakeKube: a small Kubernetes API server on 127.0.0.1 that the real kubectl/oc binaries can talk to."""

from __future__ import annotations

import base64
import copy
import os
import ssl
import sys
import threading
from collections.abc import Iterable, Mapping
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from .admission import Admission
from .api import Api
from .controller import Controller
from .faults import Faults
from .handler import Handler
from .requestlog import RequestLog
from .resources import RESOURCES, ResourceType, by_kind
from .store import Store

DEFAULT_TOKEN = "fakekube-token"  # noqa: S105 - a test credential, not a secret
TLS_DIR = Path(__file__).parent / "tls"


def resource_type(name: str) -> ResourceType:
    """A served resource by plural (``pods``), short name (``sts``) or kind (``StatefulSet``)."""
    for rt in RESOURCES:
        if name in (rt.plural, rt.kind, rt.kind.lower(), *rt.short_names):
            return rt
    raise KeyError(f"fakekube does not serve {name!r}")


class _HTTPSServer(ThreadingHTTPServer):
    """HTTPS, because kubectl sends a kubeconfig's bearer token to https:// servers only.

    The TLS handshake happens in each connection's thread (on first read), not in the accept loop.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], fake: FakeKube) -> None:
        super().__init__(address, Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(TLS_DIR / "cert.pem", TLS_DIR / "key.pem")
        self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.fake = fake

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hanging up mid-request are normal; print anything else (it is also in fake.failures)."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class FakeKube:
    """The fake API server, its object store, controllers and fault switches.

    ``nodes``: names of the cluster's nodes (each with ``gpus_per_node`` allocatable nvidia.com/gpu);
    ``namespaces``: namespaces that exist from the start; ``ready_delay``: seconds between a pod being
    scheduled and becoming Ready. Use as a context manager, or call start() and stop().

    Tests steer it through ``faults`` (see :class:`Faults`), ``forbidden_namespaces`` (requests in them get
    403 Forbidden), ``pod_logs[(namespace, pod)]`` (what ``kubectl logs`` returns), ``token``; they read
    ``requests`` (the :class:`RequestLog`) and ``failures`` (exceptions inside the fake; should stay empty).
    """

    def __init__(
        self,
        *,
        token: str = DEFAULT_TOKEN,
        user: str = "developer",
        nodes: Iterable[str] = ("node-0", "node-1"),
        gpus_per_node: int = 8,
        namespaces: Iterable[str] = ("default",),
        ready_delay: float = 0.0,
        resync_seconds: float = 0.1,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.token = token
        self.user = user
        self.faults = Faults()
        self.forbidden_namespaces: set[str] = set()
        self.pod_logs: dict[tuple[str, str], str] = {}
        self.requests = RequestLog()
        self.failures: list[str] = []  # bugs of the fake itself (handler or controller exceptions)
        self.store = Store()
        self.api = Api(self.store, Admission(self.faults))
        self.controller = Controller(self.store, self.api, self.faults, self.failures, ready_delay, resync_seconds)
        self.stopping = False
        self._address = (host, port)
        self._httpd: _HTTPSServer | None = None
        self._thread: threading.Thread | None = None
        for namespace in dict.fromkeys(namespaces):
            self.add_namespace(namespace)
        for index, node in enumerate(nodes):
            self.add_node(node, gpus_per_node, ip=f"10.0.0.{index + 10}")

    # --- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> FakeKube:
        """Listen (an ephemeral port unless one was given) and serve in background threads."""
        self.stopping = False
        self._httpd = _HTTPSServer(self._address, self)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="fakekube-http",
                                        daemon=True)
        self._thread.start()
        self.controller.start()
        return self

    def stop(self) -> None:
        """Stop serving (open watches end within a second) and stop the controller."""
        self.stopping = True
        with self.store.changed:
            self.store.changed.notify_all()
        if self._httpd:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread:
            self._thread.join()
            self._thread = None
        self.controller.stop()

    def __enter__(self) -> FakeKube:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port it listens on (after start())."""
        if self._httpd is None:
            raise RuntimeError("FakeKube is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """``https://127.0.0.1:PORT``, the cluster server of a kubeconfig."""
        return f"https://{self._address[0]}:{self.port}"

    @property
    def certificate_authority_data(self) -> str:
        """The server certificate (self-signed, so also its CA), base64, for a kubeconfig."""
        return base64.b64encode((TLS_DIR / "cert.pem").read_bytes()).decode()

    def write_kubeconfig(self, path: str | os.PathLike[str], namespace: str = "default") -> Path:
        """Write a kubeconfig for this server: one context ``fakekube``, the bearer token, a default namespace."""
        cluster = {"server": self.url, "certificate-authority-data": self.certificate_authority_data}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fakekube", "cluster": cluster}],
            "users": [{"name": self.user, "user": {"token": self.token}}],
            "contexts": [{"name": "fakekube",
                          "context": {"cluster": "fakekube", "user": self.user, "namespace": namespace}}],
            "current-context": "fakekube",
        }
        target = Path(path)
        target.write_text(yaml.safe_dump(config, sort_keys=False))
        target.chmod(0o600)
        return target

    # --- convenience for tests ------------------------------------------------------------------------------

    def add_namespace(self, name: str) -> dict[str, Any]:
        """Create a namespace (as an admin would)."""
        return self.api.save(by_kind("Namespace"), {"metadata": {"name": name}}, None)

    def add_node(self, name: str, gpus: int = 8, ip: str = "", labels: Mapping[str, str] | None = None) -> None:
        """Add a Ready worker node with ``gpus`` allocatable nvidia.com/gpu."""
        resources = {"cpu": "64", "memory": "512Gi", "pods": "250", "nvidia.com/gpu": str(gpus)}
        ip = ip or f"10.0.1.{len(self.store.list(by_kind('Node'))) + 10}"
        self.api.save(by_kind("Node"), {
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                  "node-role.kubernetes.io/worker": "", **(labels or {})}},
            "spec": {},
        }, None)
        node = copy.deepcopy(self.store.require(by_kind("Node"), "", name))
        node["status"] = {
            "capacity": resources, "allocatable": resources,
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "nodeInfo": {"kubeletVersion": "v1.32.4", "containerRuntimeVersion": "cri-o://1.32.0"},
        }
        self.store.update(by_kind("Node"), node)

    def objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Stored objects by resource name (``pods``, ``sts``, ``Event``...), in one namespace or all."""
        return self.store.list(resource_type(resource), namespace)

    def reconcile(self) -> None:
        """Run the controllers now (after flipping a fault switch, instead of waiting for the resync)."""
        self.controller.reconcile()
