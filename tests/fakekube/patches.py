"""The PATCH flavours: JSON merge, (simplified) strategic merge, JSON patch, and server-side apply.

Server-side apply is simplified: a manager owns the set of leaf paths of the object it last applied
(lists count as one leaf, replaced whole). Applying again removes the paths it no longer sets and merges
in the new ones; fields set by others stay. That is enough for a client that re-applies to converge.
"""

from __future__ import annotations

import copy
from datetime import datetime, timezone
from typing import Any

from .errors import bad_request

Path = tuple[str, ...]

# Metadata the server owns; never part of what a manager applies.
SERVER_METADATA = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _merge_key(items: list[Any]) -> str | None:
    """The key lists of objects are merged by in a strategic merge (``name`` for containers, env, volumes...)."""
    for key in ("name", "mountPath", "containerPort", "ip", "type"):
        if items and all(isinstance(i, dict) and key in i for i in items):
            return key
    return None


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch, simplified: like a merge patch, but lists of objects that carry a merge key
    (``name``...) are merged item by item, ``$patch: delete`` items are removed and other ``$`` directives
    are ignored."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_lists(result[key], value)
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _merge_lists(current: list[Any], patch: list[Any]) -> list[Any]:
    key = _merge_key(current + [i for i in patch if isinstance(i, dict) and i.get("$patch") != "delete"])
    if key is None:
        return copy.deepcopy([i for i in patch if not (isinstance(i, dict) and i.get("$patch") == "delete")])
    merged = copy.deepcopy(current)
    for item in patch:
        index = next((n for n, old in enumerate(merged) if old.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                del merged[index]
        elif index is None:
            merged.append(strategic_merge_patch({}, item))
        else:
            merged[index] = strategic_merge_patch(merged[index], item)
    return merged


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def json_patch(target: Any, operations: list[dict[str, Any]]) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test)."""
    doc = copy.deepcopy(target)
    for op in operations:
        try:
            parts = _pointer(op["path"])
            kind = op["op"]
            if kind in ("move", "copy"):
                source = _pointer(op["from"])
                value = copy.deepcopy(_resolve(doc, source))
                if kind == "move":
                    doc = _remove(doc, source)
                doc = _add(doc, parts, value)
            elif kind == "test":
                if _resolve(doc, parts) != op.get("value"):
                    raise bad_request(f"test operation failed at {op['path']}")
            elif kind == "remove":
                doc = _remove(doc, parts)
            elif kind == "add":
                doc = _add(doc, parts, copy.deepcopy(op.get("value")))
            elif kind == "replace":
                doc = _add(_remove(doc, parts), parts, copy.deepcopy(op.get("value")))
            else:
                raise bad_request(f"unknown JSON patch operation {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise bad_request(f"the JSON patch could not be applied: {op}: {exc}") from exc
    return doc


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _resolve(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, list):
        parent.insert(len(parent) if last == "-" else int(last), value)
    else:
        parent[last] = value
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    parent = _resolve(doc, parts[:-1])
    del parent[int(parts[-1]) if isinstance(parent, list) else parts[-1]]
    return doc


# --- server-side apply -------------------------------------------------------------------------------------


def leaf_paths(obj: Any, prefix: Path = ()) -> set[Path]:
    """The leaves of an object: every path that ends in a non-dict value or an empty dict."""
    if not isinstance(obj, dict) or not obj:
        return {prefix} if prefix else set()
    paths: set[Path] = set()
    for key, value in obj.items():
        paths |= leaf_paths(value, (*prefix, key))
    return paths


def encode_fields(paths: set[Path]) -> dict[str, Any]:
    """Paths as a ``fieldsV1`` tree (``{"f:spec": {"f:replicas": {}}}``)."""
    tree: dict[str, Any] = {}
    for path in sorted(paths):
        node = tree
        for part in path:
            node = node.setdefault(f"f:{part}", {})
    return tree


def decode_fields(tree: dict[str, Any], prefix: Path = ()) -> set[Path]:
    """The inverse of :func:`encode_fields`."""
    paths: set[Path] = set()
    for key, child in tree.items():
        if not key.startswith("f:"):
            continue
        path = (*prefix, key[2:])
        paths |= decode_fields(child, path) if child else {path}
    return paths


def applied_fields(applied: dict[str, Any]) -> dict[str, Any]:
    """What a manager sets in an apply request: the object without server-owned metadata and status."""
    fields = {k: v for k, v in applied.items() if k != "status"}
    fields["metadata"] = {k: v for k, v in (applied.get("metadata") or {}).items() if k not in SERVER_METADATA}
    return fields


def _delete_path(obj: dict[str, Any], path: Path) -> None:
    node: Any = obj
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(path[-1], None)


def _deep_merge(target: dict[str, Any], source: dict[str, Any]) -> None:
    for key, value in source.items():
        if isinstance(value, dict) and value and isinstance(target.get(key), dict):
            _deep_merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def server_side_apply(current: dict[str, Any] | None, applied: dict[str, Any], manager: str) -> dict[str, Any]:
    """The object after ``manager`` applies ``applied`` onto ``current`` (None when it does not exist yet).

    The manager's managedFields entry records what it owns, so the next apply can drop what it stopped setting.
    """
    fields = applied_fields(applied)
    owned = leaf_paths(fields) - {("apiVersion",), ("kind",)}
    result = copy.deepcopy(current) if current else {}
    entries = (result.get("metadata") or {}).get("managedFields") or []
    previous = next((e for e in entries if e.get("manager") == manager and e.get("operation") == "Apply"), None)
    if previous:
        for path in sorted(decode_fields(previous.get("fieldsV1") or {}) - owned, reverse=True):
            _delete_path(result, path)
    _deep_merge(result, fields)
    entry = {
        "manager": manager,
        "operation": "Apply",
        "apiVersion": applied.get("apiVersion", ""),
        "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "fieldsType": "FieldsV1",
        "fieldsV1": encode_fields(owned),
    }
    others = [e for e in entries if e is not previous]
    result.setdefault("metadata", {})["managedFields"] = [*others, entry]
    return result
