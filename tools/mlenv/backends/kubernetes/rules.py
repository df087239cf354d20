"""Rules of the Kubernetes API server (and of running on it) checked at validate time, so that a bad file fails
with its line and column instead of at deploy: namespaces, resource names, tolerations, supported versions. Run by
validate for the files of the backends whose registry entry names them (``BackendInfo.rules`` and ``settings``)."""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from mlenv.backends.kubeapi.rules import namespace_problem
from mlenv.backends.kubernetes import scc
from mlenv.config.model import DEFAULT_APP, Cluster
from mlenv.errors import show_value

if TYPE_CHECKING:
    from mlenv.config.reader import ClusterReader

DEFAULT_VERSION = "1.30"
"""The Kubernetes version rendered objects are validated against when the file names none."""

_INT64 = range(-(2**63), 2**63)
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_SCHEMA_DIR = re.compile(r"v1\.([0-9]+)\.[0-9]+-local(-strict)?")


MAX_APP_NAME = 52
"""The longest app name whose derived names all fit: the StatefulSet's pods carry the label
``controller-revision-hash: <app>-<10-character hash>``, and a label value holds at most 63 characters (the
``-headless`` Service and the ``<app>-multi`` label need fewer)."""


def app_name_problem(name: str) -> str | None:
    """Why ``app.name`` cannot name Kubernetes objects, or None."""
    if len(name) <= MAX_APP_NAME:
        return None
    return (f"{len(name)} characters is too long for Kubernetes: the StatefulSet's pods carry the label "
            f"controller-revision-hash=<app.name>-<10-character hash>, which must fit 63 characters; "
            f"use at most {MAX_APP_NAME}")


def rdma_resource_problem(name: str) -> str | None:
    """Why ``name`` cannot be an RDMA device-plugin resource of the pods, or None."""
    if name == "nvidia.com/gpu":
        return "would override the GPU count of gpus.per_node; remove it and set gpus.per_node"
    if name in ("cpu", "memory"):
        return f"would override resources.limits.{name}; remove it and set resources.requests/limits.{name}"
    if name == "ephemeral-storage" or name.startswith("hugepages-"):
        return "is a node resource, not an RDMA device; remove it"
    return None


def is_qualified_name(key: str) -> bool:
    """A label key as Kubernetes' IsQualifiedName accepts it: ``[DNS subdomain/]name``, name at most 63."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix)):
        return False
    return len(name) <= 63 and _LABEL_NAME.fullmatch(name) is not None


def _is_label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and _LABEL_NAME.fullmatch(value) is not None)


def _seconds_problem(seconds: Any) -> str | None:
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        return f"expected a whole number of seconds written as an integer, got {show_value(seconds)}"
    if seconds not in _INT64:
        return f"expected a number of seconds from -2^63 to 2^63-1, got {show_value(seconds)}"
    return None


def toleration_problems(toleration: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, message) for each rule of Kubernetes' ValidateTolerations that ``toleration`` breaks."""
    key, value = toleration.get("key") or "", toleration.get("value") or ""
    operator, effect = toleration.get("operator") or "Equal", toleration.get("effect") or ""
    seconds = toleration.get("tolerationSeconds")
    problems = []
    if key and not is_qualified_name(key):
        problems.append(("key", f"expected a label key like dedicated or example.com/gpu (an optional DNS subdomain "
                                f"and '/', then at most 63 letters, digits, '-', '_' or '.'), got {show_value(key)}"))
    if not key and operator != "Exists":
        problems.append(("operator", "a toleration without a key must have operator: Exists (it then tolerates "
                                     "every taint); add a key or set operator: Exists"))
    if operator == "Exists" and value:
        problems.append(("value", "operator: Exists tolerates any value, so value must be empty; remove value or "
                                  "use operator: Equal"))
    if operator == "Equal" and not _is_label_value(value):
        problems.append(("value", f"expected a label value (at most 63 letters, digits, '-', '_' or '.', starting "
                                  f"and ending with a letter or digit), got {show_value(value)}"))
    if seconds is not None:
        if (reason := _seconds_problem(seconds)) is not None:
            problems.append(("tolerationSeconds", reason))
        if effect != "NoExecute":
            problems.append(("effect", "tolerationSeconds applies only to effect: NoExecute; set effect: NoExecute "
                                       "or remove tolerationSeconds"))
    return problems


