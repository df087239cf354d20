"""OpenShift / Kubernetes backend: a StatefulSet of GPU pods, operated with ``oc`` or ``kubectl`` through
openshift-client. ``prepare`` renders the manifests; ``apply`` sends exactly that YAML stream server-side."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import cached_property
from typing import TYPE_CHECKING

from mlenv.backends.kubeapi import explain
from mlenv.backends.kubeapi import pods as podview
from mlenv.backends.kubeapi.client import Client, resolve_binary
from mlenv.backends.kubeapi.naming import (
    CONTAINER,
    DATA_KIND,
    GRANT_KINDS,
    WORKSPACE,
    KubeDeployment,
    KubeHandle,
    grant_labels,
    instance,
    kube_deployment,
    owned_labels,
)
from mlenv.backends.kubeapi.preflight import check_server, explained, preflight, require
from mlenv.backends.kubeapi.queued import queues
from mlenv.backends.kubeapi.rules import rdma_warning
from mlenv.backends.kubeapi.waiting import wait_gone, wait_ready
from mlenv.backends.kubernetes.admission import admission_checks
from mlenv.backends.kubernetes.checks import before_deploy
from mlenv.backends.kubernetes.exclusion import keep_off, record_seen_moves
from mlenv.backends.kubernetes.render import files, owned_kinds, render
from mlenv.backends.kubernetes.resume import KIND as RUN_KIND
from mlenv.backends.kubernetes.resume import keep
from mlenv.core import remote
from mlenv.core.capabilities import (
    Check,
    Checks,
    CopyTarget,
    Deploy,
    Handle,
    Jobs,
    LaunchOutcome,
    LaunchRequest,
    LaunchSpec,
    Node,
    NodeAccess,
    NodeStatus,
    Preemption,
    Preempts,
    Recorder,
    Refused,
    Request,
)
from mlenv.core.fanout import FanoutJobs
from mlenv.core.registry import Records
from mlenv.errors import OperationError, UsageError
from mlenv.render.yamlsafe import document
from mlenv.ui import info, warn

if TYPE_CHECKING:
    from mlenv.backends.kubeapi.objects import Pod
    from mlenv.plan import JobPlan

CLEAN_TIMEOUT = 300
SWITCHABLE_KINDS = ("networkpolicy",)
"""Kinds a cluster file can switch off (security.network_policy: false): deploy deletes them when off, and clean
deletes them whatever the recorded kinds say."""


def _security_warnings(d: KubeDeployment) -> list[str]:
    """Where the pods depart from Pod Security's "restricted" profile, so a namespace admin knows what to allow."""
    warnings = []
    if d.ipc_lock:
        where = ("an SCC that allows it (a cluster admin applies `mlenv render FILE --admin` once)" if d.openshift
                 else "a namespace whose Pod Security level is privileged "
                      "(pod-security.kubernetes.io/enforce=privileged)")
        warnings.append(f"pods add the IPC_LOCK capability (security.ipc_lock): Pod Security 'restricted' and "
                        f"'baseline' forbid it; it needs {where}")
    if not d.openshift and d.run_as_user == 0:
        warnings.append("pods run as root (security.run_as_user: 0): Pod Security 'restricted' needs runAsNonRoot "
                        "and a non-zero runAsUser; the namespace's Pod Security level must be baseline")
    elif not d.openshift and not d.run_as_non_root:
        warnings.append("pods run as the image's user (root in most CUDA images): Pod Security 'restricted' needs "
                        "runAsNonRoot; set security.run_as_user to a non-root UID the image supports, or the "
                        "namespace's Pod Security level must be baseline")
    return warnings


KUBERNETES_GRACE = 30.0
"""Kubernetes' terminationGracePeriodSeconds of a pod that sets none."""


