"""Cluster files read with the backend registry's rules handed down to ``mlenv.config`` (which imports nothing
above it), and planned."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlenv import config
from mlenv.config.schema import cluster_schema as composed
from mlenv.config.validate import validate as validated
from mlenv.core.registry import CONFIG_RULES
from mlenv.plan import plan
from mlenv.runtime.records.jsonvalue import JsonObject

if TYPE_CHECKING:
    from mlenv.config.load import LoadedFile
    from mlenv.config.model import Cluster
    from mlenv.plan import JobPlan


def load_cluster(cluster_ref: str) -> Cluster:
    """Find, parse and validate a cluster file given by name (clusters/NAME.yaml) or by path."""
    return config.load_cluster(cluster_ref, CONFIG_RULES)


def validate(loaded: LoadedFile) -> Cluster:
    """Schema-check then semantically check a loaded cluster file."""
    return validated(loaded, CONFIG_RULES)


def cluster_schema() -> JsonObject:
    """The cluster file schema: the common one plus every registered backend's section."""
    return composed(CONFIG_RULES)


def load_plan(cluster_ref: str, mode: str | None = None, nodes: int | None = None,
              image: str | None = None) -> JobPlan:
    """Load, validate and plan the cluster file ``cluster_ref`` (a name in clusters/ or a path)."""
    return plan(load_cluster(cluster_ref), mode=mode, nodes=nodes, image=image)
