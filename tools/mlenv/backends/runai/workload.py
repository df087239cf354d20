"""A Run:ai workload as mlenv records it, and its pods as the training operator names and labels them.

Pods are found by the label Run:ai puts on every pod of a workload (``workloadName=<name>``) and put in node order
by the training operator's replica labels: the master is node 0, worker i is node i+1, which is also the RANK
the operator gives each pod (tests/fixtures/runai/REFERENCE.md, "The Kubernetes side").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from mlenv.backends.kubeapi import pods as podview
from mlenv.backends.kubeapi.explain import owner_trouble
from mlenv.backends.kubeapi.naming import KubeHandle
from mlenv.backends.kubeapi.waiting import PodSet
from mlenv.runtime.records.jsonvalue import JsonObject

WORKLOAD_LABEL = "workloadName"
"""On every pod (and PodGroup) of a Run:ai workload (REFERENCE.md: LOG-COLLECTOR)."""
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
"""The training operator's replica labels: ``master``/``worker`` and the index (REFERENCE.md: TO)."""
_POD_NAME = r"(master|worker)-(\d+)"


@dataclass(frozen=True)
class Workload:
    """Enough to operate a submitted workload without its cluster file (the handle's data)."""

    name: str
    project: str
    namespace: str
    cli: str
    nodes: int
    cluster_name: str
    cluster_file: str
    api: str | None
    workspace_claim: str | None
    """The PVC mlenv asked Run:ai to create at /workspace (the only one clean --delete-data deletes)."""

    def to_data(self) -> JsonObject:
        """The backend-specific part of the handle (``nodes`` is the handle's own field)."""
        data = asdict(self)
        del data["nodes"]
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any], nodes: int) -> Workload:
        """Inverse of ``to_data``; KeyError/TypeError on a record of another shape."""
        def text(key: str) -> str:
            value = data[key]
            if not isinstance(value, str):
                raise TypeError(f"{key} is not a string")
            return value

        def optional(key: str) -> str | None:
            return None if data.get(key) is None else text(key)

        return cls(name=text("name"), project=text("project"), namespace=text("namespace"), cli=text("cli"),
                   nodes=nodes, cluster_name=text("cluster_name"), cluster_file=text("cluster_file"),
                   api=optional("api"), workspace_claim=optional("workspace_claim"))

    @property
    def selector(self) -> dict[str, str]:
        """The labels that list the workload's pods."""
        return {WORKLOAD_LABEL: self.name}

    def target(self, flavour: str) -> KubeHandle:
        """The workload in the Kubernetes backend's terms, for its preflight checks, waits and explanations."""
        return KubeHandle(app=self.name, namespace=self.namespace, nodes=self.nodes, flavour=flavour, api=self.api,
                      cluster_name=self.cluster_name, cluster_file=self.cluster_file, kinds=(), service_account="",
                      ipc_lock_scc=None)

    def pods(self, flavour: str) -> PodSet:
        """What deploy waits for: the workload's pods in node order; Run:ai's own warnings explain missing ones."""
        return PodSet(self.target(flavour), self.selector, lambda found: podview.by_ordinal(found, self.name, ordinal),
                      lambda index: pod_name(self.name, index),
                      lambda events, since: owner_trouble(events, self.name, since),
                      again="deploy again to follow it once fixed (it is not submitted twice)")


def ordinal(pod: Mapping[str, Any], workload: str) -> int | None:
    """Node ordinal of a pod of ``workload`` (master 0, worker i -> i+1), from its replica labels or else its
    name ``<workload>-master-0`` / ``<workload>-worker-<i>``; None for any other pod."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    kind, index = labels.get(REPLICA_TYPE_LABEL), labels.get(REPLICA_INDEX_LABEL)
    if kind is None or index is None:
        match = re.fullmatch(re.escape(workload) + "-" + _POD_NAME, str(meta.get("name", "")))
        if match is None:
            return None
        kind, index = match.groups()
    if not str(index).isdigit():
        return None
    if str(kind).lower() == "master":
        return 0 if int(index) == 0 else None
    return int(index) + 1 if str(kind).lower() == "worker" else None


def pod_name(workload: str, index: int) -> str:
    """The training operator's name for node ``index``'s pod: ``<name>-master-0``, ``<name>-worker-<i-1>``."""
    return f"{workload}-master-0" if index == 0 else f"{workload}-worker-{index - 1}"