class KubernetesBackend(FanoutJobs, Deploy, NodeAccess, Jobs, Checks, Preempts):
    """A StatefulSet of GPU pods with ``oc`` (OpenShift) or ``kubectl`` (Kubernetes)."""

    def __init__(self, flavour: str, records: Records) -> None:
        self.flavour = flavour
        self.name = "openshift" if flavour == "oc" else "kubernetes"
        self.records = records
        """mlenv's records: the nodes a detached run left out (and moved its pods off) are recorded there."""

    @cached_property
    def binary(self) -> str:
        """The CLI's path (UsageError saying how to install it when missing)."""
        return resolve_binary(self.flavour)

    def _client(self, target: KubeHandle) -> Client:
        return Client(self.binary, target.namespace)

    @staticmethod
    def target(handle: Handle) -> KubeHandle:
        """The cluster-side names recorded in ``handle``."""
        return handle.decoded(KubeHandle.from_data, handle.nodes)

    def _connected(self, handle: Handle) -> tuple[KubeHandle, Client]:
        target = self.target(handle)
        client = self._client(target)
        require([check_server(client, target)])  # a local read: every later call goes to the right cluster
        return target, client

    def prepare(self, plan: JobPlan) -> Request:
        """PURE: the rendered, validated manifests (one YAML stream), the admin objects and the handle."""
        d = kube_deployment(plan, openshift=self.flavour == "oc")
        rendered = render(d)
        target = KubeHandle(app=d.app, namespace=d.namespace, nodes=d.nodes, flavour=self.flavour,
                        api=plan.cluster.info.api, cluster_name=plan.name, cluster_file=plan.cluster.source,
                        kinds=tuple(owned_kinds(rendered.objects)), service_account=d.service_account,
                        ipc_lock_scc=d.ipc_lock_scc)
        handle = Handle(self.name, plan.name, plan.nodes, plan.mode, plan.storage.shared, {}, target.to_data())
        documents = [document(obj) for obj in rendered.objects]
        admin = [document(obj) for obj in rendered.admin_objects]
        extras = {"admin": "".join(admin)} if admin else {}
        return Request(handle, "".join(documents), files(rendered, documents, admin), rendered, extras,
                       (*rdma_warning(plan), *_security_warnings(d)))

    def apply(self, request: Request, record: Recorder) -> Handle:
        """Check server, login and namespace, and that the cluster serves the gang scheduler and queue the pods ask
        for (UsageError in doctor's words when not: the pods would run unadmitted, or never); record; server-side
        apply exactly the request's YAML stream."""
        resolve_binary(self.flavour, say_stand_in=True)  # the note, once per deployment: here, not on every command
        target = self.target(request.handle)
        client = self._client(target)
        user, checks = preflight(client, target)
        require(checks)
        require(admission_checks(client, target.namespace, request.payload.scheduling), UsageError)
        if "admin" in request.extras:
            warn(f"pods add IPC_LOCK: unless done before, a cluster admin must apply the SCC and RBAC once: "
                 f"mlenv render {target.cluster_file} --admin | oc apply -f -")
        record(request.handle)
        with explained(target, client.flavour):
            applied = client.apply(request.text)
            switched_off = [kind for kind in SWITCHABLE_KINDS if kind not in target.kinds]
            if switched_off:
                client.delete(switched_off, owned_labels(target.app))
            if not any(obj["kind"].lower() in GRANT_KINDS for obj in request.payload.objects):
                client.delete(GRANT_KINDS, grant_labels(target.app))  # scheduling.move_faulty_pods switched off
        info(f"applied {len(applied)} objects to {target.namespace} as {user or 'the current user'} "
             "(server-side, field manager mlenv)")
        return request.handle

    def wait_ready(self, handle: Handle, timeout: float, record: Recorder) -> None:
        """Live view until every pod is Ready on the latest spec; plain-words reasons when not."""
        target, client = self._connected(handle)
        with explained(target, client.flavour):
            wait_ready(client, target, timeout)
        info(f"{target.app}: {target.nodes}/{target.nodes} pods ready in {target.namespace}")

    def _pods(self, handle: Handle) -> tuple[KubeHandle, dict[int, Pod]]:
        target, client = self._connected(handle)
        with explained(target, client.flavour):
            return target, podview.by_ordinal(client.pods(instance(target.app)), target.app)

    def status(self, handle: Handle) -> list[NodeStatus]:
        """Every pod of the deployment from one list call, in ordinal order; what Kueue or Volcano says about pods
        they hold back from one more (their Workloads or PodGroups). A detached run's move of the pods that the
        records lack is recorded (exclusion.record_seen_moves: a call more only then)."""
        target, client = self._connected(handle)
        with explained(target, client.flavour):
            pods = podview.by_ordinal(client.pods(instance(target.app)), target.app)
            record_seen_moves(client, target, pods.values(), self.records)
            return explain.statuses(pods, queues(client, pods.values()))

    def nodes(self, handle: Handle) -> list[Node]:
        """The running pods, in ordinal order."""
        target, pods = self._pods(handle)
        running = podview.running_nodes(pods, WORKSPACE)
        if not running:
            raise OperationError(f"no running pods of {target.app} in {target.namespace}: deploy first "
                                 f"(make deploy-cluster CLUSTER={target.cluster_name})")
        return running

    def placement(self, handle: Handle, exclude: Sequence[str]) -> dict[int, tuple[str, str]]:
        """PURE: no spare hosts here: the scheduler places the pods of an excluded node elsewhere (launch keeps them
        off it, exclusion.py)."""
        return {}

    def prepare_launch(self, handle: Handle, spec: LaunchSpec) -> LaunchRequest:
        """PURE: as on every fan-out backend, after the pods are kept off the excluded nodes (said first)."""
        request = super().prepare_launch(handle, spec)
        if not spec.exclude:
            return request
        first = (f"# first: the pods of {self.target(handle).app} are kept off {', '.join(spec.exclude)} (required "
                 "node affinity kubernetes.io/hostname NotIn; the StatefulSet replaces its pods)\n")
        return replace(request, text=first + request.text)

    def launch(self, handle: Handle, request: LaunchRequest, secrets: Mapping[str, str],
               log_dir: str) -> LaunchOutcome:
        """Keep the pods off the run's excluded nodes (exclusion.py; nothing when they are already), then start the
        run on every pod; an attached run that fails names the pods taken away under it (deleted or evicted: a
        pod of another uid now, or one being deleted) as preempted."""
        target, client = self._connected(handle)
        with explained(target, client.flavour):
            keep_off(client, target, request.spec.exclude, self.records)
            before = self._pod_uids(client, target)
        outcome = super().launch(handle, request, secrets, log_dir)
        if outcome.exit_code == 0 or outcome.interrupted or request.spec.detach:
            return outcome
        with explained(target, client.flavour):
            after = self._pod_uids(client, target)
        gone = frozenset(ordinal for ordinal, uid in before.items() if after.get(ordinal) != uid)
        return replace(outcome, preempted=gone) if gone else outcome

    def keep_for_resume(self, handle: Handle, request: LaunchRequest, secrets: Mapping[str, str]) -> None:
        """The run's Secret (resume.py): a pod that comes back after a preemption resumes a detached run."""
        target, client = self._connected(handle)
        with explained(target, client.flavour):
            keep(client, target, request.spec.run_id if request.spec.detach else None, secrets)

    def preemption_refused(self, handle: Handle) -> Refused | None:
        """PURE: a pod of any run can be deleted under it."""
        return None

    def take_away(self, handle: Handle, node: Node, run_id: str) -> Preemption:
        """Delete ``node``'s pod as a preemption or a drain does: gracefully, its PID 1 passing SIGTERM to the
        ranks for the pod's grace; the StatefulSet makes it again."""
        target, client = self._connected(handle)
        with explained(target, client.flavour):
            grace = client.run("get", ["pod", node.name, "-o", "jsonpath={.spec.terminationGracePeriodSeconds}"])
            at = time.time()
            client.run("delete", ["pod", node.name, "--wait=false"])
        seconds = float(grace.strip() or KUBERNETES_GRACE)
        return Preemption(f"pod {node.name} deleted (grace {seconds:g} s)", seconds, at)

    @staticmethod
    def _pod_uids(client: Client, target: KubeHandle) -> dict[int, str]:
        """Ordinal -> uid of each pod that is not being deleted."""
        pods = podview.by_ordinal(client.pods(instance(target.app)), target.app)
        return {ordinal: str(pod["metadata"].get("uid")) for ordinal, pod in pods.items()
                if not pod["metadata"].get("deletionTimestamp")}

    def exec_argv(self, handle: Handle, node: Node, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  interactive: bool = False, stop_on_stdin_eof: bool = False,
                  secrets: Sequence[str] = ()) -> list[str]:
        """``<cli> exec -i [-t] -n NS POD -c ml-dev -- [env K=V...] sh -c SCRIPT sh WORKSPACE ARGV...``; the pod's
        own env already has the contract."""
        target = self.target(handle)
        assignments = ["env", *(f"{key}={value}" for key, value in env.items())] if env else []
        script = remote.script(stop_on_stdin_eof=stop_on_stdin_eof and not interactive, secrets=secrets)
        return [self.binary, "exec", "-i", *(["-t"] if interactive else []), "-n", target.namespace, node.name,
                "-c", CONTAINER, "--", *assignments, "sh", "-c", script, "sh", node.workspace, *argv]

    def copy_target(self, handle: Handle, node: Node) -> CopyTarget:
        """rsync over ``exec``: the rsh wrapper adds ``exec -i -n NS POD -c ml-dev --``."""
        return CopyTarget(destination=f"{node.name}:{node.workspace}/",
                          rsh=[sys.executable, "-m", "mlenv.backends.kubernetes.rsh", self.binary,
                               self.target(handle).namespace])

    def _volumes(self, client: Client, target: KubeHandle) -> list[str]:
        return sorted(claim["metadata"]["name"]
                      for claim in client.select("persistentvolumeclaims", owned_labels(target.app)))

    def data_volumes(self, handle: Handle) -> list[str]:
        """Names of the PVCs ``clean --delete-data`` deletes (shared claims and per-pod volumes)."""
        target, client = self._connected(handle)
        with explained(target, client.flavour):
            return self._volumes(client, target)

    def clean(self, handle: Handle, delete_data: bool) -> None:
        """Delete the recorded kinds by mlenv's labels (PVCs only with ``delete_data``), wait until pods are gone."""
        target, client = self._connected(handle)
        kinds = [*dict.fromkeys([*SWITCHABLE_KINDS, RUN_KIND, *target.kinds]),  # RUN_KIND: a detached run's Secret
                 *([DATA_KIND.lower()] if delete_data else [])]
        with explained(target, client.flavour):
            deleted = [*client.delete(kinds, owned_labels(target.app)), *client.delete(GRANT_KINDS,
                                                                                        grant_labels(target.app))]
            wait_gone(client, target, CLEAN_TIMEOUT)
            kept = [] if delete_data else self._volumes(client, target)
        info(f"deleted {len(deleted)} objects: {', '.join(deleted)}" if deleted
             else f"nothing to clean: no objects of {target.app} in {target.namespace}")
        if kept:
            info(f"kept {len(kept)} data volumes (PVCs: {', '.join(kept)}); mlenv clean --delete-data deletes them")

    def checks(self, plan: JobPlan) -> list[Check]:
        """The CLI, then every before-deploy check of ``checks.before_deploy``."""
        request = self.prepare(plan)
        target = self.target(request.handle)
        try:
            binary = self.binary
        except UsageError as exc:
            return [Check("cli", "FAIL", str(exc), "make install-system")]
        return [Check("cli", "PASS", binary), *before_deploy(self._client(target), target, plan)]


def openshift(records: Records) -> KubernetesBackend:
    """The backend of ``backend: openshift`` (``oc``)."""
    return KubernetesBackend("oc", records)


def kubernetes(records: Records) -> KubernetesBackend:
    """The backend of ``backend: kubernetes`` (``kubectl``)."""
    return KubernetesBackend("kubectl", records)
