"""HTTP: authentication, routing of Kubernetes REST paths onto the verbs, JSON in and out, watch streams."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

import yaml

from . import errors, openapi, resources, tables
from .api import APPLY, PATCHERS, list_document, success_status
from .errors import ApiError
from .requestlog import RequestRecord
from .resources import ResourceType
from .selectors import labels_match, parse_field_selector, parse_label_selector

if TYPE_CHECKING:
    from .server import FakeKube

UNAUTHENTICATED_PATHS = ("/version", "/healthz", "/livez", "/readyz")
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch"}
WATCH_POLL_SECONDS = 0.5


@dataclass
class Route:
    """What a resource URL names."""

    rt: ResourceType
    namespace: str = ""
    name: str = ""
    subresource: str = ""
    verb: str = ""
    query: dict[str, str] = field(default_factory=dict)


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


def _route(path: str, method: str, query: dict[str, str]) -> Route:
    """Map ``/api/v1/namespaces/ns/pods/name/log`` & co. onto a Route; NotFound for anything else."""
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
    if rt is None or len(rest) > 3 or (rt.namespaced and len(rest) > 1 and not namespace):
        raise errors.path_not_found()
    route = Route(rt, namespace, rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else "", "", query)
    if method == "GET":
        route.verb = "get" if route.name else ("watch" if query.get("watch") in ("true", "1") else "list")
    elif method == "DELETE":
        route.verb = "delete" if route.name else "deletecollection"
    else:
        route.verb = VERBS.get(method, "")
    if route.verb not in rt.verbs or (route.verb == "create" and route.name):
        raise errors.method_not_allowed()
    return route


class Handler(BaseHTTPRequestHandler):
    """Serves one connection of the fake API server (``self.server.fake`` is the FakeKube)."""

    protocol_version = "HTTP/1.1"
    server_version = "fakekube"
    disable_nagle_algorithm = True  # headers and body go out in two writes; do not wait 40 ms between them

    @property
    def fake(self) -> FakeKube:
        """The FakeKube this handler serves."""
        return self.server.fake  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
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
        record = {"method": self.command, "path": url.path, "query": query,
                  "user_agent": self.headers.get("User-Agent", "")}
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status = 500
        try:
            self._authenticate(url.path)
            if self._discovery(url.path, record):
                status = 200
                return
            route = _route(url.path, self.command, query)
            record.update(verb=route.verb, resource=route.rt.plural, namespace=route.namespace, name=route.name)
            status = self._resource(route, raw)
        except ApiError as exc:
            status = exc.code
            self._send_json(exc.code, exc.status())
        finally:
            self.fake.requests.append(RequestRecord(status=status, **record))

    def _authenticate(self, path: str) -> None:
        header = self.headers.get("Authorization")
        if header is None and path in UNAUTHENTICATED_PATHS:
            return
        if header != f"Bearer {self.fake.token}":
            raise errors.unauthorized()

    def _discovery(self, path: str, record: dict[str, Any]) -> bool:
        """Answer /version, /healthz, /api, /apis, /apis/<g>, /apis/<g>/<v>, /openapi; False if not one of them."""
        document: Any
        if path == "/version":
            document = resources.SERVER_VERSION
        elif path in UNAUTHENTICATED_PATHS:
            self._send(200, b"ok", "text/plain")
            record["verb"] = "discovery"
            return True
        elif path == "/api":
            document = resources.api_versions(f"{self.server.server_address[0]}:{self.server.server_address[1]}")
        elif path == "/apis":
            document = resources.api_group_list()
        elif path == "/openapi/v3":
            document = openapi.root_document()
        elif path.startswith("/openapi/v3/"):
            document = openapi.document_at(path)
            if document is None:
                raise errors.path_not_found()
        elif path.startswith("/openapi"):
            raise errors.path_not_found()
        else:
            parts = [p for p in path.split("/") if p]
            if parts == ["api", "v1"]:
                document = resources.resource_list("", "v1")
            elif parts[:1] == ["apis"] and len(parts) == 2:
                document = resources.api_group(parts[1])
            elif parts[:1] == ["apis"] and len(parts) == 3:
                document = resources.resource_list(parts[1], parts[2])
            else:
                return False
            if document is None:
                raise errors.path_not_found()
        json_ok, _ = _accepts(self.headers.get("Accept", ""))
        if not json_ok:
            raise errors.not_acceptable(self.headers.get("Accept", ""))
        record["verb"] = "discovery"
        self._send_json(200, document)
        return True

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, code: int, document: Any) -> None:
        self._send(code, json.dumps(document).encode(), "application/json")

    def _body(self, raw: bytes) -> Any:
        content_type = (self.headers.get("Content-Type") or "application/json").split(";")[0].strip()
        if "protobuf" in content_type or "cbor" in content_type:
            raise errors.unsupported_media_type(content_type)
        try:
            return yaml.safe_load(raw) if content_type == APPLY else json.loads(raw or b"null")
        except (ValueError, yaml.YAMLError) as exc:
            raise errors.bad_request(f"the request body could not be decoded: {exc}") from exc

    # --- resources ------------------------------------------------------------------------------------------

    def _authorize(self, route: Route) -> None:
        namespace = route.namespace or (route.name if route.rt.plural == "namespaces" else "")
        if namespace in self.fake.forbidden_namespaces:
            resource = f"{route.rt.plural}/{route.subresource}" if route.subresource else route.rt.plural
            why = (f'User "{self.fake.user}" cannot {route.verb} resource "{resource}" in API group '
                   f'"{route.rt.group}" in the namespace "{namespace}"')
            raise errors.forbidden(route.rt, route.name, why)

    def _resource(self, route: Route, raw: bytes) -> int:
        """Serve a resource request; return the HTTP status sent."""
        self._authorize(route)
        fake, api = self.fake, self.fake.api
        json_ok, table = _accepts(self.headers.get("Accept", ""))
        if not json_ok:
            raise errors.not_acceptable(self.headers.get("Accept", ""))
        rt, ns, name, verb = route.rt, route.namespace, route.name, route.verb
        if route.subresource:
            return self._subresource(route, raw)
        if verb == "watch":
            self._watch(route, table)
            return 200
        if verb in ("get", "list"):
            include = route.query.get("includeObject", "Metadata")
            with fake.store.lock:
                if verb == "get":
                    found = fake.store.require(rt, ns, name)
                    document = tables.table(rt, [found], fake.store.resource_version, include) if table else found
                else:
                    items = api.select(rt, ns or None, route.query)
                    version = fake.store.resource_version
                    document = tables.table(rt, items, version, include) if table else list_document(rt, items, version)
            self._send_json(200, document)
            return 200
        code, document = 200, None
        if rt.plural == "selfsubjectreviews":
            code, document = 201, api.self_subject_review(fake.user)
        elif rt.plural == "selfsubjectaccessreviews":
            code, document = 201, self._access_review(self._body(raw))
        elif verb == "create":
            code, document = 201, api.create(rt, ns, self._body(raw))
        elif verb == "update":
            document = api.replace(rt, ns, name, self._body(raw))
        elif verb == "patch":
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if content_type != APPLY and content_type not in PATCHERS:
                raise errors.unsupported_media_type(content_type)
            existed = fake.store.get(rt, ns, name) is not None
            document = api.patch(rt, ns, name, content_type, self._body(raw), route.query.get("fieldManager"))
            code = 200 if existed else 201
        elif verb in ("delete", "deletecollection"):
            document = self._delete(route, raw)
        fake.controller.reconcile()
        self._send_json(code, document)
        return code

    def _delete(self, route: Route, raw: bytes) -> dict[str, Any]:
        options = self._body(raw) or {}
        propagation = route.query.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
        api = self.fake.api
        if route.verb == "delete":
            return success_status(route.rt, api.delete(route.rt, route.namespace, route.name, propagation))
        with self.fake.store.lock:
            gone = [api.delete(route.rt, route.namespace, o["metadata"]["name"], propagation)
                    for o in api.select(route.rt, route.namespace or None, route.query)]
            return list_document(route.rt, gone, self.fake.store.resource_version)

    def _access_review(self, body: Any) -> dict[str, Any]:
        attributes = ((body or {}).get("spec") or {}).get("resourceAttributes") or {}
        namespace = attributes.get("namespace", "")
        if namespace in self.fake.forbidden_namespaces:
            return self.fake.api.self_subject_access_review(body, False, "")
        return self.fake.api.self_subject_access_review(body, True, "fakekube allows everything")

    def _subresource(self, route: Route, raw: bytes) -> int:
        api, ns, name = self.fake.api, route.namespace, route.name
        if (route.rt.plural, route.subresource) == ("statefulsets", "scale"):
            if route.verb == "get":
                document = api.get_scale(ns, name)
            else:
                content_type = None
                if route.verb == "patch":
                    content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                    if content_type not in PATCHERS:
                        raise errors.unsupported_media_type(content_type)
                document = api.update_scale(ns, name, content_type, self._body(raw))
                self.fake.controller.reconcile()
            self._send_json(200, document)
            return 200
        if (route.rt.plural, route.subresource, route.verb) == ("pods", "log", "get"):
            pod = self.fake.store.require(route.rt, ns, name)
            if (pod.get("status") or {}).get("phase") != "Running":
                container = route.query.get("container") or pod["spec"]["containers"][0].get("name", "")
                raise errors.bad_request(f'container "{container}" in pod "{name}" is waiting to start: '
                                         "ContainerCreating")
            self._send(200, self.fake.pod_logs.get((ns, name), "").encode(), "text/plain")
            return 200
        raise errors.path_not_found()

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
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
