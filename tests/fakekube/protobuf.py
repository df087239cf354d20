"""Reading the protobuf request bodies kubectl's typed clients send (``kubectl create namespace|configmap|secret|
serviceaccount``, ``kubectl auth can-i``), for the few kinds that reach the fake that way.

A body is ``k8s\\0`` + a runtime.Unknown message whose ``raw`` field holds the object. Each schema below maps
field numbers to (JSON name, type) for the fields a client sets; unknown fields are skipped.
"""

from __future__ import annotations

import base64
from typing import Any

from . import errors

MAGIC = b"k8s\x00"

# A field type: "string" | "bytes" | "raw" | "bool" | "int" | a nested schema | ("map", value type) | ("list", type).
FieldType = str | dict[int, tuple[str, Any]] | tuple[str, Any]
Schema = dict[int, tuple[str, FieldType]]

OBJECT_META: Schema = {1: ("name", "string"), 2: ("generateName", "string"), 3: ("namespace", "string"),
                       11: ("labels", ("map", "string")), 12: ("annotations", ("map", "string"))}
OBJECT_REFERENCE: Schema = {1: ("kind", "string"), 2: ("namespace", "string"), 3: ("name", "string")}
SCHEMAS: dict[str, Schema] = {
    "Namespace": {1: ("metadata", OBJECT_META)},
    "ConfigMap": {1: ("metadata", OBJECT_META), 2: ("data", ("map", "string")),
                  3: ("binaryData", ("map", "bytes")), 4: ("immutable", "bool")},
    "Secret": {1: ("metadata", OBJECT_META), 2: ("data", ("map", "bytes")), 3: ("type", "string"),
               4: ("stringData", ("map", "string")), 5: ("immutable", "bool")},
    "ServiceAccount": {1: ("metadata", OBJECT_META), 2: ("secrets", ("list", OBJECT_REFERENCE)),
                       4: ("automountServiceAccountToken", "bool")},
    "Eviction": {1: ("metadata", OBJECT_META), 2: ("deleteOptions", {
        1: ("gracePeriodSeconds", "int"), 4: ("propagationPolicy", "string"), 5: ("dryRun", ("list", "string"))})},
    "SelfSubjectAccessReview": {1: ("metadata", OBJECT_META), 2: ("spec", {
        1: ("resourceAttributes", {1: ("namespace", "string"), 2: ("verb", "string"), 3: ("group", "string"),
                                   4: ("version", "string"), 5: ("resource", "string"),
                                   6: ("subresource", "string"), 7: ("name", "string")}),
        2: ("nonResourceAttributes", {1: ("path", "string"), 2: ("verb", "string")}),
    })},
}
_UNKNOWN: Schema = {1: ("typeMeta", {1: ("apiVersion", "string"), 2: ("kind", "string")}), 2: ("raw", "raw")}


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, varint value or length-delimited bytes) in wire order; fixed-width fields are skipped."""
    fields: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            fields.append((number, value))
        elif wire == 2:
            length, pos = _varint(data, pos)
            fields.append((number, data[pos:pos + length]))
            pos += length
        else:
            pos += {1: 8, 5: 4}[wire]
    return fields


def _scalar(kind: FieldType, value: int | bytes) -> Any:
    if isinstance(value, int):
        return bool(value) if kind == "bool" else value
    if isinstance(kind, dict):
        return decode_message(value, kind)
    if kind == "string":
        return value.decode()
    if kind == "bytes":
        return base64.b64encode(value).decode()  # JSON carries bytes as base64
    return value  # "raw": the bytes themselves


def decode_message(data: bytes, schema: Schema) -> dict[str, Any]:
    """A protobuf message as the JSON object of its schema."""
    result: dict[str, Any] = {}
    for number, value in _fields(data):
        if number not in schema:
            continue
        name, kind = schema[number]
        if isinstance(kind, tuple) and kind[0] == "map":
            entry = dict(_fields(value)) if isinstance(value, bytes) else {}
            key = _scalar("string", entry.get(1, b""))
            result.setdefault(name, {})[key] = _scalar(kind[1], entry.get(2, b""))
        elif isinstance(kind, tuple):
            result.setdefault(name, []).append(_scalar(kind[1], value))
        elif value != b"":  # Go writes unset strings as empty ones
            result[name] = _scalar(kind, value)
    return result


def decode(body: bytes) -> dict[str, Any]:
    """A ``application/vnd.kubernetes.protobuf`` body as a JSON object; UnsupportedMediaType for other kinds."""
    if not body.startswith(MAGIC):
        raise errors.bad_request("protobuf body without the k8s envelope")
    envelope = decode_message(body[len(MAGIC):], _UNKNOWN)
    type_meta = envelope.get("typeMeta", {})
    schema = SCHEMAS.get(type_meta.get("kind", ""))
    if schema is None:
        raise errors.unsupported_media_type(f"application/vnd.kubernetes.protobuf ({type_meta.get('kind')})")
    obj = decode_message(envelope.get("raw", b""), schema)
    return {"apiVersion": type_meta.get("apiVersion"), "kind": type_meta["kind"], **obj}
