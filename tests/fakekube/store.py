"""In-memory object storage: one global resourceVersion counter, server-owned metadata, a change feed for watches.

Stored objects are never mutated in place: every write stores a fresh dict, so a reader may keep and
serialize a reference it got under the lock after releasing it.
"""

from __future__ import annotations

import builtins
import copy
import threading
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from . import errors
from .resources import ResourceType, by_kind

NAMESPACES = by_kind("Namespace")
WATCH_HISTORY = 20_000


def now_iso() -> str:
    """The current time as Kubernetes writes timestamps."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    """Everything but metadata and status: what a generation change is about."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without what changes on every write (resourceVersion, managedFields times)."""
    meta = dict(obj.get("metadata") or {})
    meta.pop("resourceVersion", None)
    meta["managedFields"] = [{k: v for k, v in e.items() if k != "time"} for e in meta.get("managedFields") or []]
    return {**obj, "metadata": meta}


@dataclass(frozen=True)
class Change:
    """One entry of the change feed: a watch event."""

    resource_version: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: ResourceType
    object: dict[str, Any]


class Store:
    """Objects by resource type, namespace and name, guarded by one re-entrant lock (``store.lock``)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._objects: dict[ResourceType, dict[tuple[str, str], dict[str, Any]]] = {}
        self._revision = 0
        self._feed: deque[Change] = deque(maxlen=WATCH_HISTORY)

    @property
    def resource_version(self) -> str:
        """The latest resourceVersion handed out (what a list returns)."""
        return str(self._revision)

    def get(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object, or None. Do not mutate it."""
        with self.lock:
            return self._objects.get(rt, {}).get((namespace if rt.namespaced else "", name))

    def require(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        """The stored object; NotFound if absent."""
        obj = self.get(rt, namespace, name)
        if obj is None:
            raise errors.not_found(rt, name)
        return obj

    def list(self, rt: ResourceType, namespace: str | None = None) -> list[dict[str, Any]]:
        """The stored objects of a type, in one namespace or all (None), sorted by namespace and name."""
        with self.lock:
            table = self._objects.get(rt, {})
            keys = sorted(k for k in table if namespace is None or not rt.namespaced or k[0] == namespace)
            return [table[k] for k in keys]

    def create(self, rt: ResourceType, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Store a new object, filling in uid, resourceVersion, generation and creationTimestamp.

        AlreadyExists if taken; NotFound for the namespace if a namespaced object's namespace is missing.
        ``dry_run``: check and return the result, store nothing (likewise for update).
        """
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = meta["generateName"] + uuid.uuid4().hex[:5]
            meta["name"] = name
        if not name:
            raise errors.invalid(rt, "", "metadata.name: Required value: name or generateName is required")
        namespace = meta.get("namespace", "") if rt.namespaced else ""
        with self.lock:
            if rt.namespaced and self.get(NAMESPACES, "", namespace) is None:
                raise errors.not_found(NAMESPACES, namespace)
            if self.get(rt, namespace, name) is not None:
                raise errors.already_exists(rt, name)
            if not rt.namespaced:
                meta.pop("namespace", None)
            obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
            meta.update(uid=str(uuid.uuid4()), generation=1, creationTimestamp=now_iso())
            return self._put(rt, namespace, name, obj, "ADDED", dry_run)

    def update(self, rt: ResourceType, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Replace a stored object (NotFound if absent). A write that changes nothing keeps the stored object
        and its resourceVersion; a change outside metadata and status bumps metadata.generation."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace", "") if rt.namespaced else ""
        with self.lock:
            current = self.require(rt, namespace, meta.get("name", ""))
            old_meta = current["metadata"]
            for key in ("uid", "creationTimestamp", "generation", "resourceVersion"):
                meta[key] = old_meta.get(key)
            obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
            if _comparable(obj) == _comparable(current):
                return current
            if _spec_part(obj) != _spec_part(current):
                meta["generation"] = (old_meta.get("generation") or 0) + 1
            return self._put(rt, namespace, meta["name"], obj, "MODIFIED", dry_run)

    def delete(self, rt: ResourceType, namespace: str, name: str) -> dict[str, Any]:
        """Remove an object at once (no finalizers, no grace period) and return it; NotFound if absent."""
        with self.lock:
            current = self.require(rt, namespace, name)
            del self._objects[rt][(namespace if rt.namespaced else "", name)]
            self._revision += 1
            gone = copy.deepcopy(current)
            gone["metadata"]["resourceVersion"] = str(self._revision)
            self._feed.append(Change(self._revision, "DELETED", rt, gone))
            self.changed.notify_all()
            return gone

    def changes_since(self, resource_version: int) -> builtins.list[Change]:
        """The change feed after a resourceVersion (watch events), oldest first."""
        with self.lock:
            newer: builtins.list[Change] = []
            for change in reversed(self._feed):
                if change.resource_version <= resource_version:
                    break
                newer.append(change)
            return newer[::-1]

    def _put(
        self, rt: ResourceType, namespace: str, name: str, obj: dict[str, Any], kind: str, dry_run: bool
    ) -> dict[str, Any]:
        if dry_run:
            return obj
        self._revision += 1
        obj["metadata"]["resourceVersion"] = str(self._revision)
        self._objects.setdefault(rt, {})[(namespace, name)] = obj
        self._feed.append(Change(self._revision, kind, rt, obj))
        self.changed.notify_all()
        return obj
