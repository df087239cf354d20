"""Before touching a cluster: is the CLI pointed at the cluster the file names, logged in, may it use the namespace
and create every kind mlenv applies; do the Multus networks and node resources the pods ask for exist? Each
answer is a Check (PASS/WARN/FAIL, evidence, fix); nothing stops at the first failure. Also turns access failures
of any later call into plain words."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from decimal import Decimal
from urllib.parse import urlsplit

from mlenv.backends.kubeapi.client import Client, KubeError
from mlenv.backends.kubeapi.kubeconfig import ContextEntry, Kubeconfig, KubeconfigError, Server, merged
from mlenv.backends.kubeapi.naming import KubeHandle
from mlenv.config.quantity import QuantityError, parse_quantity
from mlenv.core.capabilities import Check
from mlenv.errors import MlenvError, OperationError

DEFAULT_API_PORT = 6443
PLURALS = {"serviceaccount": "serviceaccounts", "persistentvolumeclaim": "persistentvolumeclaims",
           "service": "services", "networkpolicy": "networkpolicies.networking.k8s.io",
           "statefulset": "statefulsets.apps"}
"""``auth can-i`` resource names of the kinds mlenv creates."""


def _split(address: str) -> tuple[str, int | None]:
    """(host, explicit port or None) of ``api.example.com``, ``https://api.example.com:6443`` & co."""
    parts = urlsplit(address if "://" in address else f"https://{address}")
    try:
        port = parts.port
    except ValueError:
        port = None
    return (parts.hostname or "").lower(), port


def same_server(api: str, server: str) -> bool:
    """Whether kubeconfig ``server`` is the cluster file's ``api`` (scheme, default port and ``api.`` tolerated)."""
    (api_host, api_port), (host, port) = _split(api), _split(server)
    if host not in (api_host, f"api.{api_host}"):
        return False
    return api_port is None or port is None or api_port == port


def login_url(api: str) -> str:
    """``https://HOST:6443`` for ``oc login --server=``."""
    host, port = _split(api)
    return f"https://{host}:{port or DEFAULT_API_PORT}"


def login_hint(target: KubeHandle, flavour: str) -> str:
    """How to log in to the cluster with the CLI in use."""
    if flavour == "oc":
        server = login_url(target.api) if target.api else "https://API:6443"
        return f"log in with: oc login --server={server} (or a kubeconfig context for it)"
    where = f" for {target.api}" if target.api else ""
    return f"get credentials{where} into your kubeconfig (kubectl config get-contexts lists them)"


def _current_server(config: Kubeconfig) -> tuple[str | None, str | None]:
    """(current context, its cluster's server) from the merged kubeconfig."""
    current = config["current-context"] or None
    return current, _servers(config).get(_clusters(config).get(current))


def _contexts_for(config: Kubeconfig, api: str) -> list[str]:
    servers, clusters = _servers(config), _clusters(config)
    return [name for name, cluster in clusters.items()
            if name is not None and same_server(api, servers.get(cluster) or "")]


def _clusters(config: Kubeconfig) -> dict[str | None, str | None]:
    """Context name -> its cluster's name."""
    return {c.get("name"): (c.get("context") or ContextEntry()).get("cluster") for c in config["contexts"]}


def _servers(config: Kubeconfig) -> dict[str | None, str | None]:
    """Cluster name -> its server."""
    return {c.get("name"): (c.get("cluster") or Server()).get("server") for c in config["clusters"]}


def check_server(client: Client, target: KubeHandle) -> Check:
    """The CLI's current context must point at the file's ``api`` (PASS when the file names none)."""
    if not target.api:
        return Check("server", "PASS", "the cluster file names no api: the current context is used")
    try:
        config = merged()
    except KubeconfigError as exc:
        return Check("server", "FAIL", f"cannot read the kubeconfig: {exc}", login_hint(target, client.flavour))
    current, server = _current_server(config)
    if server and same_server(target.api, server):
        return Check("server", "PASS", f"context {current} points at {server}")
    where = f"context {current} points at {server}" if current else "there is no current kubeconfig context"
    others = _contexts_for(config, target.api)
    fix = f"{client.flavour} config use-context {others[0]}" if others else login_hint(target, client.flavour)
    return Check("server", "FAIL", f"{target.cluster_file} is for {target.api} but {where}", fix)


