"""The mover: the one process of a pod that may change its StatefulSet (``scheduling.move_faulty_pods``).

It runs in a container of its own (the pod template's ``mover``: another uid, no capabilities, a read-only root, no
shared process namespace), the only one that mounts the pod's ServiceAccount token (a projected volume): the
training container has none. Node 0's supervisor writes its verdict as :data:`REQUEST` in a memory volume both
containers mount (runtime/supervise/kubemove.py); the mover checks it (:func:`parse_request`: the run, the
attempt, the left-out nodes' ordinals and reasons, and the variables :data:`HANDED` with values of their shape,
nothing else), keeps the StatefulSet's pods off the Kubernetes nodes those pods run on (a required node affinity
``NotIn``, the other expressions kept: :func:`affinity_patch`) and records the move in mlenv's own annotations, in
one merge patch that it makes itself; its answer is :data:`ANSWER`. Anything else in a request is refused, and no
request can name another object, field or value. Standard library only, self-contained: the pod template carries
this file's source (:func:`command`), never the workspace's copy, which the training container could rewrite.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HOSTNAME_LABEL = "kubernetes.io/hostname"
LEFT_OUT_ANNOTATION = "mlenv.io/left-out"
LEFT_OUT_UNRECORDED = "mlenv.io/left-out-unrecorded"
"""runtime/records/runlayout.py's (this file cannot import it; a unit test checks they agree)."""
REQUEST, ANSWER = "request.json", "answer.json"
"""The verdict node 0's supervisor writes, the mover's answer: files of the volume both containers mount."""
HANDED = {"MLENV_FAILED_FIRST": re.compile(r"[\w.:@-]*(,[\w.:@-]*)*", re.ASCII),
          "MLENV_LAST_ERROR": re.compile(r"[^\x00-\x1f\x7f]*")}
"""The only variables a move hands the resumed attempt (restartpolicy.History.environ), and the shape of their
values: names of who failed first, comma-joined, and one line of error text."""
MAX_TEXT = 2000
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)
MAX_NODE = 10_000
POLL_SECONDS = 0.5
TIMEOUT = 10.0


class MoveRefused(Exception):
    """A request the mover does not carry out, or an API answer it could not: what it says."""


def handed_env(env: object) -> dict[str, str] | None:
    """``env`` as the variables a move may hand on: only :data:`HANDED`, strings of their shape; None otherwise."""
    if not isinstance(env, dict):
        return None
    for name, value in env.items():
        shape = HANDED.get(name)
        if shape is None or not isinstance(value, str) or len(value) > MAX_TEXT or not shape.fullmatch(value):
            return None
    return dict(env)


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT or not HANDED["MLENV_LAST_ERROR"].fullmatch(value):
        raise MoveRefused(f"{what} is not one line of text")
    return value


@dataclass(frozen=True)
class RequestedNode:
    """A node the request leaves out: its number, why, and whether that is saved (a node-fault sign)."""

    node: int
    reason: str
    saved: bool


@dataclass(frozen=True)
class MoveRequest:
    """A checked verdict of node 0's supervisor: its id, the run and attempt, the nodes left out, and the variables
    the move hands the next attempt."""

    id: str
    run: str
    attempt: int
    nodes: tuple[RequestedNode, ...]
    env: dict[str, str]


@dataclass(frozen=True)
class MoveAnswer:
    """The mover's answer to a request (None: one it could not read): the nodes kept off, or why not."""

    id: str | None
    away: list[str] | None = None
    error: str | None = None

    def to_json(self) -> dict[str, object]:
        """``{"id", "away"}`` or ``{"id", "error"}``."""
        return {"id": self.id, **({"away": self.away} if self.error is None else {"error": self.error})}


