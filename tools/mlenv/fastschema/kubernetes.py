"""Compiled validators for kubernetes-validate's strict schemas, located without importing kubernetes-validate.

Mirrors ``kubernetes_validate.validate(obj, version, strict=True)``: the schema directory is the newest shipped
version not newer than the requested one, the file ``<kind>-<group>-<version>.json`` with ``$ref``s into that
directory's ``_definitions.json``. Where that lookup would fail, :func:`kubernetes_validator` returns None and the
caller asks kubernetes-validate itself, which reports the problem. Stdlib string operations only (no ``re``): this
module is on the fast path.
"""

from __future__ import annotations

import os
from importlib.machinery import PathFinder

from mlenv.fastschema import compiled_files

TYPE_CHECKING = False
if TYPE_CHECKING:
    from mlenv.fastschema import Validator

SUFFIX = "-local-strict"


def _digits(text: str) -> str:
    """The leading decimal digits of ``text``."""
    end = 0
    while end < len(text) and text[end].isdecimal():
        end += 1
    return text[:end]


def _major_minor(version: str) -> str:
    """kubernetes-validate's ``re.sub(r'^(\\d+\\.\\d+).*', r'\\1', version)``."""
    major, dot, rest = version.partition(".")
    minor = _digits(rest)
    return f"{major}.{minor}" if dot and major.isdecimal() and minor else version


def _group_version(api_version: str) -> str:
    """kubernetes-validate's ``re.sub(r'^([^./]*)(?:\\.[^/]*)?/', r'\\1-', api_version)``: rbac.authorization.k8s.io/v1
    -> rbac-v1."""
    group, slash, version = api_version.partition("/")
    return f"{group.split('.')[0]}-{version}" if slash else api_version


def _shipped_version(name: str) -> tuple[int, ...] | None:
    """(1, 30, 0) for the directory name v1.30.0-local-strict."""
    parts = name[1:-len(SUFFIX)].split(".") if name.startswith("v") and name.endswith(SUFFIX) else []
    return tuple(map(int, parts)) if len(parts) == 3 and all(part.isdecimal() for part in parts) else None


def schema_directory(kubernetes_version: str) -> str | None:
    """The strict schema directory kubernetes-validate uses for ``kubernetes_version``, or None."""
    spec = PathFinder.find_spec("kubernetes_validate")
    if spec is None or not spec.submodule_search_locations:
        return None
    top = os.path.join(spec.submodule_search_locations[0], "kubernetes-json-schema")
    try:
        shipped = sorted(filter(None, map(_shipped_version, os.listdir(top))))
    except OSError:
        return None
    versions = [".".join(map(str, version)) for version in shipped]
    wanted = _major_minor(kubernetes_version.removeprefix("v"))
    # kubernetes-validate compares these version strings as strings; so does this, to pick the same directory
    usable = [version for version in versions if _major_minor(version) <= wanted]
    if not versions or wanted > versions[-1] or not usable:
        return None
    return os.path.join(top, f"v{usable[-1]}{SUFFIX}")


def kubernetes_validator(api_version: str, kind: str, kubernetes_version: str) -> Validator | None:
    """``is_valid(obj)`` for ``kind`` in ``api_version`` on Kubernetes ``kubernetes_version`` (strict: unknown
    fields are errors), or None where kubernetes-validate has no such schema. Raises Unsupported (never for the
    kinds mlenv renders) where the schema needs jsonschema itself."""
    directory = schema_directory(kubernetes_version)
    if directory is None:
        return None
    try:
        return compiled_files(os.path.join(directory, f"{kind.lower()}-{_group_version(api_version)}.json"),
                              os.path.join(directory, "_definitions.json"))
    except FileNotFoundError:
        return None
