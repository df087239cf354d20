"""What every backend provides. A backend maps a handful of verbs onto its tool; shared workflows
(fan-out exec, parallel sync, log prefixing, fail-fast launch) live in ``mlenv.ops``."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from mlenv.plan import Deployment


@dataclass(frozen=True)
class Pod:
    """One node of a deployment, as ops need it."""

    ordinal: int
    name: str
    workspace: str
    """Absolute path of the workspace inside the pod (``/workspace`` on clusters, a directory locally)."""
    ip: str | None = None
    ready: bool = False


@dataclass(frozen=True)
class PodStatus:
    """One row of ``mlenv status``."""

    name: str
    ordinal: int
    node: str | None
    phase: str
    ready: bool
    restarts: int
    gpus: int
    ip: str | None
    rdma_devices: str | None = None
    detail: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CopyTarget:
    """How rsync reaches a pod's workspace: an optional remote shell (``rsync -e``) and a destination."""

    destination: str
    rsh: Sequence[str] | None = None


class Backend(Protocol):
    """The verbs a backend maps onto its tool. Only backends have side effects on the outside world."""

    name: str

    def deploy(self, deployment: Deployment, timeout: int, on_applied: Callable[[], None] | None = None) -> None:
        """Create or converge the deployment and wait until every pod is Ready (OperationError on failure).

        ``on_applied`` runs as soon as the first change reaches the cluster (before waiting), so a deployment
        that fails half-way is still recorded and can be inspected, re-deployed or cleaned.
        """

    def status(self, deployment: Deployment) -> list[PodStatus]:
        """Every pod of the deployment, in ordinal order."""

    def pods(self, deployment: Deployment) -> list[Pod]:
        """The running pods, in ordinal order; OperationError when there are none."""

    def exec_argv(self, deployment: Deployment, pod: Pod, argv: Sequence[str], *,
                  env: Mapping[str, str] | None = None, interactive: bool = False,
                  stop_on_stdin_eof: bool = False) -> list[str]:
        """A local command line that runs ``argv`` inside ``pod`` (cwd = its workspace, ``env`` added).

        With ``stop_on_stdin_eof`` the command gets no stdin and is stopped (SIGTERM) when the local command's
        stdin closes: killing the local side then stops the remote side too, which a plain remote exec does not.
        """

    def copy_target(self, deployment: Deployment, pod: Pod) -> CopyTarget:
        """Where ``rsync`` copies the workspace of ``pod`` to."""

    def logs_argv(self, deployment: Deployment, pod: Pod, follow: bool) -> list[str]:
        """A local command line that prints (or follows) the pod's own log."""

    def data_volumes(self, deployment: Deployment) -> list[str]:
        """Names of what ``clean(delete_data=True)`` deletes beyond the pods: the data volumes (PVCs on clusters,
        workspace directories locally), so ``clean --delete-data`` can list them before asking."""

    def clean(self, deployment: Deployment, delete_data: bool) -> None:
        """Delete everything the deployment created (data only when asked) and wait until pods are gone."""
