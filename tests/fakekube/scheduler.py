"""A tiny kube-scheduler: node selectors, required node affinity, required pod anti-affinity, GPU capacity.

Its failure message has the real scheduler's shape, e.g.
``0/5 nodes are available: 2 node(s) didn't match pod anti-affinity rules, 3 node(s) didn't match Pod's node
affinity/selector. preemption: 0/5 nodes are available: 5 Preemption is not helpful for scheduling.``
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from .selectors import Requirement, label_selector_object, labels_match

GPU = "nvidia.com/gpu"
NODE_UNSCHEDULABLE = "node(s) were unschedulable"
NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
INSUFFICIENT_GPU = f"Insufficient {GPU}"
_NO_VICTIMS = "No preemption victims found for incoming pod"
_NOT_HELPFUL = "Preemption is not helpful for scheduling"


def gpu_request(pod: dict[str, Any]) -> int:
    """The GPUs a pod asks for (limits, else requests, summed over containers)."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get(GPU, (resources.get("requests") or {}).get(GPU, 0))
        total += int(value)
    return total


def _node_terms_match(terms: list[dict[str, Any]], node: dict[str, Any]) -> bool:
    """nodeSelectorTerms are ORed; the expressions (and fields) of one term are ANDed."""
    labels = node["metadata"].get("labels") or {}
    fields = {"metadata.name": node["metadata"]["name"]}
    return any(
        labels_match(label_selector_object({"matchExpressions": t.get("matchExpressions")}), labels)
        and labels_match(label_selector_object({"matchExpressions": t.get("matchFields")}), fields)
        for t in terms
    )


def _matches_node(pod: dict[str, Any], node: dict[str, Any]) -> bool:
    spec = pod.get("spec") or {}
    selector = [Requirement(k, "in", frozenset({v})) for k, v in (spec.get("nodeSelector") or {}).items()]
    if not labels_match(selector, node["metadata"].get("labels")):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return required is None or _node_terms_match(required.get("nodeSelectorTerms") or [], node)


def _anti_affinity_ok(
    pod: dict[str, Any], node: dict[str, Any], placed: list[tuple[dict[str, Any], dict[str, Any]]]
) -> bool:
    """No pod matching a required anti-affinity term already runs in the same topology domain."""
    terms = ((pod["spec"].get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or []
    namespace = pod["metadata"].get("namespace")
    for term in terms:
        key = term.get("topologyKey", "kubernetes.io/hostname")
        domain = (node["metadata"].get("labels") or {}).get(key)
        requirements = label_selector_object(term.get("labelSelector"))
        namespaces = term.get("namespaces") or [namespace]
        for other, other_node in placed:
            if (
                other["metadata"].get("namespace") in namespaces
                and (other_node["metadata"].get("labels") or {}).get(key) == domain
                and labels_match(requirements, other["metadata"].get("labels"))
            ):
                return False
    return True


def unschedulable_message(reasons: Iterable[str], total: int) -> str:
    """The FailedScheduling message for one failing reason per node."""
    counts = Counter(reasons)
    found = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
    preemption = Counter(_NO_VICTIMS if r.startswith("Insufficient") else _NOT_HELPFUL for r in counts.elements())
    after = ", ".join(f"{n} {reason}" for reason, n in sorted(preemption.items()))
    return f"0/{total} nodes are available: {found}. preemption: 0/{total} nodes are available: {after}."


def schedule(
    pod: dict[str, Any],
    nodes: list[dict[str, Any]],
    placed: list[tuple[dict[str, Any], dict[str, Any]]],
) -> tuple[dict[str, Any] | None, str]:
    """Pick a node for ``pod`` given the pods already ``placed`` (pod, node): (node, "") or (None, message).

    Among the nodes that fit, the one running the fewest pods wins (ties: first in list order).
    """
    reasons: list[str] = []
    fitting: list[dict[str, Any]] = []
    wanted = gpu_request(pod)
    for node in nodes:
        here = [p for p, n in placed if n is node]
        free = int(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0)) - sum(map(gpu_request, here))
        if (node.get("spec") or {}).get("unschedulable"):
            reasons.append(NODE_UNSCHEDULABLE)
        elif not _matches_node(pod, node):
            reasons.append(NODE_AFFINITY)
        elif wanted > free:
            reasons.append(INSUFFICIENT_GPU)
        elif not _anti_affinity_ok(pod, node, placed):
            reasons.append(ANTI_AFFINITY)
        else:
            fitting.append(node)
    if not fitting:
        return None, unschedulable_message(reasons, len(nodes))
    load = Counter(id(n) for _, n in placed)
    return min(fitting, key=lambda n: load[id(n)]), ""
