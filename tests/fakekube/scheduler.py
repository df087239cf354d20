"""A tiny kube-scheduler: cordons, taints, node selectors, required node affinity, extended resources
(``nvidia.com/gpu``, ``rdma/rdma``...), required pod anti-affinity.

Its failure message has the real scheduler's shape, e.g.
``0/5 nodes are available: 2 node(s) didn't match pod anti-affinity rules, 3 node(s) didn't match Pod's node
affinity/selector. preemption: 0/5 nodes are available: 5 Preemption is not helpful for scheduling.``
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .selectors import Requirement, label_selector_object, labels_match

GPU = "nvidia.com/gpu"
NODE_UNSCHEDULABLE = "node(s) were unschedulable"
UNTOLERATED_TAINT = "node(s) had untolerated taint {{{key}: {value}}}"
NODE_AFFINITY = "node(s) didn't match Pod's node affinity/selector"
ANTI_AFFINITY = "node(s) didn't match pod anti-affinity rules"
INSUFFICIENT_GPU = f"Insufficient {GPU}"
_NO_VICTIMS = "No preemption victims found for incoming pod"
_NOT_HELPFUL = "Preemption is not helpful for scheduling"


def extended_requests(pod: dict[str, Any]) -> Counter[str]:
    """The extended resources (names with a domain: ``nvidia.com/gpu``, ``rdma/rdma``) a pod asks for: limits,
    else requests, summed over containers."""
    total: Counter[str] = Counter()
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        for name, value in {**(resources.get("requests") or {}), **(resources.get("limits") or {})}.items():
            if "/" in name:
                total[name] += int(value)
    return total


def _tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """Kubernetes' ToleratesTaint: an empty effect matches every effect, ``Exists`` without a key every taint."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("operator") == "Exists":
        return not toleration.get("key") or toleration["key"] == taint.get("key")
    return bool(toleration.get("key") == taint.get("key") and toleration.get("value", "") == taint.get("value", ""))


def _untolerated_taint(node: dict[str, Any], tolerations: list[dict[str, Any]]) -> str | None:
    """The reason naming the node's first NoSchedule/NoExecute taint that no toleration matches, or None."""
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(_tolerates(t, taint) for t in tolerations):
            return UNTOLERATED_TAINT.format(key=taint.get("key", ""), value=taint.get("value", ""))
    return None


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


def unschedulable_message(node_reasons: Iterable[Sequence[str]], total: int) -> str:
    """The FailedScheduling message, from the reasons each node failed for."""
    node_reasons = list(node_reasons)
    counts = Counter(reason for reasons in node_reasons for reason in reasons)
    found = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
    preemption = Counter(_NO_VICTIMS if any(r.startswith("Insufficient") for r in reasons) else _NOT_HELPFUL
                         for reasons in node_reasons)
    after = ", ".join(f"{n} {reason}" for reason, n in sorted(preemption.items()))
    return f"0/{total} nodes are available: {found}. preemption: 0/{total} nodes are available: {after}."


def schedule(
    pod: dict[str, Any],
    nodes: list[dict[str, Any]],
    placed: list[tuple[dict[str, Any], dict[str, Any]]],
) -> tuple[dict[str, Any] | None, str]:
    """Pick a node for ``pod`` given the pods already ``placed`` (pod, node): (node, "") or (None, message).

    Filters run in the real scheduler's order and a node fails on the first (resource fit lists every
    insufficient resource). Among the nodes that fit, the one running the fewest pods wins (ties: list order).
    """
    node_reasons: list[list[str]] = []
    fitting: list[dict[str, Any]] = []
    wanted = extended_requests(pod)
    load: Counter[str] = Counter()
    used: dict[str, Counter[str]] = defaultdict(Counter)
    for placed_pod, placed_node in placed:
        load[placed_node["metadata"]["name"]] += 1
        used[placed_node["metadata"]["name"]].update(extended_requests(placed_pod))
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    fits_node, spreads = _node_filter(pod), _anti_affinity_filter(pod, _Domains(placed))
    for node in nodes:
        name = node["metadata"]["name"]
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        taint = _untolerated_taint(node, tolerations)
        short = [f"Insufficient {resource}" for resource, amount in sorted(wanted.items())
                 if amount > int(allocatable.get(resource, 0)) - used[name][resource]]
        if (node.get("spec") or {}).get("unschedulable"):
            node_reasons.append([NODE_UNSCHEDULABLE])
        elif taint:
            node_reasons.append([taint])
        elif not fits_node(node):
            node_reasons.append([NODE_AFFINITY])
        elif short:
            node_reasons.append(short)
        elif not spreads(node):
            node_reasons.append([ANTI_AFFINITY])
        else:
            fitting.append(node)
    if not fitting:
        return None, unschedulable_message(node_reasons, len(nodes))
    return min(fitting, key=lambda n: load[n["metadata"]["name"]]), ""
