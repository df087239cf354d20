"""Validate rendered objects: upstream Kubernetes schemas (strict) and the OpenShift/Multus CRDs.

A valid object is checked by validators compiled once per schema and kept on disk (mlenv.fastschema); only an
invalid one (an mlenv bug) imports jsonschema and kubernetes-validate, for the message.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any

import yaml

from mlenv.errors import OperationError
from mlenv.fastschema import Unsupported, compiled
from mlenv.fastschema.kubernetes import kubernetes_validator
from mlenv.fastschema.patterns import draft202012
from mlenv.runtime.records.jsonvalue import JsonObject, JsonValue

CRD_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "schemas", "crds")

CRD_FILES = {
    ("security.openshift.io/v1", "SecurityContextConstraints"): "securitycontextconstraints.security.openshift.io.yaml",
    ("route.openshift.io/v1", "Route"): "routes.route.openshift.io.yaml",
    ("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition"): "network-attachment-definitions.k8s.cni.cncf.io.yaml",
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): "podgroups.scheduling.volcano.sh.yaml",
}


def _strict_json_schema(node: JsonValue) -> JsonValue:
    """OpenAPI v3 (structural CRD schema) -> JsonValue Schema: honour ``nullable``; unknown fields are errors."""
    if isinstance(node, list):
        return [_strict_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted: JsonObject = {key: _strict_json_schema(value) for key, value in node.items()
                 if not key.startswith("x-") and value is not None}
    if node.get("nullable") and "type" in converted:
        converted["type"] = [converted["type"], "null"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields")
    if converted.get("type") == "object" and "properties" in converted and not preserve:
        converted.setdefault("additionalProperties", False)
    return converted


@cache
def crd_schema(api_version: str, kind: str) -> JsonObject:
    """The JsonValue Schema of a CRD-defined kind, from the CRDs shipped in the package."""
    with open(os.path.join(CRD_DIR, CRD_FILES[(api_version, kind)]), encoding="utf-8") as handle:
        crd = yaml.safe_load(handle)
    version = api_version.split("/")[1]
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            schema = _object(_strict_json_schema(entry["schema"]["openAPIV3Schema"]), "its schema")
            properties = _object(schema.setdefault("properties", {}), "its schema's properties")
            properties["metadata"] = {"type": "object"}
            properties.setdefault("apiVersion", {"const": api_version})
            properties.setdefault("kind", {"const": kind})
            return schema
    raise KeyError(f"{api_version} not served by {CRD_FILES[(api_version, kind)]}")


def _object(value: JsonValue, what: str) -> JsonObject:
    if not isinstance(value, dict):
        raise TypeError(f"{what} is not an object")
    return value


def kind_and_name(obj: JsonObject) -> tuple[str, str]:
    """A rendered object's kind and name (``None`` for one it lacks)."""
    meta = obj.get("metadata")
    return str(obj.get("kind")), str(meta.get("name") if isinstance(meta, dict) else None)


def _describe(obj: JsonObject) -> str:
    return "/".join(kind_and_name(obj))


@cache
def _fast(api_version: str, kind: str, kubernetes_version: str) -> Any:
    """The compiled validator of a kind, or None where only jsonschema can tell (then it does)."""
    try:
        if (api_version, kind) in CRD_FILES:
            crd = os.stat(os.path.join(CRD_DIR, CRD_FILES[(api_version, kind)]))
            code = os.stat(__file__)  # the CRD conversion lives here
            key = f"crd|{api_version}|{kind}|{crd.st_size}|{crd.st_mtime_ns}|{code.st_size}|{code.st_mtime_ns}"
            return compiled(key, lambda: (crd_schema(api_version, kind), {}))
        return kubernetes_validator(api_version, kind, kubernetes_version)
    except Unsupported:
        return None


def validate_object(obj: JsonObject, kubernetes_version: str) -> None:
    """Raise OperationError if ``obj`` is not valid for its kind (a rendering bug, never user input)."""
    key = (str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
    fast = _fast(*key, kubernetes_version)
    if fast is not None and fast(obj):
        return
    # lazy for the cold start of mlenv render: only an invalid object (an mlenv bug) needs jsonschema and
    # kubernetes-validate (below), for the message
    import jsonschema

    try:
        if key in CRD_FILES:
            draft202012()(crd_schema(*key)).validate(obj)
        else:
            import kubernetes_validate

            kubernetes_validate.validate(obj, kubernetes_version, strict=True)
    except jsonschema.ValidationError as exc:
        where = ".".join(str(p) for p in exc.absolute_path) or "(root)"
        raise OperationError(f"rendered {_describe(obj)} is invalid at {where}: {exc.message} "
                             f"(this is an mlenv bug: please report it)") from None
    except Exception as exc:
        if type(exc).__module__.startswith("kubernetes_validate"):
            raise OperationError(f"cannot validate {_describe(obj)} for Kubernetes {kubernetes_version}: {exc}; "
                                 f"set kubernetes_version in the cluster file to a supported version") from None
        raise