def parse_request(text: str) -> MoveRequest:
    """A verdict as the supervisor writes it: ``{"id", "run", "attempt", "nodes": [{"node", "reason", "saved"}],
    "env"}`` and nothing else; MoveRefused, saying what is wrong, for anything else."""
    try:
        request = json.loads(text)
    except ValueError:
        raise MoveRefused("the request is not JSON") from None
    if not isinstance(request, dict) or set(request) != {"id", "run", "attempt", "nodes", "env"}:
        raise MoveRefused("the request has other fields than id, run, attempt, nodes, env")
    if not isinstance(request["run"], str) or not RUN_ID.fullmatch(request["run"]):
        raise MoveRefused("the request's run is not a run id")
    if type(request["attempt"]) is not int or not 0 <= request["attempt"] < MAX_NODE:
        raise MoveRefused("the request's attempt is not an attempt number")
    _text(request["id"], "the request's id")
    nodes = request["nodes"]
    if not isinstance(nodes, list) or not nodes or len(nodes) > MAX_NODE:
        raise MoveRefused("the request's nodes are not a list of nodes")
    for entry in nodes:
        if not isinstance(entry, dict) or set(entry) != {"node", "reason", "saved"} or \
                type(entry["node"]) is not int or not 0 <= entry["node"] < MAX_NODE or \
                type(entry["saved"]) is not bool:
            raise MoveRefused("a node of the request is not {node, reason, saved}")
        _text(entry["reason"], "a node's reason")
    env = handed_env(request["env"])
    if env is None:
        raise MoveRefused(f"the request's env hands on other variables than {', '.join(HANDED)} or values of another "
                      "shape")
    return MoveRequest(request["id"], request["run"], request["attempt"],
                       tuple(RequestedNode(entry["node"], entry["reason"], entry["saved"]) for entry in nodes), env)


def _expressions(statefulset: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The match expressions of the pod template's first required node-affinity term."""
    affinity = ((statefulset.get("spec") or {}).get("template") or {}).get("spec", {}).get("affinity") or {}
    required = (affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or [{}]
    return list(terms[0].get("matchExpressions") or [])


def kept_off(statefulset: Mapping[str, Any]) -> list[str]:
    """The nodes the StatefulSet's pods are kept off now."""
    return sorted(value for expression in _expressions(statefulset)
                  if expression.get("key") == HOSTNAME_LABEL and expression.get("operator") == "NotIn"
                  for value in expression.get("values") or [])


def affinity_patch(statefulset: Mapping[str, Any], excluded: Sequence[str]) -> dict[str, Any] | None:
    """The merge patch that keeps the pods off ``excluded`` (and no other node), the other expressions kept; None
    when the StatefulSet says so already."""
    if kept_off(statefulset) == sorted(set(excluded)):
        return None
    others = [e for e in _expressions(statefulset)
              if not (e.get("key") == HOSTNAME_LABEL and e.get("operator") == "NotIn")]
    expressions = [*others, *([{"key": HOSTNAME_LABEL, "operator": "NotIn", "values": sorted(set(excluded))}]
                              if excluded else [])]
    node_affinity = ({"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": expressions}]}} if expressions else None)
    return {"spec": {"template": {"spec": {"affinity": {"nodeAffinity": node_affinity}}}}}


