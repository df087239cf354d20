"""FakeKube: a small Kubernetes API server on 127.0.0.1 that the real kubectl/oc binaries can talk to."""

from __future__ import annotations

import base64
import copy
import dataclasses
import os
import shutil
import socket
import ssl
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from . import seeds
from .access import Deny
from .admission import Admission
from .api import Api
from .controller import Controller
from .faults import Faults
from .handler import Handler
from .incluster import CA, TLS_DIR, InCluster
from .kubelet import Kubelet
from .requestlog import RequestLog
from .resources import ADDONS, OPENSHIFT_GROUPS, RESOURCES, ResourceType, by_kind
from .seeds import NodeSpec
from .store import Store

SECURITY_GROUP = "security.openshift.io"

DEFAULT_TOKEN = "fakekube-token"  # noqa: S105 - a test credential, not a secret


def resource_type(name: str) -> ResourceType:
    """A served resource by plural (``pods``), short name (``sts``) or kind (``StatefulSet``)."""
    for rt in RESOURCES:
        if name in (rt.plural, rt.kind, rt.kind.lower(), *rt.short_names):
            return rt
    raise KeyError(f"fakekube does not serve {name!r}")


class _HTTPSServer(ThreadingHTTPServer):
    """HTTPS, because kubectl sends a kubeconfig's bearer token to https:// servers only.

    The TLS handshake happens in each connection's thread (on first read), not in the accept loop. ``listening``:
    serve that socket (one made in a pod's network namespace) instead of binding ``address``.
    """

    daemon_threads = True

    def __init__(self, address: tuple[str, int], fake: FakeKube, listening: socket.socket | None = None) -> None:
        super().__init__(address, Handler, bind_and_activate=listening is None)
        if listening is not None:
            self.socket.close()
            self.socket, self.server_address = listening, listening.getsockname()
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

    ``nodes``: the cluster's nodes, names (each with ``gpus_per_node`` allocatable nvidia.com/gpu) or
    :class:`NodeSpec`s; ``namespaces``: namespaces that exist from the start; ``storage_classes``: StorageClass
    objects (default :data:`seeds.DEFAULT_STORAGE_CLASSES`); ``openshift``: serve the OpenShift API groups (with
    the default SCCs) or not, like plain Kubernetes; ``ready_delay``: seconds between a pod being scheduled and
    becoming Ready; ``run_pods``: really run scheduled pods on this machine (:mod:`kubelet`; ``restart_backoff`` is
    the first CrashLoopBackOff delay; ``pod_network=False``: no network namespaces even as root), and serve exec
    and logs from them. Use as a context manager, or call start()
    and stop(): stop ends every pod's processes.

    Tests steer it through ``faults`` (see :class:`Faults`), ``forbidden_namespaces`` (requests in them get
    403 Forbidden), ``denied`` (:class:`Deny` rules: 403 and "no" from access reviews), ``held`` (hung
    requests), ``hidden_groups`` (API groups not served; ``addons``: ``kueue``, ``volcano`` served from the start),
    ``schedulers`` (the schedulerNames it schedules for), ``pod_webhooks`` (mutating admission of new pods, as an
    add-on's webhook), ``pod_logs[(namespace, pod)]`` (what ``kubectl logs``
    returns), ``token``, and the methods below; they read ``requests`` (the :class:`RequestLog`) and
    ``failures`` (exceptions inside the fake; should stay empty).
    """

    def __init__(
        self,
        *,
        token: str = DEFAULT_TOKEN,
        user: str = "developer",
        nodes: Iterable[str | NodeSpec] = ("node-0", "node-1"),
        gpus_per_node: int = 8,
        namespaces: Iterable[str] = ("default",),
        storage_classes: Iterable[dict[str, Any]] = seeds.DEFAULT_STORAGE_CLASSES,
        openshift: bool = True,
        ready_delay: float = 0.0,
        resync_seconds: float = 0.1,
        host: str = "127.0.0.1",
        port: int = 0,
        run_pods: bool = False,
        restart_backoff: float = 10.0,
        pod_network: bool | None = None,
        addons: Iterable[str] = (),
    ) -> None:
        self.token = token
        self.user = user
        self.faults = Faults()
        self.forbidden_namespaces: set[str] = set()
        self.denied: set[Deny | tuple[str, ...]] = set()
        self.hidden_groups: set[str] = ({group for addon, group in ADDONS.items() if addon not in set(addons)}
                                        | (set() if openshift else set(OPENSHIFT_GROUPS)))
        self.pod_logs: dict[tuple[str, str], str] = {}
        self.held: dict[tuple[str, str], threading.Event] = {}
        """``(verb, plural)`` -> an Event: a matching request hangs until the Event is set, then is served as if
        nothing happened (an API call that times out on the client and completes later)."""
        self.holding = threading.Event()
        """Set once a request is held."""
        self.requests = RequestLog()
        self.failures: list[str] = []  # bugs of the fake itself (handler or controller exceptions)
        self.store = Store()
        self.api = Api(self.store, Admission(self.faults, self.store,
                                             lambda: SECURITY_GROUP not in self.hidden_groups))
        self.incluster = InCluster(self.store, lambda: (self._address[0], self.port), self._serve)
        """Pods' tokens and their way to the API (:mod:`incluster`)."""
        self.kubelet: Kubelet | None = None
        """With ``run_pods``: runs scheduled pods' containers on this machine (see kubelet.py); else None."""
        self._pod_root: Path | None = None
        if run_pods:
            self._pod_root = Path(tempfile.mkdtemp(prefix="fakekube-pods-"))
            secrets = by_kind("Secret")
            config_maps = by_kind("ConfigMap")
            self.kubelet = Kubelet(self._pod_root, lambda: self.controller.reconcile(), restart_backoff, pod_network,
                                   lambda namespace, name: self.store.get(secrets, namespace, name), self.incluster,
                                   lambda namespace, name: self.store.get(config_maps, namespace, name))
        self.controller = Controller(self.store, self.api, self.faults, self.failures, ready_delay, resync_seconds,
                                     self.kubelet)
        if self.kubelet is not None:
            self.api.pod_deleter = self.controller.delete_pod
        self.schedulers = self.controller.schedulers
        self.pod_webhooks = self.api.admission.pod_webhooks
        self.stopping = False
        self._address = (host, port)
        self._httpd: _HTTPSServer | None = None
        self._thread: threading.Thread | None = None
        for namespace in dict.fromkeys(namespaces):
            self.add_namespace(namespace)
        for index, node in enumerate(nodes):
            spec = NodeSpec(node, gpus_per_node) if isinstance(node, str) else node
            self.add_node(dataclasses.replace(spec, ip=spec.ip or f"10.0.{index // 240}.{index % 240 + 10}"))
        for obj in [*storage_classes, *(seeds.DEFAULT_SCCS if openshift else ())]:
            self.add(obj)

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

    def _serve(self, listening: socket.socket) -> Callable[[], None]:
        """Serve the API on ``listening`` too (in a pod's network namespace); returns what stops that."""
        httpd = _HTTPSServer(listening.getsockname(), self, listening)
        thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), name="fakekube-http-pod", daemon=True)
        thread.start()

        def stop() -> None:
            httpd.shutdown()
            httpd.server_close()
            thread.join()
        return stop

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
        if self.kubelet is not None and self._pod_root is not None:
            self.kubelet.shutdown()
            shutil.rmtree(self._pod_root, ignore_errors=True)

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
        """The CA of the server's certificate, base64, for a kubeconfig."""
        return base64.b64encode(CA.read_bytes()).decode()

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

    # --- convenience for tests (as a cluster admin would; ``reconcile()`` makes pods react at once) -----------

    def add(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store any object (from :mod:`seeds` or hand-written), with its ``status`` if it has one."""
        rt = resource_type(obj["kind"])
        saved = self.api.save(rt, obj, None)
        if rt.has_status and obj.get("status"):
            saved = self.store.update(rt, {**saved, "status": copy.deepcopy(obj["status"])})
        return saved

    def remove(self, resource: str, name: str, namespace: str = "") -> None:
        """Delete an object at once (``remove("storageclass", "nfs-csi")``); NotFound if absent."""
        self.store.delete(resource_type(resource), namespace, name)

    def add_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
        """Create a namespace, e.g. with ``{"pod-security.kubernetes.io/enforce": "restricted"}``."""
        return self.add({"kind": "Namespace", "metadata": {"name": name, "labels": dict(labels or {})}})

    def set_namespace_labels(self, name: str, labels: Mapping[str, str | None]) -> None:
        """Set (or, with None, remove) labels of a namespace."""
        namespace = copy.deepcopy(self.store.require(by_kind("Namespace"), "", name))
        current = namespace["metadata"].setdefault("labels", {})
        for key, value in labels.items():
            if value is None:
                current.pop(key, None)
            else:
                current[key] = value
        self.store.update(by_kind("Namespace"), namespace)

    def add_node(self, node: str | NodeSpec, **fields: Any) -> dict[str, Any]:
        """Add a node: a :class:`NodeSpec`, or a name and NodeSpec fields (``add_node("gpu-9", gpus=4)``)."""
        spec = NodeSpec(node, **fields) if isinstance(node, str) else node
        ip = spec.ip or f"10.0.1.{len(self.store.list(by_kind('Node'))) + 10}"
        return self.add(seeds.node(spec, ip))

    def set_node(self, name: str, *, ready: bool | None = None, unschedulable: bool | None = None) -> None:
        """Make a node Ready or not (its condition and the not-ready taint), cordon or uncordon it."""
        node = copy.deepcopy(self.store.require(by_kind("Node"), "", name))
        spec = node.setdefault("spec", {})
        if ready is not None:
            node["status"]["conditions"] = seeds.node_conditions(ready)
            taints = [t for t in spec.pop("taints", None) or [] if t != seeds.NOT_READY_TAINT]
            taints += [] if ready else [seeds.NOT_READY_TAINT]
            if taints:
                spec["taints"] = taints
        if unschedulable is not None:
            spec.pop("unschedulable", None)
            if unschedulable:
                spec["unschedulable"] = True
        self.store.update(by_kind("Node"), node)

    def objects(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Stored objects by resource name (``pods``, ``sts``, ``Event``...), in one namespace or all."""
        return self.store.list(resource_type(resource), namespace)

    def reconcile(self) -> None:
        """Run the controllers now (after flipping a fault switch, instead of waiting for the resync)."""
        self.controller.reconcile()
