"""Cluster files: load (YAML with positions) -> validate (schema + semantics) -> model."""

from __future__ import annotations

from mlenv.config.model import Cluster


def load_cluster(name_or_path: str) -> Cluster:
    """Find, parse and validate a cluster file given by name (clusters/NAME.yaml) or by path."""
    from mlenv.config.discover import resolve
    from mlenv.config.load import load_file
    from mlenv.config.validate import validate

    path, shown = resolve(name_or_path)
    return validate(load_file(path, shown))


__all__ = ["Cluster", "load_cluster"]
