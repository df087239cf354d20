"""Find cluster files: by name in clusters/, or by path. (os.path, not pathlib: finding a file is on the path of
every command, and pathlib costs more to import than all of this.)"""

# pathlib (~17 ms) and difflib (~9 ms) are imported only where a path is returned or a name is misspelt.
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from mlenv.errors import UsageError, shown

if TYPE_CHECKING:
    from pathlib import Path


def root() -> str:
    """The mlenv checkout: $MLENV_HOME, else the nearest parent of the cwd with clusters/ and manifests/,
    else the directory this package was installed from."""
    if env := os.environ.get("MLENV_HOME"):
        return env
    here = os.getcwd()
    while True:
        if os.path.isdir(os.path.join(here, "clusters")) and os.path.isdir(os.path.join(here, "manifests")):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))))
        here = parent


def project_root() -> Path:
    """``root()`` as a Path."""
    from pathlib import Path

    return Path(root())


def clusters_dir() -> Path:
    """Where named cluster files live."""
    return project_root() / "clusters"


def cluster_names() -> list[str]:
    """Names of the cluster files in clusters/ (template.yaml is a template, not a cluster)."""
    directory = os.path.join(root(), "clusters")
    entries = os.listdir(directory) if os.path.isdir(directory) else []
    return sorted(name[:-5] for name in entries if name.endswith(".yaml") and name != "template.yaml")


def resolve(name_or_path: str) -> tuple[str, str]:
    """A cluster name or a path -> (file path, path to show in messages). Names and paths in messages are
    ``shown``: an invisible character or a newline in them is escaped, never printed."""
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        if not os.path.lexists(name_or_path):  # anything else (a directory, a pipe, a device) the loader refuses
            raise UsageError(f"cluster file {shown(name_or_path)} not found")
        return name_or_path, name_or_path
    path = os.path.join(root(), "clusters", f"{name_or_path}.yaml")
    if os.path.exists(path):
        relative = os.path.relpath(path)
        return path, relative if not relative.startswith("..") else path
    import difflib

    names = cluster_names()
    close = difflib.get_close_matches(name_or_path, names, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    raise UsageError(f"unknown cluster '{shown(name_or_path)}': {hint}known clusters: {', '.join(names) or 'none'} "
                     f"(or give a path to a YAML file)")
