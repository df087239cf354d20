"""Run:ai backend: ``prepare`` builds the ``runai`` submit command line (an argv list; ``render`` prints it
shell-quoted), ``apply`` runs it, and everything after goes through the Kubernetes API with the Kubernetes
backend's pieces: the live wait with plain-words reasons, status, and ``kubectl exec`` for exec, shell, logs, sync
and launch (the same in-pod wrapper, backends.remote). kubectl rather than ``runai exec``: one exec for both CLI
generations, with the stdin semantics the wrapper needs (secrets, stop when the local side goes away) and an rsync
remote shell; the pods are listed through the API anyway."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from functools import cached_property

from mlenv.backends.kubeapi import explain
from mlenv.backends.kubeapi import pods as podview
from mlenv.backends.kubeapi.client import Client, resolve_binary
from mlenv.backends.kubeapi.objects import Pod
from mlenv.backends.kubeapi.preflight import (
    can_i,
    check_allocatable,
    check_login,
    check_networks,
    check_server,
    explained,
    require,
)
from mlenv.backends.kubeapi.rules import rdma_warning
from mlenv.backends.kubeapi.waiting import wait_pods_gone, wait_pods_ready
from mlenv.backends.runai import argv as commands
from mlenv.backends.runai import flags, tool
from mlenv.backends.runai.project import check_project
from mlenv.backends.runai.settings import RunaiSettings
from mlenv.backends.runai.workload import Workload, ordinal
from mlenv.core import remote
from mlenv.core.capabilities import (
    Check,
    Checks,
    CopyTarget,
    Deploy,
    Handle,
    Jobs,
    Node,
    NodeAccess,
    NodeStatus,
    Recorder,
    Request,
)
from mlenv.core.fanout import FanoutJobs
from mlenv.errors import MlenvError, OperationError, UsageError
from mlenv.plan import JobPlan
from mlenv.ui import info

CLEAN_TIMEOUT = 300
GPU_RESOURCE = "nvidia.com/gpu"


def _settings(plan: JobPlan) -> RunaiSettings:
    settings = plan.cluster.settings
    if not isinstance(settings, RunaiSettings):
        raise UsageError(f"{plan.cluster.source} is not a runai cluster file (backend: {plan.cluster.backend})")
    return settings


def _warnings(plan: JobPlan, claim: str | None) -> list[str]:
    warnings = rdma_warning(plan)
    if claim is not None and not plan.storage.shared and plan.nodes > 1:
        warnings.append(f"the workspace PVC {claim} is ReadWriteOnce (storage.mode is not rwx) and mounted by all "
                        f"{plan.nodes} pods: pods on different machines cannot attach it; use storage.mode: rwx")
    return warnings


class RunaiBackend(FanoutJobs, Deploy, NodeAccess, Jobs, Checks):
    """A Run:ai distributed PyTorch workload: a master and workers running ``sleep infinity``."""

    name = "runai"

    @cached_property
    def kubectl(self) -> str:
        """kubectl's path (UsageError saying how to install it when missing)."""
        return resolve_binary("kubectl")

    @staticmethod
    def workload(handle: Handle) -> Workload:
        """The workload recorded in ``handle``."""
        return handle.decoded(Workload.from_data, handle.nodes)

    def _client(self, workload: Workload) -> Client:
        return Client(self.kubectl, workload.namespace)

    def _connected(self, handle: Handle) -> tuple[Workload, Client]:
        workload = self.workload(handle)
        client = self._client(workload)
        require([check_server(client, workload.target(client.flavour))])
        return workload, client

    def prepare(self, plan: JobPlan) -> Request:
        """PURE: the submit argv (payload), its shell-quoted line (text) and the handle."""
        settings = _settings(plan)
        claim = f"{plan.app}-workspace" if settings.workspace_volume else None
        submission = commands.submission(plan, settings, claim)
        workload = Workload(name=plan.app, project=settings.project, namespace=settings.namespace, cli=settings.cli,
                            nodes=plan.nodes, cluster_name=plan.name, cluster_file=plan.cluster.source,
                            api=plan.cluster.info.api, workspace_claim=claim)
        shared = claim is not None or any(pvc.path == flags.WORKSPACE for pvc in settings.existing_pvcs)
        handle = Handle(self.name, plan.name, plan.nodes, plan.mode, shared, {}, workload.to_data())
        text = shlex.join(submission.argv) + "\n"
        return Request(handle, text, {"runai-submit.sh": f"#!/bin/sh\n{text}"}, submission,
                       warnings=tuple(_warnings(plan, claim)))

    def apply(self, request: Request, record: Recorder) -> Handle:
        """Check runai's and kubectl's login and the project; record; submit exactly the request's argv (unless
        the workload is there already: it is followed, not submitted twice)."""
        workload = self.workload(request.handle)
        client = self._client(workload)
        target = workload.target(client.flavour)
        checks = [tool.login_check(), check_server(client, target)]
        if checks[-1].status == "PASS":
            checks.append(check_login(client, target)[1])
        if checks[-1].status == "PASS":
            checks.append(check_project(client, workload.project, workload.namespace))
        require(checks)
        submission: commands.Submission = request.payload
        problems = tool.spelling_problems(submission)
        if problems:
            raise OperationError("\n".join(problems))
        record(request.handle)
        if tool.run(commands.describe(workload.cli, workload.name, workload.project)).returncode == 0:
            info(f"workload {workload.name} is already submitted in project {workload.project}: following its pods "
                 f"(to submit a changed file: mlenv clean, then deploy)")
            return request.handle
        result = tool.run(submission.argv)
        if result.returncode != 0:
            raise OperationError(f"runai did not submit {workload.name}: {tool.said(result)}")
        info(result.stdout.strip() or f"submitted {workload.name} to project {workload.project}")
        return request.handle

    def wait_ready(self, handle: Handle, timeout: float, record: Recorder) -> None:
        """Live view until every pod of the workload is Ready; plain-words reasons when not."""
        workload, client = self._connected(handle)
        with explained(workload.target(client.flavour), client.flavour):
            wait_pods_ready(client, workload.pods(client.flavour), timeout)
        info(f"{workload.name}: {workload.nodes}/{workload.nodes} pods ready in {workload.namespace}")

    def _pods(self, handle: Handle) -> tuple[Workload, dict[int, Pod]]:
        workload, client = self._connected(handle)
        with explained(workload.target(client.flavour), client.flavour):
            return workload, podview.by_ordinal(client.pods(workload.selector), workload.name, ordinal)

    def status(self, handle: Handle) -> list[NodeStatus]:
        """Every pod of the workload from one list call, in node order."""
        return explain.statuses(self._pods(handle)[1])

    def nodes(self, handle: Handle) -> list[Node]:
        """The running pods, in node order."""
        workload, pods = self._pods(handle)
        running = podview.running_nodes(pods, flags.WORKSPACE)
        if not running:
            raise OperationError(f"no running pods of {workload.name} in {workload.namespace}: deploy first "
                                 f"(make deploy-cluster CLUSTER={workload.cluster_name})")
        return running

    def exec_argv(self, handle: Handle, node: Node, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  interactive: bool = False, stop_on_stdin_eof: bool = False,
                  secrets: Sequence[str] = ()) -> list[str]:
        """``kubectl exec -i [-t] -n NS POD -- env MLENV_NODE_RANK=N [K=V...] sh -c SCRIPT sh WORKSPACE ARGV...``:
        the pod's env has the rest of the contract (``-e``) and the operator's MASTER_ADDR/MASTER_PORT; the pod's
        default container is used (the operator's, not one mlenv names)."""
        namespace = self.workload(handle).namespace
        assignments = [f"{key}={value}" for key, value in {"MLENV_NODE_RANK": str(node.ordinal), **(env or {})}.items()]
        script = remote.script(stop_on_stdin_eof=stop_on_stdin_eof and not interactive, secrets=secrets)
        return [self.kubectl, "exec", "-i", *(["-t"] if interactive else []), "-n", namespace, node.name, "--",
                "env", *assignments, "sh", "-c", script, "sh", node.workspace, *argv]

    def copy_target(self, handle: Handle, node: Node) -> CopyTarget:
        """rsync runs ``RSH HOST rsync --server ...``: with RSH ``kubectl exec -i -n NS POD --`` and the host
        ``env``, the pod runs ``env rsync --server ...`` in its default container (kubernetes/rsh.py would name
        mlenv's own container, which Run:ai's pods do not have)."""
        return CopyTarget(destination=f"env:{node.workspace}/",
                          rsh=[self.kubectl, "exec", "-i", "-n", self.workload(handle).namespace, node.name, "--"])

    def _volumes(self, client: Client, workload: Workload) -> list[str]:
        if workload.workspace_claim is None:
            return []
        claims = client.select("persistentvolumeclaims", fields={"metadata.name": workload.workspace_claim})
        return [claim["metadata"]["name"] for claim in claims]

    def data_volumes(self, handle: Handle) -> list[str]:
        """The workspace PVC, if it exists (runai.existing_pvcs are never deleted)."""
        workload, client = self._connected(handle)
        with explained(workload.target(client.flavour), client.flavour):
            return self._volumes(client, workload)

    def clean(self, handle: Handle, delete_data: bool) -> None:
        """Delete the workload with runai (project-scoped), wait until its pods are gone; the workspace PVC only
        with ``delete_data``. Twice is fine."""
        workload, client = self._connected(handle)
        require([tool.login_check()])
        deleted = tool.run(commands.delete(workload.cli, workload.name, workload.project))
        if deleted.returncode == 0:
            info(f"deleted workload {workload.name} from project {workload.project}")
        elif tool.run(commands.describe(workload.cli, workload.name, workload.project)).returncode == 0:
            raise OperationError(f"runai did not delete {workload.name}: {tool.said(deleted)}")
        else:
            info(f"nothing to clean: no workload {workload.name} in project {workload.project}")
        with explained(workload.target(client.flavour), client.flavour):
            wait_pods_gone(client, workload.pods(client.flavour), CLEAN_TIMEOUT)
            volumes = self._volumes(client, workload)
            if delete_data:
                for claim in volumes:
                    client.run("delete", ["persistentvolumeclaim", claim, "--ignore-not-found", "--wait=false"])
        if volumes:
            info(f"deleted the workspace PVC {', '.join(volumes)}" if delete_data
                 else f"kept the workspace PVC {', '.join(volumes)}; mlenv clean --delete-data deletes it")

    def checks(self, plan: JobPlan) -> list[Check]:
        """runai present, logged in and of the file's generation; kubectl's server and login; the project; exec
        into its pods allowed; the Multus networks and the resources one pod asks for."""
        request = self.prepare(plan)
        workload = self.workload(request.handle)
        checks = self._runai_checks(request.payload)
        try:
            client = self._client(workload)
        except UsageError as exc:
            return [*checks, Check("kubectl", "FAIL", str(exc), "make install-system")]
        target = workload.target(client.flavour)
        login = check_login(client, target)[1]
        checks += [Check("kubectl", "PASS", client.binary), check_server(client, target), login]
        if login.status != "PASS":
            return checks
        checks.append(check_project(client, workload.project, workload.namespace))
        allowed = can_i(client, "create", "pods", workload.namespace, subresource="exec")
        checks.append(Check("may exec into pods", "PASS" if allowed else "FAIL",
                            f"kubectl auth can-i create pods --subresource=exec -n {workload.namespace}: "
                            f"{'yes' if allowed else 'no'} (shell, exec, sync and launch need it)",
                            None if allowed else f"ask your Run:ai admin for exec access in {workload.namespace}"))
        checks += check_networks(client, workload.namespace, plan.rdma_networks)
        return checks + check_allocatable(client, {GPU_RESOURCE: plan.gpus_per_node, **plan.rdma_resources})

    @staticmethod
    def _runai_checks(submission: commands.Submission) -> list[Check]:
        try:
            path = tool.binary()
        except UsageError as exc:
            return [Check("runai cli", "FAIL", str(exc), tool.INSTALL_HINT)]
        try:
            return [Check("runai cli", "PASS", path), tool.login_check(), tool.flags_check(submission)]
        except MlenvError as exc:
            return [Check("runai cli", "FAIL", str(exc))]
