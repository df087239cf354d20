"""JSON Schema validation of a loaded cluster file, with one actionable message per problem.

The schema is composed from the common one (``cluster.schema.json``) and the backend registry: the ``backend``
enum, each backend's own section (``mlenv/backends/<name>.schema.json``) and which backends need
``cluster.namespace``. ``x-expected`` in a schema node says what a wrong value should have been.

A valid file is checked by a validator compiled once per schema and kept on disk (mlenv.fastschema); only an
invalid one imports jsonschema, to say what is wrong.
"""

# Imported where used: mlenv.fastschema (~10-20 ms) to check a file, and for an invalid one only, jsonschema through
# fastschema.patterns (~300 ms on a busy host) and difflib.
from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Any

from mlenv.config.load import LoadedFile
from mlenv.config.positions import JsonPath, format_path
from mlenv.config.reader import BackendTable
from mlenv.errors import Problem, show_value
from mlenv.runtime.records.jsonvalue import JsonObject, JsonValue

SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster.schema.json")
BACKENDS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "backends")


def _schema_file(path: str) -> JsonObject:
    with open(path, encoding="utf-8") as handle:
        schema: JsonObject = json.load(handle)
    return schema


FRAGMENT_SUFFIX = ".schema.json"


def _fragment(name: str) -> str:
    return os.path.join(BACKENDS_DIR, f"{name}{FRAGMENT_SUFFIX}")


ROOT_REF = "../config/cluster.schema.json#"
"""How a fragment refers to the common schema's ``$defs`` (a path, so that editors resolve it too)."""


def _local_ref(table: BackendTable, ref: str) -> str:
    """A fragment's reference as the composed schema has it: into the common schema's ``$defs``, or into another
    backend's fragment (``ssh.schema.json#/properties/jump``), which is that backend's section there."""
    if ref.startswith(ROOT_REF):
        return f"#{ref[len(ROOT_REF):]}"
    file, _, pointer = ref.partition("#")
    sibling = table.backends.get(file.removesuffix(FRAGMENT_SUFFIX)) if file.endswith(FRAGMENT_SUFFIX) else None
    if sibling is None or not sibling.section:
        raise ValueError(f"a backend schema refers to {ref}, which is neither {ROOT_REF}... nor a registered "
                         "backend's fragment")
    return f"#/properties/{sibling.section}{pointer}"


def _inlined(table: BackendTable, node: JsonValue) -> JsonValue:
    """A fragment as part of the composed schema: its references to other schema files become local."""
    if isinstance(node, dict):
        return {key: (_local_ref(table, value) if key == "$ref" and isinstance(value, str)
                      else _inlined(table, value)) for key, value in node.items()}
    if isinstance(node, list):
        return [_inlined(table, item) for item in node]
    return node


def _namespace_rule(table: BackendTable) -> JsonObject:
    """``cluster.namespace`` is required when the file's backend (or the default) is Kubernetes-family."""
    kube = [name for name, info in table.backends.items() if info.kube_family]
    condition: JsonObject = {"properties": {"backend": {"enum": list[JsonValue](kube)}}}
    if table.default not in kube:
        condition["required"] = ["backend"]
    return {"if": condition, "then": {"properties": {"cluster": {"required": ["namespace"]}}}}


@lru_cache(maxsize=1)
def cluster_schema(table: BackendTable) -> JsonObject:
    """The common cluster file schema plus what the backend registry (``table``) adds."""
    schema = _schema_file(SCHEMA_FILE)
    properties = schema["properties"]
    if not isinstance(properties, dict):
        raise ValueError(f"{SCHEMA_FILE}: its properties are not an object")
    names = list(table.backends)
    properties["backend"] = {"enum": list[JsonValue](names), "x-expected": f"one of {', '.join(names)}"}
    for info in table.backends.values():
        if info.section:
            properties[info.section] = _inlined(table, _schema_file(_fragment(info.name)))
    schema["allOf"] = [_namespace_rule(table)]
    return schema


def _is_valid(table: BackendTable, data: Any) -> bool | None:
    """The compiled validator's answer (None when the schema needs jsonschema itself). Its key covers every input
    of cluster_schema(): the files (path, size, mtime) and the registry as this process sees it."""
    from mlenv.fastschema import Unsupported, compiled

    sections = sorted((info.name, info.section or "", info.kube_family) for info in table.backends.values())
    files = [SCHEMA_FILE, os.path.abspath(__file__),
             *(_fragment(info.name) for info in table.backends.values() if info.section)]
    stamps = [f"{path}:{st.st_size}:{st.st_mtime_ns}" for path in files for st in [os.stat(path)]]
    try:
        key = f"cluster|{sections}|{table.default}|{'|'.join(stamps)}"
        return compiled(key, lambda: (cluster_schema(table), {}))(data)
    except Unsupported:
        return None


def _unknown_key_problems(loaded: LoadedFile, path: JsonPath, instance: JsonObject,
                          schema: JsonObject) -> list[Problem]:
    import difflib

    properties = schema.get("properties")
    allowed = sorted(properties) if isinstance(properties, dict) else []
    problems = []
    for key in instance:
        if key in allowed:
            continue
        line, col = loaded.position((*path, key))
        close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else f"allowed here: {', '.join(allowed)}"
        problems.append(Problem(loaded.path, line, col, format_path((*path, key)), f"unknown field; {hint}"))
    return problems


def _problem(loaded: LoadedFile, error: Any) -> list[Problem]:
    path: JsonPath = tuple(error.absolute_path)
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "additionalProperties" and "properties" in schema:
        return _unknown_key_problems(loaded, path, error.instance, schema)
    line, col = loaded.position(path)
    if error.validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return [Problem(loaded.path, line, col, format_path(path),
                        f"missing required field '{missing}'; add it (see clusters/template.yaml)")]
    if "propertyNames" in error.schema_path:
        expected = schema.get("x-expected", "a valid key")
        key_path = (*path, error.instance)
        line, col = loaded.position(key_path)
        return [Problem(loaded.path, line, col, format_path(key_path),
                        f"expected {expected}, got key {show_value(error.instance)}")]
    expected = schema.get("x-expected")
    if expected is None:
        return [Problem(loaded.path, line, col, format_path(path), error.message)]
    return [Problem(loaded.path, line, col, format_path(path),
                    f"expected {expected}, got {show_value(error.instance)}")]


def schema_problems(loaded: LoadedFile, table: BackendTable) -> list[Problem]:
    """Every schema violation in ``loaded``, sorted by position in the file."""
    if not isinstance(loaded.data, dict):
        return [Problem(loaded.path, 1, 1, "", "expected a mapping with a 'cluster' section; "
                        "start from clusters/template.yaml")]
    if _is_valid(table, loaded.data):
        return []
    from mlenv.fastschema.patterns import draft202012

    validator = draft202012()(cluster_schema(table))
    problems: list[Problem] = []
    for error in validator.iter_errors(loaded.data):
        problems.extend(_problem(loaded, error))
    return sorted(set(problems), key=lambda p: (p.line or 0, p.column or 0, p.path))