@lru_cache(maxsize=1)
def supported_minors() -> tuple[int, ...]:
    """The Kubernetes 1.x minor versions whose schemas kubernetes-validate ships, found by listing its data
    directory (importing it would pull in jsonschema); empty when it is not installed."""
    spec = importlib.util.find_spec("kubernetes_validate")
    if spec is None or not spec.submodule_search_locations:
        return ()
    try:
        names = os.listdir(os.path.join(next(iter(spec.submodule_search_locations)), "kubernetes-json-schema"))
    except OSError:
        return ()
    return tuple(sorted({int(match.group(1)) for name in names if (match := _SCHEMA_DIR.fullmatch(name))}))


def version_problem(version: str) -> str | None:
    """Why manifests cannot be checked for Kubernetes ``version`` ("1.30"), or None."""
    minors = supported_minors()
    minor = int(version.split(".")[1])
    if minors and not minors[0] <= minor <= minors[-1]:
        return (f"Kubernetes {version} is not supported: mlenv checks manifests against 1.{minors[0]} to "
                f"1.{minors[-1]}; pick the one closest to your cluster's version")
    return None


@dataclass(frozen=True)
class KubernetesSettings:
    """What a Kubernetes-family file says only to its backend (``Cluster.settings``)."""

    version: str
    """``kubernetes_version``: the API the rendered objects are validated against."""


def parse(reader: ClusterReader) -> KubernetesSettings:
    """``kubernetes_version`` (a supported one)."""
    version = str(reader.get("kubernetes_version", default=DEFAULT_VERSION)).lstrip("v")
    if (reason := version_problem(version)) is not None:
        reader.problem(("kubernetes_version",), reason)
    return KubernetesSettings(version)


def check_resources(reader: ClusterReader) -> None:
    """``network.rdma.resources`` names that a Kubernetes API server accepts (Run:ai's pods too)."""
    for name in reader.get("network", "rdma", "resources", default={}):
        if (reason := rdma_resource_problem(name)) is not None:
            reader.problem(("network", "rdma", "resources", name), reason)


def check(reader: ClusterReader) -> None:
    """Kubernetes' rules on the common sections: the namespace, the app name, RDMA resources, tolerations."""
    namespace = reader.get("cluster", "namespace")
    if namespace is not None:
        if (reason := namespace_problem(namespace)) is not None:
            reader.problem(("cluster", "namespace"), reason)
        elif namespace == "default":
            reader.warn("cluster.namespace: default is shared by everything in the cluster; a namespace of your "
                        "own keeps mlenv's objects, and what clean deletes, apart")
    if (reason := app_name_problem(str(reader.get("app", "name", default=DEFAULT_APP)))) is not None:
        reader.problem(("app", "name"), reason)
    check_resources(reader)
    for index, toleration in enumerate(reader.get("scheduling", "tolerations", default=[])):
        for name, message in toleration_problems(toleration):
            reader.problem(("scheduling", "tolerations", index, name), message)
    check_admission(reader)


def check_admission(reader: ClusterReader) -> None:
    """Gang admission that can work: Kueue needs its LocalQueue, a queue needs an admission, a topology needs
    Kueue."""
    admission = reader.get("scheduling", "admission", default="none")
    queue = reader.get("scheduling", "queue")
    if admission == "kueue" and queue is None:
        namespace = reader.get("cluster", "namespace", default="the cluster's namespace")
        reader.problem(("scheduling", "admission"),
                       f"kueue needs scheduling.queue: the LocalQueue in {namespace} that admits the job (kubectl "
                       f"get localqueues -n {namespace} lists them; a cluster admin creates one)")
    if admission == "none" and queue is not None:
        reader.problem(("scheduling", "queue"),
                       "is used only with scheduling.admission: kueue or volcano; set admission or remove queue")
    if reader.get("scheduling", "topology") is not None and admission != "kueue":
        reader.problem(("scheduling", "topology"),
                       "topology-aware placement is Kueue's: set scheduling.admission: kueue (with "
                       "scheduling.queue) or remove scheduling.topology")


def check_openshift(reader: ClusterReader) -> None:
    """Kubernetes' rules and OpenShift's SCC."""
    check(reader)
    scc.check(reader)


def version_of(cluster: Cluster) -> str:
    """The Kubernetes version of ``cluster``'s file (the default when its backend reads none)."""
    settings = cluster.settings
    return settings.version if isinstance(settings, KubernetesSettings) else DEFAULT_VERSION
