"""Moving a detached run off a Kubernetes node judged faulty, from inside the run (``scheduling.move_faulty_pods``).

Node 0's supervisor uses its pod's ServiceAccount token and the Role that deploy made for it: ``get`` on the
StatefulSet's own pods and ``get``/``patch`` on the StatefulSet, by name, nothing else. It keeps the StatefulSet's
pods off the Kubernetes node that each left-out node's pod ran on (a required node affinity ``NotIn``, the same
patch as ``launch`` makes for an attached run: :func:`affinity_patch`) and, in the same patch, records the move in
the pod template (runlayout.LEFT_OUT_ANNOTATION). The StatefulSet then replaces every pod. Each new pod reads that
through the downward API (LEFT_OUT), and its PID 1 resumes its share of the run as the next attempt
(supervise/detached.py ``resume``). mlenv records the left-out nodes from the pods' annotation when it next looks
(backends/kubernetes/exclusion.py). Standard library only: an HTTPS client of the in-cluster API.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..records.runlayout import LEFT_OUT, LEFT_OUT_ANNOTATION, LEFT_OUT_UNRECORDED, MOVES_PODS

if TYPE_CHECKING:
    from ..records.states import LeftOut

HOSTNAME_LABEL = "kubernetes.io/hostname"
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TIMEOUT = 10.0


def enabled(environ: Mapping[str, str]) -> bool:
    """Whether this run's pods may move themselves off a faulty node."""
    return bool(environ.get(MOVES_PODS))


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


def recorded(annotation: str) -> dict[str, Any] | None:
    """The move a LEFT_OUT_ANNOTATION records; None for none, or for a value that is not one."""
    try:
        move = json.loads(annotation) if annotation else None
    except ValueError:
        return None
    return move if isinstance(move, dict) and isinstance(move.get("nodes"), list) else None


def moved(environ: Mapping[str, str], run_id: str, attempt: int) -> dict[str, str] | None:
    """The variables that attempt ``attempt`` of run ``run_id`` hands its next one, where this pod was made again
    because that attempt moved the run's pods (its :data:`LEFT_OUT`); None where it did not."""
    move = recorded(environ.get(LEFT_OUT, ""))
    if move is None or move.get("run") != run_id or move.get("attempt") != attempt:
        return None
    return {str(name): str(value) for name, value in dict(move.get("env") or {}).items()}


class MoveError(Exception):
    """The in-cluster API refused or could not be reached: what it said."""


def _call(method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One request to the in-cluster API with the pod's ServiceAccount token; its JSON answer."""
    import ssl
    import urllib.error
    import urllib.request

    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    try:
        token = (SERVICE_ACCOUNT / "token").read_text().strip()
        context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
    except OSError as exc:
        raise MoveError(f"the pod has no ServiceAccount token ({exc.strerror}: {exc.filename})") from None
    if not host:
        raise MoveError("KUBERNETES_SERVICE_HOST is not set: not in a pod")
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
        raise MoveError(f"{method} {path}: {exc.code} {said.strip()[:300]}") from None
    except (OSError, ValueError) as exc:
        raise MoveError(f"{method} {path}: {exc}") from None


def move(environ: Mapping[str, str], left_out: Sequence[LeftOut], run_id: str, attempt: int,
         handed: Mapping[str, str]) -> list[str]:
    """Keep the StatefulSet's pods off the Kubernetes nodes of ``left_out``'s pods and record the move (attempt
    ``attempt`` of run ``run_id``, with the variables ``handed`` to the next one) in the pod template: every pod is
    replaced. The nodes kept off; MoveError where the API refused."""
    app = environ[MOVES_PODS]
    try:
        namespace = (SERVICE_ACCOUNT / "namespace").read_text().strip()
    except OSError as exc:
        raise MoveError(f"the pod has no ServiceAccount namespace ({exc.strerror})") from None
    base = f"/apis/apps/v1/namespaces/{namespace}/statefulsets/{app}"
    hosts = {out.node: str(_call("GET", f"/api/v1/namespaces/{namespace}/pods/{app}-{out.node}")
                           .get("spec", {}).get("nodeName") or "") for out in left_out}
    since = datetime.now(timezone.utc).isoformat(timespec="seconds")
    nodes = [{"node": out.node, "host": hosts[out.node], "reason": out.reason, "saved": out.saved, "since": since}
             for out in left_out if hosts[out.node]]
    record = {"run": run_id, "attempt": attempt, "env": dict(handed), "nodes": nodes}
    statefulset = _call("GET", base)
    away = sorted({*kept_off(statefulset), *hosts.values()} - {""})
    patch = affinity_patch(statefulset, away) or {"spec": {"template": {}}}
    text = json.dumps(record, sort_keys=True)
    patch["spec"]["template"]["metadata"] = {"annotations": {LEFT_OUT_ANNOTATION: text}}
    patch["metadata"] = {"annotations": {LEFT_OUT_UNRECORDED: text}}
    _call("PATCH", base, patch)
    return away
