"""The merged kubeconfig, read the way kubectl and oc read it, without starting either: the files of
``$KUBECONFIG`` (``os.pathsep``-separated, empty entries skipped), else ``~/.kube/config``; the first file that sets
``current-context`` wins, and the first file that defines a context or cluster name wins for that name. Same shape
as ``kubectl config view -o json`` (what ``status`` needs of it: the current context's server; a second CLI start
would cost as much as the list call itself)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict, TypeVar

import yaml


class Server(TypedDict, total=False):
    """A cluster entry's ``cluster``: its server."""

    server: str


class NamedCluster(TypedDict, total=False):
    """An entry of ``clusters``."""

    name: str
    cluster: Server


class ContextEntry(TypedDict, total=False):
    """A context entry's ``context``: its cluster and namespace."""

    cluster: str
    namespace: str


class NamedContext(TypedDict, total=False):
    """An entry of ``contexts``."""

    name: str
    context: ContextEntry


Kubeconfig = TypedDict("Kubeconfig", {"current-context": str, "contexts": list[NamedContext],
                                      "clusters": list[NamedCluster]})
"""What :func:`merged` returns: the part of ``kubectl config view -o json`` that mlenv reads."""
Named = TypeVar("Named", NamedContext, NamedCluster)


class KubeconfigError(Exception):
    """A kubeconfig file that cannot be read or is not a kubeconfig."""


def files(environ: Mapping[str, str]) -> list[Path]:
    """The kubeconfig files kubectl would read, in precedence order (missing ones left out, as kubectl does)."""
    listed = environ.get("KUBECONFIG")
    paths = ([Path(p) for p in listed.split(os.pathsep) if p] if listed
             else [Path(environ.get("HOME") or Path.home()) / ".kube" / "config"])
    return [path for path in paths if path.is_file()]


def merged(environ: Mapping[str, str] | None = None) -> Kubeconfig:
    """``{"current-context", "contexts": [...], "clusters": [...]}`` merged over :func:`files`."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    result: Kubeconfig = {"current-context": "", "contexts": [], "clusters": []}
    for path in files(os.environ if environ is None else environ):
        try:
            config = yaml.load(path.read_text(), Loader=loader) or {}  # noqa: S506 - a safe loader
        except (OSError, yaml.YAMLError) as exc:
            raise KubeconfigError(f"{path}: {exc}") from None
        if not isinstance(config, dict):
            raise KubeconfigError(f"{path}: not a kubeconfig (a {type(config).__name__})")
        if not result["current-context"] and config.get("current-context"):
            result["current-context"] = str(config["current-context"])
        result["contexts"] += _new(result["contexts"], config.get("contexts"))
        result["clusters"] += _new(result["clusters"], config.get("clusters"))
    return result


def _new(known: list[Named], listed: object) -> list[Named]:
    """The entries of a file's ``listed`` (contexts or clusters) whose names ``known`` lacks: the first wins."""
    names = {entry.get("name") for entry in known}
    entries: list[Any] = listed if isinstance(listed, list) else []
    return [entry for entry in entries if _named_other(entry, names)]


def _named_other(entry: object, names: set[str | None]) -> bool:
    return isinstance(entry, dict) and entry.get("name") not in names
