"""Find cluster files: by name in clusters/, or by path."""

from __future__ import annotations

import os
from pathlib import Path

from mlenv.errors import UsageError, shown


def project_root() -> Path:
    """The mlenv checkout: $MLENV_HOME, else the nearest parent of the cwd with clusters/ and manifests/,
    else the directory this package was installed from."""
    if env := os.environ.get("MLENV_HOME"):
        return Path(env)
    cwd = Path.cwd()
    for candidate in (cwd, *cwd.parents):
        if (candidate / "clusters").is_dir() and (candidate / "manifests").is_dir():
            return candidate
    return Path(__file__).resolve().parents[3]


def clusters_dir() -> Path:
    """Where named cluster files live."""
    return project_root() / "clusters"


def cluster_names() -> list[str]:
    """Names of the cluster files in clusters/ (template.yaml is a template, not a cluster)."""
    return sorted(p.stem for p in clusters_dir().glob("*.yaml") if p.stem != "template")


def resolve(name_or_path: str) -> tuple[Path, str]:
    """A cluster name or a path -> (file path, path to show in messages). Names and paths in messages are
    ``shown``: an invisible character or a newline in them is escaped, never printed."""
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        path = Path(name_or_path)
        if not path.exists():  # anything else (a directory, a pipe, a device) the loader refuses by name
            raise UsageError(f"cluster file {shown(name_or_path)} not found")
        return path, name_or_path
    path = clusters_dir() / f"{name_or_path}.yaml"
    if path.exists():
        return path, os.path.relpath(path) if path.is_relative_to(Path.cwd()) else str(path)
    import difflib

    names = cluster_names()
    close = difflib.get_close_matches(name_or_path, names, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise UsageError(f"unknown cluster '{shown(name_or_path)}': {hint}known clusters: {', '.join(names) or 'none'} "
                     f"(or give a path to a YAML file)")
