"""Nodes left out on Kubernetes: the StatefulSet's pods are kept off the excluded Kubernetes nodes by a required
node affinity (``kubernetes.io/hostname NotIn``), beside the pinned nodes' ``In``. ``deploy`` renders it from the
deployment's excluded nodes; ``launch`` brings the live StatefulSet to the run's exclusions (a node the restart
policy just left out, or one ``mlenv nodes --forget-excluded`` let back), which replaces its pods, and waits until
every pod is Ready again; when no node can take a pod, the scheduler's reason ends the launch."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mlenv.backends.kubeapi.client import Client
from mlenv.backends.kubeapi.naming import Target
from mlenv.errors import OperationError
from mlenv.ui import info

HOSTNAME_LABEL = "kubernetes.io/hostname"
READY_TIMEOUT = 900.0
"""Seconds the pods get to be Ready on other nodes (a reason the scheduler gives that lasts ends it sooner)."""


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


def keep_off(client: Client, target: Target, excluded: Sequence[str]) -> None:
    """Bring the live StatefulSet to ``excluded`` (a merge patch of its node affinity: its pods are replaced) and
    wait until every pod is Ready again; nothing when it is there already."""
    from mlenv.backends.kubeapi.client import KubeError
    from mlenv.backends.kubeapi.waiting import wait_ready

    try:
        statefulset = json.loads(client.run("get", ["statefulset", target.app, "-o=json"]))
    except KubeError as exc:
        if exc.reason != "NotFound":
            raise
        raise OperationError(f"the StatefulSet {target.app} of {target.cluster_name} is not in {target.namespace} "
                             f"(deleted by hand?): nothing to launch on; mlenv deploy makes it again") from None
    patch = affinity_patch(statefulset, excluded)
    if patch is None:
        return
    before = kept_off(statefulset)
    back, away = sorted(set(before) - set(excluded)), sorted(set(excluded) - set(before))
    info(f"{target.app}: keeping the pods off {', '.join(away)}" if away else f"{target.app}: letting the pods back "
         f"on {', '.join(back)}")
    client.run("patch", ["statefulset", target.app, "--type=merge", "--field-manager=mlenv", "-p", json.dumps(patch)])
    wait_ready(client, target, READY_TIMEOUT)
