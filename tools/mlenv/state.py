"""The active deployment, recorded by ``deploy`` in .mlenv/state.json so later commands need no CLUSTER=."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from mlenv.errors import UsageError


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


def forget(cluster_file: str) -> None:
    """Drop the record if it names ``cluster_file`` (after a clean)."""
    path = state_file()
    try:
        if json.loads(path.read_text()).get("cluster_file") == cluster_file:
            path.unlink()
    except (FileNotFoundError, ValueError):
        return
