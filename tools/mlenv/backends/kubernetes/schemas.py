"""Validate rendered objects: upstream Kubernetes schemas (strict) and the OpenShift/Multus CRDs."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml

from mlenv.errors import OperationError

CRD_FILES = {
    ("security.openshift.io/v1", "SecurityContextConstraints"): "securitycontextconstraints.security.openshift.io.yaml",
    ("route.openshift.io/v1", "Route"): "routes.route.openshift.io.yaml",
    ("k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition"): "network-attachment-definitions.k8s.cni.cncf.io.yaml",
}


def _strict_json_schema(node: Any) -> Any:
    """OpenAPI v3 (structural CRD schema) -> JSON Schema: honour ``nullable``; unknown fields are errors."""
    if isinstance(node, list):
        return [_strict_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _strict_json_schema(value) for key, value in node.items() if not key.startswith("x-")}
    if node.get("nullable") and "type" in converted:
        converted["type"] = [converted["type"], "null"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields")
    if converted.get("type") == "object" and "properties" in converted and not preserve:
        converted.setdefault("additionalProperties", False)
    return converted


@cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    """The JSON Schema of a CRD-defined kind, from the CRDs shipped in the package."""
    text = resources.files("mlenv.schemas").joinpath("crds", CRD_FILES[(api_version, kind)]).read_text()
    crd = yaml.safe_load(text)
    version = api_version.split("/")[1]
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            schema: dict[str, Any] = _strict_json_schema(entry["schema"]["openAPIV3Schema"])
            properties = schema.setdefault("properties", {})
            properties["metadata"] = {"type": "object"}
            properties.setdefault("apiVersion", {"const": api_version})
            properties.setdefault("kind", {"const": kind})
            return schema
    raise KeyError(f"{api_version} not served by {CRD_FILES[(api_version, kind)]}")


def _describe(obj: dict[str, Any]) -> str:
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def validate_object(obj: dict[str, Any], kubernetes_version: str) -> None:
    """Raise OperationError if ``obj`` is not valid for its kind (a rendering bug, never user input)."""
    import jsonschema

    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    try:
        if key in CRD_FILES:
            jsonschema.Draft202012Validator(crd_schema(*key)).validate(obj)
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
