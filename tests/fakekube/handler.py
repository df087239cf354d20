"""HTTP: authentication, routing of Kubernetes REST paths onto the verbs, JSON in and out, watch streams."""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

import yaml

from . import access, errors, openapi, protobuf, resources, streams, tables
from .api import APPLY, PATCHERS, list_document, success_status
from .errors import ApiError
from .requestlog import RequestRecord
from .resources import ResourceType
from .selectors import exact_name, labels_match, parse_field_selector, parse_label_selector

if TYPE_CHECKING:
    from .server import FakeKube

NAMESPACES = resources.by_kind("Namespace")
UNAUTHENTICATED_PATHS = ("/version", "/healthz", "/livez", "/readyz")
USERS = ResourceType("", "v1", "User", "users", False)
"""What impersonation is authorized on (not a served resource)."""
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}
WATCH_POLL_SECONDS = 0.5
HOLD_SECONDS = 60.0
"""The longest a held request waits for its release (FakeKube.held)."""
CLIENT_GONE = 499
"""Logged status of a request whose client hung up before the answer (nginx's convention)."""


@dataclass
class Route:
    """What a resource URL names."""

    rt: ResourceType
    namespace: str = ""
    name: str = ""
    subresource: str = ""
    verb: str = ""
    query: dict[str, str] = field(default_factory=dict)


def as_project(namespace: dict[str, Any]) -> dict[str, Any]:
    """A namespace as the OpenShift Project that shows it."""
    return {**namespace, "apiVersion": "project.openshift.io/v1", "kind": "Project"}


def _accepts(header: str) -> tuple[bool, bool]:
    """(JSON acceptable, Table wanted) for an Accept header."""
    json_ok = table = False
    for part in (header or "*/*").split(","):
        base, *params = (p.strip() for p in part.split(";"))
        options = dict(p.split("=", 1) for p in params if "=" in p)
        if base not in ("application/json", "application/*", "*/*"):
            continue
        if options.get("as") == "Table":
            table = True
        elif "as" not in options:
            json_ok = True
    return json_ok or table, table


