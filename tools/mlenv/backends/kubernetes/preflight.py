"""Before touching a cluster: is the CLI pointed at the cluster the file names, logged in, and may it use the
namespace? Also turns access failures of any later call into plain words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from mlenv.backends.kubernetes.client import Client, KubeError
from mlenv.config.model import Cluster
from mlenv.errors import OperationError

DEFAULT_API_PORT = 6443


def _split(address: str) -> tuple[str, int | None]:
    """(host, explicit port or None) of ``api.example.com``, ``https://api.example.com:6443`` & co."""
    parts = urlsplit(address if "://" in address else f"https://{address}")
    return (parts.hostname or "").lower(), parts.port


def same_server(api: str, server: str) -> bool:
    """Whether kubeconfig ``server`` is the cluster file's ``api`` (scheme, default port and ``api.`` tolerated)."""
    (api_host, api_port), (host, port) = _split(api), _split(server)
    if host not in (api_host, f"api.{api_host}"):
        return False
    return api_port is None or port is None or api_port == port


def login_url(cluster: Cluster) -> str:
    """``https://HOST:6443`` for ``oc login --server=``."""
    api = cluster.info.api or ""
    host, port = _split(api)
    return f"https://{host}:{port or DEFAULT_API_PORT}"


def login_hint(cluster: Cluster) -> str:
    """How to log in to the cluster."""
    if not cluster.info.api:
        return "log in (oc login --server=https://API:6443) or pick the right kubeconfig context"
    return f"log in with: oc login --server={login_url(cluster)} (or a kubeconfig context for it)"


def _current_server(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """(current context, its cluster's server) from ``config view -o json``."""
    current = config.get("current-context") or None
    contexts = {c.get("name"): c.get("context") or {} for c in config.get("contexts") or []}
    clusters = {c.get("name"): c.get("cluster") or {} for c in config.get("clusters") or []}
    cluster_name = contexts.get(current, {}).get("cluster")
    return current, clusters.get(cluster_name, {}).get("server")


def _contexts_for(config: dict[str, Any], api: str) -> list[str]:
    clusters = {c.get("name"): (c.get("cluster") or {}).get("server", "") for c in config.get("clusters") or []}
    return [c["name"] for c in config.get("contexts") or []
            if same_server(api, clusters.get((c.get("context") or {}).get("cluster"), ""))]


def check_server(client: Client, cluster: Cluster) -> None:
    """The CLI's current context must point at ``cluster.api`` (skipped when the file names no api)."""
    if not cluster.info.api:
        return
    config = json.loads(client.run("config", ["view", "-o", "json"], namespaced=False) or "{}")
    current, server = _current_server(config)
    if server and same_server(cluster.info.api, server):
        return
    where = f"context {current} points at {server}" if current else "there is no current kubeconfig context"
    others = _contexts_for(config, cluster.info.api)
    fix = (f"switch with: {client.flavour} config use-context {others[0]}" if others else login_hint(cluster))
    raise OperationError(f"{cluster.source} is for {cluster.info.api} but {where}: {fix}")


def check_login(client: Client, cluster: Cluster) -> str:
    """The user the CLI is logged in as (an authenticated call); OperationError with the login command if none."""
    if client.flavour == "kubectl":
        verb, args = "auth", ["whoami", "-o", "jsonpath={.status.userInfo.username}"]
    else:
        verb, args = "whoami", []
    with explained(cluster):
        return client.run(verb, args, namespaced=False).strip()


def check_namespace(client: Client, cluster: Cluster, user: str) -> None:
    """The namespace must exist and be usable by ``user``."""
    namespace, who = cluster.info.namespace, user or "USER"
    if cluster.backend == "openshift":
        create, grant = f"oc new-project {namespace}", f"oc adm policy add-role-to-user edit {who} -n {namespace}"
    else:
        create = f"kubectl create namespace {namespace}"
        grant = f"kubectl create rolebinding {who}-edit --clusterrole=edit --user={who} -n {namespace}"
    try:
        client.run("get", ["namespace", namespace, "-o", "name"], namespaced=False)
        return
    except KubeError as exc:
        if exc.reason == "NotFound":
            raise OperationError(f"namespace {namespace} does not exist: {create}") from None
        if exc.reason != "Forbidden":
            raise
    # Namespaces are cluster-scoped: a project member may not read the object but still work in it.
    try:
        client.run("auth", ["can-i", "create", "statefulsets.apps", "-n", namespace], namespaced=False)
    except KubeError:
        raise OperationError(f"namespace {namespace} does not exist or {user or 'you'} may not use it: "
                             f"create it ({create}) or ask its admin for access ({grant})") from None


@contextmanager
def explained(cluster: Cluster) -> Iterator[None]:
    """Re-raise access failures (not logged in, unreachable, forbidden) of CLI calls in plain words."""
    try:
        yield
    except KubeError as exc:
        words = {
            "Unauthorized": f"not logged in to {cluster.info.api or 'the cluster'} (the credentials were "
                            f"rejected or have expired): {login_hint(cluster)}",
            "Unreachable": f"cannot reach the API server of {cluster.info.name}: {exc.detail}",
            "Forbidden": f"not allowed in namespace {cluster.info.namespace}: {exc.detail}",
        }.get(exc.reason, exc.detail)
        raise OperationError(words) from None
