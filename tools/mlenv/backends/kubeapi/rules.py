"""Rules every backend that deploys pods through a Kubernetes API applies (OpenShift/Kubernetes, Run:ai)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mlenv.plan import JobPlan

SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", "openshift"})


def namespace_problem(namespace: str) -> str | None:
    """Why mlenv must not deploy into ``namespace``, or None."""
    if namespace in SYSTEM_NAMESPACES or namespace.startswith("openshift-"):
        return (f"{namespace} is a system namespace; deploy into a namespace of your own "
                f"(oc new-project NAME, or kubectl create namespace NAME)")
    return None


def rdma_warning(plan: JobPlan) -> list[str]:
    """The warning when RDMA mode would give the pods no RDMA device (Kubernetes and Run:ai pods alike)."""
    if plan.mode == "rdma" and not plan.rdma_networks and not plan.rdma_resources:
        return ["RDMA mode without network.rdma.networks or network.rdma.resources: pods will get no RDMA device "
                "and NCCL will fall back to sockets; add the Multus network names "
                "(oc get network-attachment-definitions) or the device-plugin resource (e.g. rdma/rdma: 1)"]
    return []
