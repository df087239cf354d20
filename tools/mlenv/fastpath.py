"""Replay cached output of read-only commands (``--help``, ``render`` to stdout) without importing click,
jinja2 or jsonschema. Stdlib only, imported by the console script before anything else.

An entry is valid only while every input is unchanged: the arguments, the cluster file's bytes, and the
size and mtime of every file of the mlenv package and of manifests/. Anything else runs normally.
Entries are ``marshal`` data (stdlib, faster to import and read than json; a Python upgrade just misses).
"""

from __future__ import annotations

import marshal
import os
import sys
import zlib

PACKAGE = os.path.dirname(os.path.abspath(__file__))
CACHED_COMMANDS = ("render",)


def _root() -> str:
    """Same rule as mlenv.config.discover.project_root, without importing it."""
    if env := os.environ.get("MLENV_HOME"):
        return env
    here = os.getcwd()
    while True:
        if os.path.isdir(os.path.join(here, "clusters")) and os.path.isdir(os.path.join(here, "manifests")):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return os.path.dirname(os.path.dirname(PACKAGE))
        here = parent


def _tree_stamp(top: str) -> list[list[object]]:
    stamp: list[list[object]] = []
    for directory, subdirs, files in os.walk(top):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith((".pyc", ".pyo")):
                info = os.stat(os.path.join(directory, name))
                stamp.append([os.path.join(directory, name), info.st_mtime_ns, info.st_size])
    return stamp


def _terminal_width() -> int | None:
    """Help text is wrapped to the terminal, so its width is an input."""
    try:
        return os.get_terminal_size(2).columns
    except OSError:
        return None


def _cluster_file(root: str, argv: list[str]) -> str | None:
    ref = argv[1]
    if ref.endswith((".yaml", ".yml")) or os.sep in ref:
        return os.path.abspath(ref)
    return os.path.join(root, "clusters", ref + ".yaml")


def _inputs(argv: list[str]) -> dict[str, object] | None:
    """Everything the output of ``argv`` depends on, or None when ``argv`` is not cacheable."""
    if argv in ([], ["--help"], ["-h"]):
        cluster = None
    elif (len(argv) >= 2 and argv[0] in CACHED_COMMANDS and not argv[1].startswith("-")
          and not {"-o", "--output", "-h", "--help"} & set(argv)):
        cluster = argv[1]
    else:
        return None
    root = _root()
    inputs: dict[str, object] = {"argv": argv, "root": root, "package": _tree_stamp(PACKAGE),
                                 "width": _terminal_width()}
    if cluster is not None:
        path = _cluster_file(root, argv)
        try:
            with open(str(path), "rb") as handle:
                inputs["cluster"] = handle.read().decode("utf-8", "surrogateescape")
        except OSError:
            return None
        inputs["manifests"] = _tree_stamp(os.path.join(root, "manifests"))
    return inputs


def _entry_path(root: str, argv: list[str]) -> str:
    name = f"{zlib.crc32(chr(0).join(argv).encode()):08x}-py{sys.hexversion:x}.bin"
    return os.path.join(root, ".mlenv", "cache", "cli", name)


def lookup(argv: list[str]) -> tuple[dict[str, object] | None, dict[str, str] | None]:
    """(inputs, cached output) for ``argv``; inputs is None when the command is not cacheable."""
    inputs = _inputs(argv)
    if inputs is None:
        return None, None
    try:
        with open(_entry_path(str(inputs["root"]), argv), "rb") as handle:
            entry = marshal.load(handle)  # noqa: S302 - our own cache in the project, written by store()
    except (OSError, ValueError, EOFError, TypeError):
        return inputs, None
    if not isinstance(entry, dict):
        return inputs, None
    return inputs, (entry["output"] if entry.get("inputs") == inputs else None)


def store(inputs: dict[str, object], stdout: str, stderr: str) -> None:
    """Remember the output of a successful run; failures to write the cache are ignored."""
    path = _entry_path(str(inputs["root"]), list(inputs["argv"]))  # type: ignore[call-overload]
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as handle:
            marshal.dump({"inputs": inputs, "output": {"stdout": stdout, "stderr": stderr}}, handle)
        os.replace(tmp, path)
    except (OSError, ValueError):
        return