def check_login(client: Client, target: KubeHandle) -> tuple[str | None, Check]:
    """(the user the CLI is logged in as, or None; the check), from one authenticated call."""
    if client.flavour == "kubectl":
        verb, args = "auth", ["whoami", "-o", "jsonpath={.status.userInfo.username}"]
    else:
        verb, args = "whoami", []
    try:
        user = client.run(verb, args, namespaced=False).strip()
    except KubeError as exc:
        return None, Check("login", "FAIL", _words(exc, target, client.flavour), login_hint(target, client.flavour))
    return user, Check("login", "PASS", f"logged in as {user or 'the current user'}")


def check_namespace(client: Client, target: KubeHandle, user: str | None) -> Check:
    """The namespace must exist (or at least be usable: project members may not read the object)."""
    namespace, who = target.namespace, user or "USER"
    if client.flavour == "oc":
        create, grant = f"oc new-project {namespace}", f"oc adm policy add-role-to-user edit {who} -n {namespace}"
    else:
        create = f"kubectl create namespace {namespace}"
        grant = f"kubectl create rolebinding {who}-edit --clusterrole=edit --user={who} -n {namespace}"
    try:
        client.run("get", ["namespace", namespace, "-o", "name"], namespaced=False)
        return Check("namespace", "PASS", f"namespace {namespace} exists")
    except KubeError as exc:
        if exc.reason == "NotFound":
            return Check("namespace", "FAIL", f"namespace {namespace} does not exist", create)
        if exc.reason != "Forbidden":
            return Check("namespace", "FAIL", _words(exc, target, client.flavour))
    if can_i(client, "create", "statefulsets.apps", namespace):
        return Check("namespace", "PASS", f"namespace {namespace} is usable (its object is not readable)")
    return Check("namespace", "FAIL", f"namespace {namespace} does not exist or {user or 'you'} may not use it",
                 f"{create}, or ask its admin: {grant}")


def can_i(client: Client, verb: str, resource: str, namespace: str, subresource: str | None = None) -> bool:
    """``auth can-i`` (exit 0 and "yes" when allowed)."""
    args = ["can-i", verb, resource, "-n", namespace, *([f"--subresource={subresource}"] if subresource else [])]
    try:
        return client.run("auth", args, namespaced=False).strip() == "yes"
    except KubeError:
        return False


def check_permissions(client: Client, target: KubeHandle, kinds: Sequence[str]) -> list[Check]:
    """``auth can-i create`` and ``delete`` for every kind mlenv creates."""
    checks = []
    for kind in kinds:
        resource = PLURALS.get(kind, f"{kind}s")
        denied = [verb for verb in ("create", "patch", "delete")
                  if not can_i(client, verb, resource, target.namespace)]
        if denied:
            checks.append(Check(f"may {'/'.join(denied)} {resource}", "FAIL",
                                f"{client.flavour} auth can-i {denied[0]} {resource} -n {target.namespace}: no",
                                f"ask the namespace admin for the edit role in {target.namespace}"))
        else:
            checks.append(Check(f"may create {resource}", "PASS", f"create, patch and delete allowed in "
                                                                  f"{target.namespace}"))
    return checks


