"""JSON Schema validation of a loaded cluster file, with one actionable message per problem."""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from importlib import resources
from typing import Any

from mlenv.config.load import JsonPath, LoadedFile, format_path
from mlenv.errors import Problem

SCHEMA_FILE = "cluster.schema.json"


@lru_cache(maxsize=1)
def cluster_schema() -> dict[str, Any]:
    """The cluster file schema shipped in the package."""
    text = resources.files("mlenv.config").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema


def show_value(value: Any) -> str:
    """A short, JSON-quoted rendering of a user's value for error messages."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown_key_problems(loaded: LoadedFile, path: JsonPath, instance: dict[str, Any],
                          schema: dict[str, Any]) -> list[Problem]:
    allowed = sorted(schema.get("properties", {}))
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


def schema_problems(loaded: LoadedFile) -> list[Problem]:
    """Every schema violation in ``loaded``, sorted by position in the file."""
    from jsonschema import Draft202012Validator

    if not isinstance(loaded.data, dict):
        return [Problem(loaded.path, 1, 1, "", "expected a mapping with a 'cluster' section; "
                        "start from clusters/template.yaml")]
    validator = Draft202012Validator(cluster_schema())
    problems: list[Problem] = []
    for error in validator.iter_errors(loaded.data):
        problems.extend(_problem(loaded, error))
    return sorted(set(problems), key=lambda p: (p.line or 0, p.column or 0, p.path))
