"""JSON as read from and written to files: the one type of values that are truly arbitrary at an edge (a JSON
Schema document, a YAML object to write). Everything else is a typed record. Free to import from any layer: it
imports nothing at run time (typing is only named for the type checker)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypeAlias

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
"""Any JSON value, exactly: what ``json.load`` returns."""
JsonObject: TypeAlias = "dict[str, JsonValue]"
"""A JSON object (a schema, a manifest)."""
