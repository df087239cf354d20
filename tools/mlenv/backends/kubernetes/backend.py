"""OpenShift / Kubernetes backend: the verbs mapped onto ``oc`` (or ``kubectl``) through openshift-client."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any

from mlenv.backends.base import CopyTarget, Pod, PodStatus
from mlenv.backends.kubernetes import CONTAINER, WORKSPACE
from mlenv.backends.kubernetes import pods as podview
from mlenv.backends.kubernetes.client import Client, resolve_binary
from mlenv.backends.kubernetes.explain import pod_trouble
from mlenv.backends.kubernetes.preflight import check_login, check_namespace, check_server, explained
from mlenv.backends.kubernetes.waiting import wait_gone, wait_ready
from mlenv.errors import OperationError
from mlenv.plan import Deployment
from mlenv.ui import info, warn

CLEAN_TIMEOUT = 300
DATA_KIND = "PersistentVolumeClaim"
RUNTIME_PATH = 'export PYTHONPATH="$1/.mlenv${PYTHONPATH:+:$PYTHONPATH}"'
"""Puts the runtime shipped by sync (``<workspace>/.mlenv/mlenv/runtime``) in front of the image's PYTHONPATH."""
INPLACE = f'cd "$1" && {RUNTIME_PATH} && shift && exec "$@"'
"""Runs ``argv`` in the directory given as ``$1``; values stay separate arguments, never shell text."""
STOP_ON_STDIN_EOF = (
    f'cd "$1" || exit 127; {RUNTIME_PATH}; shift; exec 3<&0; "$@" </dev/null 3<&- & job=$!; '
    '{ cat <&3 >/dev/null; kill -TERM "$job"; } >/dev/null 2>&1 & watcher=$!; exec 3<&-; '
    'wait "$job"; code=$?; kill "$watcher" 2>/dev/null; exit "$code"'
)
"""Like INPLACE, but the job is stopped when the exec session's stdin closes (the local side went away).
The watcher reads the session's stdin through fd 3: background jobs of ``sh`` get /dev/null otherwise."""


def owned_labels(d: Deployment) -> dict[str, str]:
    """The labels every object mlenv created for ``d`` carries (clean selects by them)."""
    return {**podview.selector(d), "app.kubernetes.io/managed-by": "mlenv"}


def _volumes(client: Client, d: Deployment) -> list[str]:
    return sorted(claim["metadata"]["name"] for claim in client.select("persistentvolumeclaims", owned_labels(d)))


