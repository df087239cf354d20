"""JSON as Python holds it: :data:`JsonValue`, what ``json.loads`` returns, for the edges where a value is still
arbitrary JSON (a line just read, before it is checked; an observer's message), and the checks that take a typed
value out of one (TypeError naming the key otherwise)."""

from __future__ import annotations

from typing import TypeAlias

JsonValue: TypeAlias = bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None
"""Any JSON value."""
JsonObject: TypeAlias = dict[str, JsonValue]
"""A JSON object (a message, a record) before it is read into its type."""


def int_of(value: JsonValue, key: str) -> int:
    """``value`` when it is an integer (a bool is none); TypeError naming ``key`` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{key!r} is not an integer")
    return value


def number_of(value: JsonValue, key: str) -> float:
    """``value`` when it is a number (a bool is none), as it is (an integer stays one, as JSON wrote it); TypeError
    naming ``key`` otherwise."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{key!r} is not a number")
    return value


def object_of(value: JsonValue, key: str) -> JsonObject:
    """``value`` when it is a JSON object; TypeError naming ``key`` otherwise."""
    if not isinstance(value, dict):
        raise TypeError(f"{key!r} is not an object")
    return value