def _route(path: str, method: str, query: dict[str, str], hidden: AbstractSet[str]) -> Route:
    """Map ``/api/v1/namespaces/ns/pods/name/log`` & co. onto a Route; NotFound for anything else, and for
    the ``hidden`` API groups."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise errors.path_not_found()
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        nested = resources.lookup(group, version, rest[2])
        if nested and nested.namespaced:
            namespace, rest = rest[1], rest[2:]
    rt = resources.lookup(group, version, rest[0]) if rest else None
    if rt is None or rt.group in hidden or len(rest) > 3 or (rt.namespaced and len(rest) > 1 and not namespace):
        raise errors.path_not_found()
    route = Route(rt, namespace, rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else "", "", query)
    if method == "GET":
        route.verb = "get" if route.name else ("watch" if query.get("watch") in ("true", "1") else "list")
    elif method == "DELETE":
        route.verb = "delete" if route.name else "deletecollection"
    else:
        route.verb = VERBS.get(method, "")
    if route.verb not in rt.verbs or (route.verb == "create" and route.name and not route.subresource):
        raise errors.method_not_allowed()
    return route


class Handler(BaseHTTPRequestHandler):
    """Serves one connection of the fake API server (``self.server.fake`` is the FakeKube)."""

    protocol_version = "HTTP/1.1"
    server_version = "fakekube"
    disable_nagle_algorithm = True  # headers and body go out in two writes; do not wait 40 ms between them
    _record: dict[str, Any] | None = None  # the request log entry of the request being served
    _account: str | None = None  # the ServiceAccount a pod's token authenticated, None for the admin token

    @property
    def fake(self) -> FakeKube:
        """The FakeKube this handler serves."""
        return self.server.fake  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr access log; the request log records everything."""

    def do_GET(self) -> None:
        """GET."""
        self._serve()

    def do_POST(self) -> None:
        """POST."""
        self._serve()

    def do_PUT(self) -> None:
        """PUT."""
        self._serve()

    def do_PATCH(self) -> None:
        """PATCH."""
        self._serve()

    def do_DELETE(self) -> None:
        """DELETE."""
        self._serve()

    # --- plumbing -------------------------------------------------------------------------------------------

    def _serve(self) -> None:
        url = urlsplit(self.path)
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        self._record = {"method": self.command, "path": url.path, "query": query,
                        "user_agent": self.headers.get("User-Agent", "")}
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            self._authenticate(url.path)
            if self._discovery(url.path):
                self._log(200)
                return
            route = _route(url.path, self.command, query, self.fake.hidden_groups)
            self._record.update(verb=route.verb, resource=route.rt.plural, namespace=route.namespace,
                                name=route.name)
            self._log(self._resource(route, raw))
        except ApiError as exc:
            self._send_json(exc.code, exc.status())
            self._log(exc.code)
        except (ConnectionError, ssl.SSLEOFError):  # the client gave up on a held request, which was still done
            self._log(CLIENT_GONE)
        except Exception as exc:  # a bug in the fake: answer 500 and let the test fail
            self.fake.failures.append(f"{self.command} {self.path}: {exc!r}")
            self._send_json(500, ApiError(500, "InternalError", repr(exc)).status())
            self._log(500)
            raise

    def _log(self, status: int) -> None:
        """Add this request to the request log (once; a watch logs itself when its stream starts)."""
        if self._record is not None:
            self.fake.requests.append(RequestRecord(status=status, **self._record))
            self._record = None

    def _record_verb(self, verb: str) -> None:
        if self._record is not None:
            self._record["verb"] = verb

    def _authenticate(self, path: str) -> None:
        """The admin token (the kubeconfig's user), or a token the fake issued to a pod that still exists (its
        ServiceAccount, authorized by RBAC); 401 for anything else."""
        header = self.headers.get("Authorization")
        self._account = None
        if (header is None and path in UNAUTHENTICATED_PATHS) or header == f"Bearer {self.fake.token}":
            return
        token = header.removeprefix("Bearer ") if header and header.startswith("Bearer ") else None
        self._account = self.fake.incluster.user(token) if token is not None else None
        if self._account is None:
            raise errors.unauthorized()

    def _discovery(self, path: str) -> bool:
        """Answer /version, /healthz, /api, /apis, /apis/<g>, /apis/<g>/<v>, /openapi; False if not one of them."""
        document: Any
        if path == "/version":
            document = resources.SERVER_VERSION
        elif path in UNAUTHENTICATED_PATHS:
            self._send(200, b"ok", "text/plain")
            self._record_verb("discovery")
            return True
        elif path == "/api":
            document = resources.api_versions(self.fake.url.removeprefix("https://"))
        elif path == "/apis":
            document = resources.api_group_list(self.fake.hidden_groups)
        elif path == "/openapi/v3":
            document = openapi.root_document(self.fake.hidden_groups)
        elif path.startswith("/openapi/v3/"):
            document = openapi.document_at(path, self.fake.hidden_groups)
            if document is None:
                raise errors.path_not_found()
        elif path.startswith("/openapi"):
            raise errors.path_not_found()
        else:
            parts = [p for p in path.split("/") if p]
            hidden = self.fake.hidden_groups
            if parts == ["api", "v1"]:
                document = resources.resource_list("", "v1")
            elif parts[:1] == ["apis"] and len(parts) == 2:
                document = resources.api_group(parts[1], hidden)
            elif parts[:1] == ["apis"] and len(parts) == 3:
                document = resources.resource_list(parts[1], parts[2], hidden)
            else:
                return False
            if document is None:
                raise errors.path_not_found()
        json_ok, _ = _accepts(self.headers.get("Accept", ""))
        if not json_ok:
            raise errors.not_acceptable(self.headers.get("Accept", ""))
        self._record_verb("discovery")
        self._send_json(200, document)
        return True

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self._log(code)  # logged before the client can read the answer: a test that asks next sees the request
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, code: int, document: Any) -> None:
        self._send(code, json.dumps(document).encode(), "application/json")

    def _body(self, raw: bytes) -> Any:
        content_type = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        if content_type == "application/vnd.kubernetes.protobuf":
            return protobuf.decode(raw)
        if content_type not in ("application/json", APPLY, *PATCHERS):
            raise errors.unsupported_media_type(content_type)
        try:
            return yaml.safe_load(raw) if content_type == APPLY else json.loads(raw or b"null")
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"the request body could not be decoded: {exc}") from exc

    # --- resources ------------------------------------------------------------------------------------------

    def _user(self) -> str:
        """Who is asking: a pod's ServiceAccount, the admin token's user, or whom ``kubectl --as`` impersonates."""
        return self._account or self.headers.get("Impersonate-User") or self.fake.user

    def _allowed(self, request: access.Request, rbac: bool) -> bool:
        """The decision (:mod:`access`): RBAC (``rbac``: about a ServiceAccount that asked), else the admin
        model."""
        rules = None
        if rbac:  # RoleBindings grant in their namespace only (ClusterRoleBindings are not served)
            store, namespace = self.fake.store, request.namespace
            bindings = store.list(resources.by_kind("RoleBinding"), namespace) if namespace else []
            rules = access.granted_rules(request.user, bindings,
                                         lambda name: store.get(resources.by_kind("Role"), namespace, name))
        return access.allowed(request, self.fake.forbidden_namespaces, self.fake.denied, rules)

    def _authorize(self, route: Route) -> None:
        impersonated = self.headers.get("Impersonate-User")
        if self._account is not None and impersonated:  # a ServiceAccount needs RBAC's impersonate on users
            asked = access.Request(self._account, "impersonate", "", "users", name=impersonated)
            if not self._allowed(asked, rbac=True):
                raise errors.forbidden(USERS, impersonated, asked.refusal())
        namespace = route.namespace or (route.name if route.rt.plural in ("namespaces", "projects") else "")
        name = route.name
        if route.verb in ("list", "watch"):  # one object asked for by name (``kubectl get pod x -w``), as RBAC sees it
            name = exact_name(route.query.get("fieldSelector", ""))
        request = access.Request(self._user(), route.verb, route.rt.group, route.rt.plural, namespace, name,
                                 route.subresource)
        if not self._allowed(request, rbac=self._account is not None):
            raise errors.forbidden(route.rt, name, request.refusal())

    def _resource(self, route: Route, raw: bytes) -> int:
        """Serve a resource request; return the HTTP status sent."""
        self._authorize(route)
        release = self.fake.held.get((route.verb, route.rt.plural))
        if release is not None:
            self.fake.holding.set()
            release.wait(HOLD_SECONDS)
        json_ok, table = _accepts(self.headers.get("Accept", ""))
        if not json_ok:
            raise errors.not_acceptable(self.headers.get("Accept", ""))
        if route.subresource:
            return self._subresource(route, raw)
        if route.verb == "watch":
            self._watch(route, table)
            return 200
        if route.verb in ("get", "list"):
            self._send_json(200, self._read(route, table))
            return 200
        code, document = self._write(route, raw)
        self._send_json(code, document)
        return code

    def _read(self, route: Route, table: bool) -> dict[str, Any]:
        """GET one object or a list, as JSON or as a Table."""
        store, rt, name = self.fake.store, route.rt, route.name
        with store.lock:
            if rt.kind == "Project":
                items = [as_project(o) for o in self.fake.api.select(NAMESPACES, None, route.query)
                         if not name or o["metadata"]["name"] == name]
                if name and not items:
                    raise errors.not_found(rt, name)
            elif name:
                items = [store.require(rt, route.namespace, name)]
            else:
                items = self.fake.api.select(rt, route.namespace or None, route.query)
            version = store.resource_version
        if table:
            return tables.table(rt, items, version, route.query.get("includeObject", "Metadata"))
        return items[0] if name else list_document(rt, items, version)

    def _write(self, route: Route, raw: bytes) -> tuple[int, dict[str, Any]]:
        """POST, PUT, PATCH, DELETE; the controllers react before the answer goes out."""
        fake, api, rt, ns, name = self.fake, self.fake.api, route.rt, route.namespace, route.name
        if rt.plural == "selfsubjectreviews":
            return 201, access.self_subject_review(self._user())
        if rt.plural in ("selfsubjectaccessreviews", "subjectaccessreviews"):
            return 201, self._access_review(rt, self._body(raw))
        code, dry_run = 200, route.query.get("dryRun") == "All"
        if route.verb == "create":
            code, document = 201, api.create(rt, ns, self._body(raw), dry_run)
        elif route.verb == "update":
            document = api.replace(rt, ns, name, self._body(raw), dry_run)
        elif route.verb == "patch":
            document, created = api.patch(rt, ns, name, self._patch_type(), self._body(raw),
                                          route.query.get("fieldManager"), dry_run)
            code = 201 if created else 200
        else:
            document = self._delete(route, raw, dry_run)
        fake.controller.reconcile()
        return code, document

    def _patch_type(self) -> str:
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if content_type != APPLY and content_type not in PATCHERS:
            raise errors.unsupported_media_type(content_type)
        return content_type

    def _delete(self, route: Route, raw: bytes, dry_run: bool) -> dict[str, Any]:
        options = self._body(raw) or {}
        propagation = route.query.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
        dry_run = dry_run or options.get("dryRun") == ["All"]
        grace = route.query.get("gracePeriodSeconds") or options.get("gracePeriodSeconds")
        grace = None if grace is None else float(grace)
        api = self.fake.api
        if route.verb == "delete":
            return success_status(route.rt, api.delete(route.rt, route.namespace, route.name, propagation, dry_run,
                                                       grace))
        with self.fake.store.lock:
            gone = [api.delete(route.rt, route.namespace, o["metadata"]["name"], propagation, dry_run, grace)
                    for o in api.select(route.rt, route.namespace or None, route.query)]
            return list_document(route.rt, gone, self.fake.store.resource_version)

    def _access_review(self, rt: ResourceType, body: Any) -> dict[str, Any]:
        """Answer a SelfSubjectAccessReview (about the caller) or a SubjectAccessReview (about ``spec.user``)."""
        spec = (body.get("spec") if isinstance(body, dict) else None) or {}
        about_caller = rt.kind != "SubjectAccessReview"
        user = self._user() if about_caller else spec.get("user", "")
        request = access.Request.from_review(user, spec.get("resourceAttributes") or {})
        return access.review(rt, body, self._allowed(request, rbac=about_caller and self._account is not None))

    def _subresource(self, route: Route, raw: bytes) -> int:
        api, ns, name = self.fake.api, route.namespace, route.name
        if (route.rt.plural, route.subresource) == ("statefulsets", "scale"):
            if route.verb == "get":
                document = api.get_scale(ns, name)
            else:
                content_type = self._patch_type() if route.verb == "patch" else None
                document = api.update_scale(ns, name, content_type, self._body(raw))
                self.fake.controller.reconcile()
            self._send_json(200, document)
            return 200
        if (route.rt.plural, route.subresource, route.verb) == ("pods", "eviction", "create"):
            return self._evict(route, raw)
        if (route.rt.plural, route.subresource) == ("pods", "exec") and self.fake.kubelet is not None:
            return self._exec(self.fake.store.require(route.rt, ns, name), route)
        if (route.rt.plural, route.subresource, route.verb) == ("pods", "log", "get"):
            pod = self.fake.store.require(route.rt, ns, name)
            if self.fake.kubelet is not None and self._kubelet_log(pod, route):
                return 200
            status = pod.get("status") or {}
            if status.get("phase") != "Running":
                container = route.query.get("container") or pod["spec"]["containers"][0].get("name", "")
                waiting = [(s.get("state") or {}).get("waiting", {}).get("reason")
                           for s in status.get("containerStatuses") or [] if s.get("name") == container]
                why = "trying and failing to pull image" if waiting == ["ImagePullBackOff"] else "ContainerCreating"
                raise errors.bad_request(f'container "{container}" in pod "{name}" is waiting to start: {why}')
            self._send(200, self.fake.pod_logs.get((ns, name), "").encode(), "text/plain")
            return 200
        raise errors.path_not_found()

    def _evict(self, route: Route, raw: bytes) -> int:
        """POST pods/NAME/eviction (``kubectl drain``): a graceful deletion of the pod (its grace period, or the
        Eviction's deleteOptions'); no PodDisruptionBudget here refuses one. 201 and a Success Status, as the real
        server answers."""
        eviction = self._body(raw) or {}
        options = eviction.get("deleteOptions") or {}
        grace = options.get("gracePeriodSeconds")
        self.fake.api.delete(route.rt, route.namespace, route.name, options.get("propagationPolicy") or "Background",
                             options.get("dryRun") == ["All"] or route.query.get("dryRun") == "All",
                             None if grace is None else float(grace))
        self.fake.controller.reconcile()
        self._send_json(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                              "code": 201})
        return 201

    # --- pods the kubelet runs: exec and logs -----------------------------------------------------------------

    def _container(self, pod: dict[str, Any], route: Route) -> str:
        """The container a request names (default: the first); BadRequest for one the pod does not have."""
        names = [c.get("name", "") for c in pod["spec"].get("containers") or []]
        wanted = route.query.get("container") or names[0]
        if wanted not in names:
            raise errors.bad_request(f"container {wanted} is not valid for pod {pod['metadata']['name']}")
        return wanted

    def _exec(self, pod: dict[str, Any], route: Route) -> int:
        """``pods/exec`` over a WebSocket (v5/v4 channel protocol); 400 before the upgrade when the container does
        not run, as the kubelet answers (kubectl then says ``unable to upgrade connection: ...``)."""
        assert self.fake.kubelet is not None
        name = self._container(pod, route)
        container = self.fake.kubelet.running(pod["metadata"]["uid"], name)
        if container is None:
            raise errors.bad_request(f'container not found ("{name}")')
        if self.headers.get("Upgrade", "").lower() != "websocket":
            raise errors.bad_request("fakekube serves exec over WebSocket (v5.channel.k8s.io) only, not SPDY")
        protocol = streams.choose_protocol(self.headers.get("Sec-WebSocket-Protocol", ""))
        if protocol is None:
            raise errors.bad_request(f"none of the offered subprotocols is served: {list(streams.PROTOCOLS)}")
        flags = {k: route.query.get(k) in ("true", "1") for k in ("stdin", "stdout", "stderr", "tty")}
        command = [v for k, v in parse_qsl(urlsplit(self.path).query) if k == "command"]
        if not command:
            raise errors.bad_request("you must specify at least 1 command")
        self.send_response(101)
        for key, value in streams.handshake_headers(self.headers.get("Sec-WebSocket-Key", ""), protocol).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.flush()
        self._log(101)
        session = streams.ExecSession(self.rfile, self.wfile, protocol,  # type: ignore[arg-type]
                                      lambda: self.connection.shutdown(socket.SHUT_RDWR))
        session.run(container.exec_argv(command), command, stdin=flags["stdin"], stdout=flags["stdout"],
                    stderr=flags["stderr"], tty=flags["tty"])
        self.close_connection = True
        return 101

    def _kubelet_log(self, pod: dict[str, Any], route: Route) -> bool:
        """Serve ``pods/log`` from the container's real output (``follow``: until it ends); False when the
        container never started (the caller says why)."""
        assert self.fake.kubelet is not None
        name = self._container(pod, route)
        found = self.fake.kubelet.log(pod["metadata"]["uid"], route.query.get("previous") in ("true", "1"), name)
        if found is None:
            return False
        path, ended = found
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            streams.stream_log(chunk, path, ended, route.query.get("follow") in ("true", "1"))
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True
        return True

    # --- watch ----------------------------------------------------------------------------------------------

    def _watch(self, route: Route, table: bool) -> None:
        """Stream watch events as chunked JSON lines until timeoutSeconds, the client leaves, or the server stops."""
        store, rt = self.fake.store, route.rt
        requirements = parse_label_selector(route.query.get("labelSelector", ""))
        field_match = parse_field_selector(route.query.get("fieldSelector", ""))
        deadline = time.monotonic() + float(route.query.get("timeoutSeconds") or 1800)
        include = route.query.get("includeObject", "Metadata")

        def wanted(obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            return ((not route.namespace or meta.get("namespace") == route.namespace)
                    and labels_match(requirements, meta.get("labels")) and field_match(obj))

        since = route.query.get("resourceVersion", "")
        with store.lock:
            last = int(store.resource_version)
            pending = [] if since not in ("", "0") else [
                ("ADDED", o) for o in self.fake.api.select(rt, route.namespace or None, route.query)]
            if since not in ("", "0"):
                last = int(since)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._log(200)
        try:
            while True:
                for kind, obj in pending:
                    document = tables.table(rt, [obj], obj["metadata"]["resourceVersion"], include) if table else obj
                    line = json.dumps({"type": kind, "object": document}).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
                if self.fake.stopping or time.monotonic() > deadline:
                    break
                with store.changed:
                    changes = store.changes_since(last)
                    if not changes:
                        store.changed.wait(WATCH_POLL_SECONDS)
                        changes = store.changes_since(last)
                if changes:
                    last = changes[-1].resource_version
                pending = [(c.type, c.object) for c in changes if c.resource is rt and wanted(c.object)]
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client went away (broken pipe, reset, TLS EOF)
            self.close_connection = True