class OpenShiftBackend:
    """Deploy and operate a StatefulSet of GPU pods with ``oc`` (OpenShift) or ``kubectl`` (Kubernetes)."""

    def __init__(self, cli: str = "oc") -> None:
        self.cli = cli
        self.name = "kubernetes" if cli == "kubectl" else "openshift"

    @cached_property
    def binary(self) -> str:
        """The CLI's path (UsageError saying how to install it when missing)."""
        return resolve_binary(self.cli)

    def _client(self, d: Deployment) -> Client:
        """A client for ``d``'s namespace whose kubeconfig context points at ``d``'s cluster."""
        client = Client(self.binary, d.namespace)
        with explained(d.cluster):
            check_server(client, d.cluster)
        return client

    def deploy(self, deployment: Deployment, timeout: int, on_applied: Callable[[], None] | None = None) -> None:
        """Check access, server-side apply the rendered objects in order, wait until every pod is Ready."""
        from mlenv.backends.kubernetes.render import render, to_yaml

        client = self._client(deployment)
        user = check_login(client, deployment.cluster)
        with explained(deployment.cluster):
            check_namespace(client, deployment.cluster, user)
            rendered = render(deployment)
            if rendered.admin_objects:
                warn(f"pods add IPC_LOCK: unless done before, a cluster admin must apply the SCC and RBAC once: "
                     f"mlenv render {deployment.cluster.source} --admin | oc apply -f -")
            applied = client.apply(to_yaml(rendered.objects))
            if on_applied is not None:
                on_applied()
            info(f"applied {len(applied)} objects to {deployment.namespace} as {user or 'the current user'} "
                 "(server-side, field manager mlenv)")
            wait_ready(client, deployment, timeout)
        info(f"{deployment.app}: {deployment.nodes}/{deployment.nodes} pods ready in {deployment.namespace}")

    def _pods(self, d: Deployment) -> dict[int, dict[str, Any]]:
        client = self._client(d)
        with explained(d.cluster):
            return podview.by_ordinal(client.select("pods", podview.selector(d)), d.app)

    def status(self, deployment: Deployment) -> list[PodStatus]:
        """Every pod of the deployment from one list call, in ordinal order."""
        rows = []
        for index, pod in sorted(self._pods(deployment).items()):
            trouble = pod_trouble(pod, [])
            rows.append(podview.pod_status(pod, index, trouble.words if trouble else None))
        return rows

    def pods(self, deployment: Deployment) -> list[Pod]:
        """The running pods, in ordinal order."""
        running = [Pod(ordinal=index, name=pod["metadata"]["name"], workspace=WORKSPACE,
                       ip=(pod.get("status") or {}).get("podIP"), ready=podview.is_ready(pod))
                   for index, pod in sorted(self._pods(deployment).items())
                   if (pod.get("status") or {}).get("phase") == "Running"
                   and not pod["metadata"].get("deletionTimestamp")]
        if not running:
            raise OperationError(f"no running pods of {deployment.app} in {deployment.namespace}: deploy first "
                                 f"(make deploy-cluster CLUSTER={deployment.cluster.info.name})")
        return running

    def exec_argv(self, deployment: Deployment, pod: Pod, argv: Sequence[str], *,
                  env: Mapping[str, str] | None = None, interactive: bool = False,
                  stop_on_stdin_eof: bool = False) -> list[str]:
        """``<cli> exec -i [-t] -n NS POD -c ml-dev -- [env K=V...] sh -c 'cd "$1" ...' sh WORKSPACE ARGV...``."""
        assignments = ["env", *(f"{key}={value}" for key, value in (env or {}).items())] if env else []
        script = STOP_ON_STDIN_EOF if stop_on_stdin_eof and not interactive else INPLACE
        return [self.binary, "exec", "-i", *(["-t"] if interactive else []), "-n", deployment.namespace,
                pod.name, "-c", CONTAINER, "--", *assignments, "sh", "-c", script, "sh", pod.workspace, *argv]

    def copy_target(self, deployment: Deployment, pod: Pod) -> CopyTarget:
        """rsync over ``exec``: the rsh wrapper adds ``exec -i -n NS POD -c ml-dev --``."""
        return CopyTarget(destination=f"{pod.name}:{pod.workspace}/",
                          rsh=[sys.executable, "-m", "mlenv.backends.kubernetes.rsh", self.binary,
                               deployment.namespace])

    def logs_argv(self, deployment: Deployment, pod: Pod, follow: bool) -> list[str]:
        """``<cli> logs -n NS POD -c ml-dev [-f]``."""
        return [self.binary, "logs", "-n", deployment.namespace, pod.name, "-c", CONTAINER,
                *(["-f"] if follow else [])]

    def data_volumes(self, deployment: Deployment) -> list[str]:
        """Names of the PVCs ``clean --delete-data`` deletes (shared claims and per-pod volumes)."""
        client = self._client(deployment)
        with explained(deployment.cluster):
            return _volumes(client, deployment)

    def clean(self, deployment: Deployment, delete_data: bool) -> None:
        """Delete the deployment's objects by label (PVCs only with ``delete_data``), wait until pods are gone."""
        from mlenv.backends.kubernetes.render import render_objects

        client = self._client(deployment)
        kinds = list(dict.fromkeys(obj["kind"].lower() for obj in reversed(render_objects(deployment).objects)
                                   if obj["kind"] != DATA_KIND))
        if delete_data:
            kinds.append(DATA_KIND.lower())
        with explained(deployment.cluster):
            deleted = client.delete(kinds, owned_labels(deployment))
            wait_gone(client, deployment, CLEAN_TIMEOUT)
            kept = [] if delete_data else _volumes(client, deployment)
        info(f"deleted {len(deleted)} objects: {', '.join(deleted)}" if deleted
             else f"nothing to delete: no objects of {deployment.app} in {deployment.namespace}")
        if kept:
            info(f"kept {len(kept)} data volumes (PVCs: {', '.join(kept)}); mlenv clean --delete-data deletes them")