def _call(token_dir: Path, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One request to the in-cluster API with the ServiceAccount token of ``token_dir``; its JSON answer."""
    # imported here, for the mover alone: render, exclusion and kubemove import this module too, and ssl with
    # urllib.request costs about 22 ms of start-up (python -X importtime)
    import ssl
    import urllib.error
    import urllib.request

    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    try:
        token = (token_dir / "token").read_text().strip()
        context = ssl.create_default_context(cafile=str(token_dir / "ca.crt"))
    except OSError as exc:
        raise MoveRefused(f"the mover has no ServiceAccount token ({exc.strerror}: {exc.filename})") from None
    if not host:
        raise MoveRefused("KUBERNETES_SERVICE_HOST is not set: not in a pod")
    request = urllib.request.Request(
        f"https://{host}:{port}{path}", method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json",
                 **({"Content-Type": "application/merge-patch+json"} if body is not None else {})})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT, context=context) as answer:  # noqa: S310 - https
            found: dict[str, Any] = json.loads(answer.read())
            return found
    except urllib.error.HTTPError as exc:
        said = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError, AttributeError):  # a Status object says it in its message
            said = str(json.loads(said).get("message") or said)
        raise MoveRefused(f"{method} {path}: {exc.code} {said.strip()[:300]}") from None
    except (OSError, ValueError) as exc:
        raise MoveRefused(f"{method} {path}: {exc}") from None


def apply(request: MoveRequest, app: str, token_dir: Path) -> list[str]:
    """Carry out a checked ``request`` on StatefulSet ``app``: its pods kept off the Kubernetes nodes of the
    request's nodes' pods, the move recorded in mlenv's annotations. The nodes kept off; MoveRefused where the API
    refused."""
    try:
        namespace = (token_dir / "namespace").read_text().strip()
    except OSError as exc:
        raise MoveRefused(f"the mover has no namespace file ({exc.strerror})") from None
    base = f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{app}"
    hosts = {entry.node: str(_call(token_dir, "GET", f"/api/v1/namespaces/{namespace}/pods/{app}-{entry.node}")
                             .get("spec", {}).get("nodeName") or "") for entry in request.nodes}
    since = datetime.now(timezone.utc).isoformat(timespec="seconds")
    nodes = [{"node": entry.node, "reason": entry.reason, "saved": entry.saved, "host": hosts[entry.node],
              "since": since} for entry in request.nodes if hosts[entry.node]]
    record = json.dumps({"run": request.run, "attempt": request.attempt, "env": request.env, "nodes": nodes},
                        sort_keys=True)
    statefulset = _call(token_dir, "GET", base)
    away = sorted({*kept_off(statefulset), *hosts.values()} - {""})
    patch = affinity_patch(statefulset, away) or {"spec": {"template": {}}}
    patch["spec"]["template"]["metadata"] = {"annotations": {LEFT_OUT_ANNOTATION: record}}
    patch["metadata"] = {"annotations": {LEFT_OUT_UNRECORDED: record}}
    _call(token_dir, "PATCH", base, patch)
    return away


def answer(text: str, app: str, token_dir: Path) -> MoveAnswer:
    """The answer to one request's ``text``."""
    try:
        request = parse_request(text)
    except MoveRefused as refused:
        return MoveAnswer(None, error=f"refused: {refused}")
    try:
        return MoveAnswer(request.id, away=apply(request, app, token_dir))
    except MoveRefused as refused:
        return MoveAnswer(request.id, error=str(refused))


def serve(directory: Path, app: str, token_dir: Path) -> None:
    """Answer each request written to ``directory`` (removed once read), for ever."""
    request = directory / REQUEST
    while True:
        try:
            text = request.read_text(encoding="utf-8", errors="replace")
            request.unlink()
        except OSError:
            time.sleep(POLL_SECONDS)
            continue
        said = answer(text, app, token_dir).to_json()
        print(f"mlenv mover: {json.dumps(said)}", flush=True)
        partial = directory / f".{ANSWER}.{os.getpid()}"
        partial.write_text(json.dumps(said), encoding="utf-8")
        partial.chmod(0o644)
        partial.replace(directory / ANSWER)


def command(directory: str, app: str, token_dir: str) -> list[str]:
    """The mover container's command: this file's source, serving ``directory`` for StatefulSet ``app``."""
    return ["python3", "-c", Path(__file__).read_text(encoding="utf-8"), directory, app, token_dir]


def _stop(signum: int, _frame: object) -> None:
    """The pod is deleted: end now (PID 1 ignores a signal it has no handler for, and the pod would wait)."""
    sys.exit(128 + signum)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop)
    serve(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
