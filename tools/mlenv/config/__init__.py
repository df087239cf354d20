"""Cluster files: load (YAML with positions) -> validate (schema + semantics) -> model. What the backend registry
says of each backend (``reader.BackendTable``) is handed down by the caller (``mlenv.core.clusters``)."""

# load_cluster imports discover, load and validate when called (validate ~27 ms): importing the package for its
# types costs none of them.
from __future__ import annotations

from mlenv.config.model import Cluster
from mlenv.config.reader import BackendTable


def load_cluster(name_or_path: str, table: BackendTable) -> Cluster:
    """Find, parse and validate a cluster file given by name (clusters/NAME.yaml) or by path."""
    from mlenv.config.discover import resolve
    from mlenv.config.load import load_file
    from mlenv.config.validate import validate

    path, shown = resolve(name_or_path)
    return validate(load_file(path, shown), table)


__all__ = ["BackendTable", "Cluster", "load_cluster"]
