"""A tiny kube-scheduler: node selectors, required node affinity, required pod anti-affinity, GPU capacity.

Its failure message has the real scheduler's shape, e.g.
``0/5 nodes are available: 2 node(s) didn't match pod anti-affinity rules, 3 node(s) didn't match Pod's node
affinity/selector. preemption: 0/5 nodes are available: 5 Preemption is not helpful for scheduling.``
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
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


def _node_filter(pod: dict[str, Any]) -> Callable[[dict[str, Any]], bool]:
    """Whether a node satisfies the pod's nodeSelector and required node affinity (nodeSelectorTerms are ORed,
    the expressions and fields of one term ANDed)."""
    spec = pod.get("spec") or {}
    selector = [Requirement(k, "in", frozenset({v})) for k, v in (spec.get("nodeSelector") or {}).items()]
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    terms = None if required is None else [
        (label_selector_object({"matchExpressions": t.get("matchExpressions")}),
         label_selector_object({"matchExpressions": t.get("matchFields")}))
        for t in required.get("nodeSelectorTerms") or []
    ]

    def matches(node: dict[str, Any]) -> bool:
        labels = node["metadata"].get("labels") or {}
        if not labels_match(selector, labels):
            return False
        fields = {"metadata.name": node["metadata"]["name"]}
        return terms is None or any(labels_match(e, labels) and labels_match(f, fields) for e, f in terms)

    return matches


def _anti_affinity_filter(pod: dict[str, Any], domains: _Domains) -> Callable[[dict[str, Any]], bool]:
    """Whether no pod matching a required anti-affinity term of ``pod`` runs in the node's topology domain."""
    required = ((pod["spec"].get("affinity") or {}).get("podAntiAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or []
    namespace = pod["metadata"].get("namespace")
    terms = [(t.get("topologyKey", "kubernetes.io/hostname"), label_selector_object(t.get("labelSelector")),
              t.get("namespaces") or [namespace]) for t in required]

    def allowed(node: dict[str, Any]) -> bool:
        labels = node["metadata"].get("labels") or {}
        return not any(
            other["metadata"].get("namespace") in namespaces
            and labels_match(requirements, other["metadata"].get("labels"))
            for key, requirements, namespaces in terms
            for other in domains.pods(key, labels.get(key))
        )

    return allowed


class _Domains:
    """The placed pods grouped by the value their node has for a topology key (built once per key)."""

    def __init__(self, placed: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
        self._placed = placed
        self._by_key: dict[str, dict[str | None, list[dict[str, Any]]]] = {}

    def pods(self, key: str, value: str | None) -> list[dict[str, Any]]:
        """The pods on nodes whose label ``key`` equals ``value``."""
        if key not in self._by_key:
            grouped: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
            for pod, node in self._placed:
                grouped[(node["metadata"].get("labels") or {}).get(key)].append(pod)
            self._by_key[key] = grouped
        return self._by_key[key].get(value, [])


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
    load: Counter[str] = Counter()
    used: Counter[str] = Counter()
    for placed_pod, placed_node in placed:
        load[placed_node["metadata"]["name"]] += 1
        used[placed_node["metadata"]["name"]] += gpu_request(placed_pod)
    fits_node, spreads = _node_filter(pod), _anti_affinity_filter(pod, _Domains(placed))
    for node in nodes:
        name = node["metadata"]["name"]
        free = int(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0)) - used[name]
        if (node.get("spec") or {}).get("unschedulable"):
            reasons.append(NODE_UNSCHEDULABLE)
        elif not fits_node(node):
            reasons.append(NODE_AFFINITY)
        elif wanted > free:
            reasons.append(INSUFFICIENT_GPU)
        elif not spreads(node):
            reasons.append(ANTI_AFFINITY)
        else:
            fitting.append(node)
    if not fitting:
        return None, unschedulable_message(reasons, len(nodes))
    return min(fitting, key=lambda n: load[n["metadata"]["name"]]), ""