def check_networks(client: Client, namespace: str, networks: Sequence[str]) -> list[Check]:
    """Every Multus network (``[namespace/]name[@interface]``) must be a NetworkAttachmentDefinition that exists."""
    checks = []
    for network in networks:
        where, _, name = network.partition("@")[0].rpartition("/")
        where = where or namespace
        args = ["network-attachment-definitions.k8s.cni.cncf.io", name, "-n", where, "-o", "name"]
        try:
            client.run("get", args, namespaced=False)
            checks.append(Check(f"network {network}", "PASS", f"NetworkAttachmentDefinition {where}/{name} exists"))
        except KubeError as exc:
            evidence = "does not exist" if exc.reason == "NotFound" else f"cannot be read: {exc.detail}"
            checks.append(Check(f"network {network}", "WARN" if exc.reason == "Forbidden" else "FAIL",
                                f"NetworkAttachmentDefinition {where}/{name} {evidence}",
                                f"{client.flavour} get network-attachment-definitions -A lists them; fix "
                                "network.rdma.networks"))
    return checks


def _amount(value: object) -> Decimal:
    """A node's allocatable amount, normalized (``8``, not ``8.000000000``); 0 when unreadable."""
    try:
        return parse_quantity(str(value)).normalize()
    except QuantityError:
        return Decimal(0)


def check_allocatable(client: Client, wanted: Mapping[str, int]) -> list[Check]:
    """Some schedulable node must have each resource allocatable in the amount one pod asks for (one list call);
    a WARN when nodes cannot be listed (many users may not)."""
    if not wanted:
        return []
    try:
        nodes = [n for n in client.nodes() if not (n.get("spec") or {}).get("unschedulable")]
    except KubeError as exc:
        return [Check("node resources", "WARN", f"cannot list nodes ({exc.detail}): {', '.join(wanted)} not checked")]
    checks = []
    for resource, amount in wanted.items():
        have = {n["metadata"]["name"]: _amount(((n.get("status") or {}).get("allocatable") or {}).get(resource, 0))
                for n in nodes}
        enough = sorted(name for name, count in have.items() if count >= amount)
        most = max(have.values(), default=Decimal(0))
        if enough:
            checks.append(Check(f"resource {resource}", "PASS",
                                f"{len(enough)} of {len(nodes)} nodes have {amount} {resource} allocatable "
                                f"({', '.join(enough[:3])}{' ...' if len(enough) > 3 else ''})"))
        else:
            checks.append(Check(f"resource {resource}", "FAIL",
                                f"no schedulable node has {amount} {resource} allocatable (most: {most:f})",
                                f"ask the cluster admin which resources the nodes offer "
                                f"({client.flavour} describe nodes), or ask for less per pod"))
    return checks


def preflight(client: Client, target: KubeHandle, kinds: Sequence[str] = ()) -> tuple[str | None, list[Check]]:
    """Server, login, namespace and (with ``kinds``) permissions: (user, every check)."""
    server = check_server(client, target)
    user, login = check_login(client, target)
    checks = [server, login]
    if login.status == "PASS":
        checks.append(check_namespace(client, target, user))
        if checks[-1].status == "PASS":
            checks += check_permissions(client, target, kinds)
    return user, checks


def require(checks: Sequence[Check], error: type[MlenvError] = OperationError) -> None:
    """``error`` (OperationError unless said) listing every failed check (with its fix), if any."""
    failed = [c for c in checks if c.status == "FAIL"]
    if failed:
        raise error("\n".join(f"{c.evidence}" + (f": {c.fix}" if c.fix else "") for c in failed))


def _words(exc: KubeError, target: KubeHandle, flavour: str) -> str:
    return {
        "Unauthorized": f"not logged in to {target.api or 'the cluster'} (the credentials were rejected or have "
                        f"expired): {login_hint(target, flavour)}",
        "Unreachable": f"cannot reach the API server of {target.cluster_name}: {exc.detail}",
        "Forbidden": f"not allowed in namespace {target.namespace}: {exc.detail}",
    }.get(exc.reason, exc.detail)


@contextmanager
def explained(target: KubeHandle, flavour: str) -> Iterator[None]:
    """Re-raise access failures (not logged in, unreachable, forbidden) of CLI calls in plain words."""
    try:
        yield
    except KubeError as exc:
        raise OperationError(_words(exc, target, flavour)) from None
