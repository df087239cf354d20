"""The merged kubeconfig, read the way kubectl and oc read it, without starting either: the files of
``$KUBECONFIG`` (``os.pathsep``-separated, empty entries skipped), else ``~/.kube/config``; the first file that sets
``current-context`` wins, and the first file that defines a context or cluster name wins for that name. Same shape
as ``kubectl config view -o json`` (what ``status`` needs of it: the current context's server; a second CLI start
would cost as much as the list call itself)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class KubeconfigError(Exception):
    """A kubeconfig file that cannot be read or is not a kubeconfig."""


def files(environ: Mapping[str, str]) -> list[Path]:
    """The kubeconfig files kubectl would read, in precedence order (missing ones left out, as kubectl does)."""
    listed = environ.get("KUBECONFIG")
    paths = ([Path(p) for p in listed.split(os.pathsep) if p] if listed
             else [Path(environ.get("HOME") or Path.home()) / ".kube" / "config"])
    return [path for path in paths if path.is_file()]


def merged(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``{"current-context", "contexts": [...], "clusters": [...]}`` merged over :func:`files`."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    result: dict[str, Any] = {"current-context": "", "contexts": [], "clusters": []}
    for path in files(os.environ if environ is None else environ):
        try:
            config = yaml.load(path.read_text(), Loader=loader) or {}  # noqa: S506 - a safe loader
        except (OSError, yaml.YAMLError) as exc:
            raise KubeconfigError(f"{path}: {exc}") from None
        if not isinstance(config, dict):
            raise KubeconfigError(f"{path}: not a kubeconfig (a {type(config).__name__})")
        if not result["current-context"] and config.get("current-context"):
            result["current-context"] = str(config["current-context"])
        for key in ("contexts", "clusters"):
            known = {entry.get("name") for entry in result[key]}
            result[key] += [entry for entry in config.get(key) or [] if isinstance(entry, dict)
                            and entry.get("name") not in known]
    return result
