"""Just enough OpenAPI v3 for kubectl: before ``apply``/``create`` it checks, per kind, that the PATCH operation
accepts the ``fieldValidation`` query parameter (then it leaves validation to the server). Without an OpenAPI
document kubectl refuses to send anything unless told ``--validate=false``.

Create-only kinds (SubjectAccessReview) get that PATCH operation too: without it kubectl falls back to the
protobuf ``/openapi/v2``, which the fake does not serve, and ``kubectl create -f`` would fail."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Set as AbstractSet
from typing import Any

from .resources import RESOURCES, ResourceType, group_versions


def _prefix(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _object_path(rt: ResourceType) -> str:
    scope = "namespaces/{namespace}/" if rt.namespaced else ""
    return f"/{_prefix(rt.group, rt.version)}/{scope}{rt.plural}/{{name}}"


def group_version_document(group: str, version: str) -> dict[str, Any] | None:
    """The OpenAPI v3 document of one group-version: a PATCH operation per writable kind, nothing more."""
    members = [r for r in RESOURCES
               if (r.group, r.version) == (group, version) and {"create", "patch"} & set(r.verbs)]
    if not members:
        return None
    paths = {
        _object_path(rt): {"patch": {
            "operationId": f"patch{rt.kind}",
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
            "parameters": [
                {"name": name, "in": "query", "schema": {"type": "string"}}
                for name in ("dryRun", "fieldManager", "fieldValidation", "force")
            ],
            "responses": {"200": {"description": "OK"}},
        }}
        for rt in members
    }
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.4"}, "paths": paths,
            "components": {"schemas": {}}}


def root_document(hidden: AbstractSet[str] = frozenset()) -> dict[str, Any]:
    """``/openapi/v3``: where each group-version's document is, with a content hash for kubectl's cache;
    ``hidden``: API groups left out."""
    paths = {}
    for group, version in [("", "v1"), *group_versions(hidden)]:
        document = group_version_document(group, version)
        if document is not None:
            digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:32].upper()
            prefix = _prefix(group, version)
            paths[prefix] = {"serverRelativeURL": f"/openapi/v3/{prefix}?hash={digest}"}
    return {"paths": paths}


def document_at(path: str, hidden: AbstractSet[str] = frozenset()) -> dict[str, Any] | None:
    """The document served at ``/openapi/v3/api/v1`` or ``/openapi/v3/apis/<group>/<version>``, or None."""
    parts = path.removeprefix("/openapi/v3/").split("/")
    if parts[0] == "api" and len(parts) == 2:
        return group_version_document("", parts[1])
    if parts[0] == "apis" and len(parts) == 3 and parts[1] not in hidden:
        return group_version_document(parts[1], parts[2])
    return None
