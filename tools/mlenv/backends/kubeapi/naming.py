"""Kubernetes names of a job plan: objects, labels, the headless Service's DNS, the ServiceAccount and the SCC.
The one place these naming rules live; templates, status and clean all read them from here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from mlenv.config.model import Cluster

if TYPE_CHECKING:  # not imported by status, which needs the names only
    from mlenv.plan import JobPlan

CONTAINER = "ml-dev"
"""The container of every pod (statefulset.yaml.j2)."""
WORKSPACE = "/workspace"
"""Where the workspace volume is mounted in every pod."""
WORKSPACE_CLAIM = "ml-dev-workspace"
DATASETS_CLAIM = "ml-datasets"
IPC_LOCK_SCC = "mlenv-ipc-lock"
INSTANCE_LABEL = "app.kubernetes.io/instance"
MANAGED_BY = {"app.kubernetes.io/managed-by": "mlenv"}
DATA_KIND = "PersistentVolumeClaim"
class StorageClaims(NamedTuple):
    """The plan's storage intent with the claim names."""

    shared: bool
    storage_class: str | None
    workspace_size: str
    datasets_size: str
    shm_size: str
    workspace_claim: str = WORKSPACE_CLAIM
    datasets_claim: str = DATASETS_CLAIM


class KubeDeployment(NamedTuple):
    """What the templates render: the plan in Kubernetes terms."""

    plan: JobPlan
    openshift: bool
    cluster: Cluster
    app: str
    namespace: str
    nodes: int
    image: str
    service_account: str
    headless_service: str
    master_port: int
    labels: Mapping[str, str]
    selector: Mapping[str, str]
    annotations: Mapping[str, str]
    env: Mapping[str, str]
    storage: StorageClaims
    rdma_networks: tuple[str, ...]
    rdma_resources: Mapping[str, int]
    ipc_lock: bool
    ipc_lock_scc: str | None
    network_policy: bool
    run_as_user: int | None
    run_as_non_root: bool
    excluded: tuple[str, ...] = ()
    """Kubernetes nodes the pods are kept off (exclusion.py)."""


def match_labels(app: str) -> dict[str, str]:
    """The StatefulSet's and the Service's pod selector (``app=<app>-multi``, as the original toolkit)."""
    return {"app": f"{app}-multi", INSTANCE_LABEL: app}


def instance(app: str) -> dict[str, str]:
    """The label that lists a deployment's pods (and StatefulSet)."""
    return {INSTANCE_LABEL: app}


def run_secret(app: str) -> str:
    """The Secret that holds a detached run's control secret, forwarded secrets and id: the pod template reads it
    (an optional ``secret`` volume), so a pod that comes back after a preemption can resume the run."""
    return f"{app}-run"


def owned_labels(app: str) -> dict[str, str]:
    """What every object mlenv created for ``app`` carries: status and clean select by these."""
    return {INSTANCE_LABEL: app, **MANAGED_BY}


GRANT_KINDS = ("role", "rolebinding")
"""What scheduling.move_faulty_pods adds: the Role that lets the pods move themselves, and its binding. Deleted by
:func:`grant_labels`, never by kind and mlenv's labels alone: an admin's SCC Role carries those too."""


def grant_labels(app: str) -> dict[str, str]:
    """What the Role of scheduling.move_faulty_pods and its binding carry (and are deleted by)."""
    return {**owned_labels(app), "mlenv.io/grant": "move-pods"}


def mover_account(app: str) -> str:
    """The ServiceAccount of a deployment whose pods may move (scheduling.move_faulty_pods): its own, never one
    another deployment's pods run as, bound to its Role alone; only the pods' mover mounts its token."""
    return f"{app}-move-pods"


def pod_dns(app: str, namespace: str, ordinal: int) -> str:
    """Stable DNS name of pod ``ordinal`` behind the headless Service."""
    return f"{app}-{ordinal}.{headless_service(app)}.{namespace}.svc.cluster.local"


def headless_service(app: str) -> str:
    """The headless Service that gives each pod its DNS name."""
    return f"{app}-headless"


def kube_deployment(plan: JobPlan, openshift: bool) -> KubeDeployment:
    """``plan`` in Kubernetes terms (``openshift``: the SCC applies and pods must run as non-root)."""
    cluster = plan.cluster
    app, namespace = plan.app, str(cluster.info.namespace)
    labels = {**match_labels(app), "app.kubernetes.io/name": app, **MANAGED_BY, "app.kubernetes.io/part-of": "mlenv"}
    annotations = {"mlenv.io/cluster": cluster.info.name, "mlenv.io/mode": plan.mode}
    if cluster.info.description:
        annotations["mlenv.io/description"] = cluster.info.description
    intent = plan.storage
    return KubeDeployment(
        plan=plan,
        openshift=openshift,
        cluster=cluster,
        app=app,
        namespace=namespace,
        nodes=plan.nodes,
        image=plan.image,
        service_account=mover_account(app) if cluster.scheduling.move_faulty_pods else cluster.security.service_account,
        headless_service=headless_service(app),
        master_port=int(plan.env["MASTER_PORT"]),
        labels=labels,
        selector=match_labels(app),
        annotations=annotations,
        env={"MASTER_ADDR": pod_dns(app, namespace, 0), **plan.env},
        storage=StorageClaims(intent.shared, intent.storage_class, intent.workspace_size, intent.datasets_size,
                        intent.shm_size),
        rdma_networks=plan.rdma_networks,
        rdma_resources=plan.rdma_resources,
        ipc_lock=plan.ipc_lock,
        ipc_lock_scc=IPC_LOCK_SCC if plan.ipc_lock and openshift else None,
        network_policy=cluster.security.network_policy,
        run_as_user=cluster.security.run_as_user,
        run_as_non_root=openshift or bool(cluster.security.run_as_user),
        excluded=plan.excluded,
    )


class KubeHandle(NamedTuple):
    """A deployment on a cluster, as its recorded handle names it: enough to operate it without the cluster file."""

    app: str
    namespace: str
    nodes: int
    flavour: str
    """``oc`` (OpenShift) or ``kubectl``."""
    api: str | None
    cluster_name: str
    cluster_file: str
    kinds: tuple[str, ...]
    """What clean deletes, dependants first (PVCs only with --delete-data)."""
    service_account: str
    ipc_lock_scc: str | None

    @property
    def openshift(self) -> bool:
        """Whether the cluster file said OpenShift."""
        return self.flavour == "oc"

    def to_data(self) -> dict[str, object]:
        """The backend-specific part of the handle."""
        return {"app": self.app, "namespace": self.namespace, "flavour": self.flavour, "api": self.api,
                "cluster_name": self.cluster_name, "cluster_file": self.cluster_file, "kinds": list(self.kinds),
                "service_account": self.service_account, "ipc_lock_scc": self.ipc_lock_scc}

    @classmethod
    def from_data(cls, data: Mapping[str, object], nodes: int) -> KubeHandle:
        """Inverse of ``to_data``; TypeError/KeyError on a record of another shape."""
        kinds = data["kinds"]
        if not isinstance(kinds, list):
            raise TypeError("kinds is not a list")
        return cls(app=str(data["app"]), namespace=str(data["namespace"]), nodes=nodes,
                   flavour=str(data["flavour"]), api=None if data.get("api") is None else str(data["api"]),
                   cluster_name=str(data["cluster_name"]), cluster_file=str(data["cluster_file"]),
                   kinds=tuple(str(kind) for kind in kinds), service_account=str(data["service_account"]),
                   ipc_lock_scc=None if data.get("ipc_lock_scc") is None else str(data["ipc_lock_scc"]))
