"""The active deployment, recorded by ``deploy`` in .mlenv/state.json so later commands need no CLUSTER=."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mlenv.errors import UsageError

if TYPE_CHECKING:
    from mlenv.plan import Deployment


@dataclass(frozen=True)
class ActiveDeployment:
    """Enough to re-plan the deployment: the cluster file, mode, node count and image."""

    cluster_file: str
    mode: str
    nodes: int
    image: str | None
    namespace: str
    app: str
    backend: str


def state_file() -> Path:
    """.mlenv/state.json in the project root."""
    from mlenv.config.discover import project_root

    return project_root() / ".mlenv" / "state.json"


def save(active: ActiveDeployment) -> None:
    """Record ``active`` atomically."""
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(active), indent=2) + "\n")
    os.replace(tmp, path)


def load() -> ActiveDeployment:
    """The recorded deployment; UsageError naming the fix when there is none."""
    path = state_file()
    try:
        data = json.loads(path.read_text())
        return ActiveDeployment(**data)
    except FileNotFoundError:
        raise UsageError("no deployment recorded: deploy first (make deploy-cluster CLUSTER=NAME) "
                         "or name one with CLUSTER=NAME / --cluster NAME") from None
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{path} is corrupt ({exc}); remove it and deploy again") from None


def record(deployment: Deployment, image: str | None = None) -> None:
    """Make ``deployment`` the active one (``image`` only when it overrides the cluster file's)."""
    save(ActiveDeployment(
        cluster_file=cluster_key(deployment), mode=deployment.mode, nodes=deployment.nodes, image=image,
        namespace=deployment.namespace, app=deployment.app, backend=deployment.cluster.backend))


def cluster_key(deployment: Deployment) -> str:
    """How the record names a deployment's cluster file: its absolute path."""
    return str(Path(deployment.cluster.source).resolve())


def forget(deployment: Deployment) -> None:
    """Drop the record if it is ``deployment``'s (after a clean)."""
    path = state_file()
    try:
        if json.loads(path.read_text()).get("cluster_file") == cluster_key(deployment):
            path.unlink()
    except (FileNotFoundError, ValueError):
        return
