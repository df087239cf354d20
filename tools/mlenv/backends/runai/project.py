"""Does the Run:ai project exist, and is the file's namespace its namespace? Asked of the Kubernetes API: Run:ai
labels a project's namespace with its queue (REFERENCE.md: LOG-COLLECTOR and RUNAI-CLI use ``runai/queue``; KAI
v0.6.0 renamed the key ``kai.scheduler/queue``, so both are tried)."""

from __future__ import annotations

from mlenv.backends.kubeapi.client import Client, KubeError
from mlenv.backends.kubeapi.preflight import can_i
from mlenv.core.capabilities import Check

QUEUE_LABELS = ("runai/queue", "kai.scheduler/queue")
LIST_PROJECTS = "runai project list (v1: runai list projects)"


def _labelled(client: Client, project: str) -> tuple[str, list[str]] | None:
    """(label, namespaces) of the first queue label naming ``project``; None when none does or namespaces cannot be
    listed."""
    for label in QUEUE_LABELS:
        try:
            found = client.select("namespaces", {label: project})
        except KubeError:
            return None
        if found:
            return label, sorted(n["metadata"]["name"] for n in found)
    return None


def check_project(client: Client, project: str, namespace: str) -> Check:
    """PASS when a namespace labelled with the project's queue is ``namespace`` (or, where namespaces cannot be
    read, when ``namespace`` is usable); FAIL naming the namespace to use, or the project that is not there."""
    labelled = _labelled(client, project)
    if labelled is not None:
        label, names = labelled
        if namespace in names:
            return Check("project", "PASS", f"namespace {namespace} is project {project}'s ({label}={project})")
        return Check("project", "FAIL", f"project {project} lives in namespace {names[0]} ({label}={project}), not "
                                        f"{namespace}", f"set cluster.namespace: {names[0]} (or remove it)")
    try:
        client.run("get", ["namespace", namespace, "-o", "name"], namespaced=False)
    except KubeError as exc:
        if exc.reason == "NotFound":
            return Check("project", "FAIL", f"no namespace of project {project}: {namespace} does not exist and no "
                                            f"namespace is labelled {QUEUE_LABELS[0]}={project}",
                         f"check runai.project ({LIST_PROJECTS} lists yours) or set cluster.namespace")
        if can_i(client, "list", "pods", namespace):
            return Check("project", "PASS", f"namespace {namespace} is usable (namespaces are not readable, so "
                                            f"project {project} is taken on trust)")
        return Check("project", "FAIL", f"namespace {namespace} does not exist or you may not use it: {exc.detail}",
                     f"check runai.project ({LIST_PROJECTS}) and ask your Run:ai admin for access to it")
    return Check("project", "WARN", f"namespace {namespace} exists but no namespace is labelled "
                                    f"{QUEUE_LABELS[0]}={project}: is it project {project}'s?",
                 f"check runai.project against {LIST_PROJECTS}")
