"""The REST verbs on stored objects: get, list, create, replace, patch (incl. server-side apply), delete, scale."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from . import errors, patches
from .admission import Admission
from .resources import ResourceType, by_kind
from .selectors import labels_match, parse_field_selector, parse_label_selector, selector_string
from .store import Store

APPLY = "application/apply-patch+yaml"
PATCHERS = {
    "application/merge-patch+json": patches.merge_patch,
    "application/strategic-merge-patch+json": patches.strategic_merge_patch,
    "application/json-patch+json": patches.json_patch,
}
STATEFULSETS = by_kind("StatefulSet")


def _check_identity(rt: ResourceType, obj: Any, namespace: str, name: str | None) -> dict[str, Any]:
    """Reject a body that is not an object of this resource, or names another object; fill in the namespace."""
    if not isinstance(obj, dict):
        raise errors.bad_request("the request body must be a JSON/YAML object")
    if obj.get("kind") not in (None, rt.kind) or obj.get("apiVersion") not in (None, rt.api_version):
        raise errors.bad_request(
            f"the API version in the data ({obj.get('apiVersion')}) does not match the expected API version "
            f"({rt.api_version}) or kind ({obj.get('kind')}) does not match {rt.kind}"
        )
    meta = obj.setdefault("metadata", {})
    if name is not None and (meta.get("name") or name) != name:
        raise errors.bad_request(
            f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
        )
    if name is not None:
        meta["name"] = name
    if rt.namespaced:
        if (meta.get("namespace") or namespace) != namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        meta["namespace"] = namespace
    return obj


def list_document(rt: ResourceType, items: list[dict[str, Any]], resource_version: str) -> dict[str, Any]:
    """A ``<Kind>List`` response."""
    return {
        "kind": f"{rt.kind}List",
        "apiVersion": rt.api_version,
        "metadata": {"resourceVersion": resource_version},
        "items": items,
    }


def success_status(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    """The ``Status`` a delete answers with."""
    details: dict[str, Any] = {"name": obj["metadata"]["name"], "kind": rt.plural, "uid": obj["metadata"]["uid"]}
    if rt.group:
        details["group"] = rt.group
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}


class Api:
    """The verbs, as the HTTP layer and the controllers call them (admission included)."""

    def __init__(self, store: Store, admission: Admission) -> None:
        self.store = store
        self.admission = admission
        self.pod_deleter: Callable[[dict[str, Any], float | None], dict[str, Any]] | None = None
        """Deletes pods gracefully (the kubelet stops them first) when set; else a pod goes at once."""

    def save(
        self, rt: ResourceType, obj: dict[str, Any], current: dict[str, Any] | None, dry_run: bool = False
    ) -> dict[str, Any]:
        """Admit and store ``obj`` as a new object (``current`` None) or as the next version of ``current``;
        ``dry_run`` (``?dryRun=All``): do everything but store it."""
        expected = (obj.get("metadata") or {}).get("resourceVersion")
        if current is not None and expected and expected != current["metadata"]["resourceVersion"]:
            raise errors.conflict(rt, current["metadata"]["name"])
        admitted = self.admission.admit(rt, obj, current)
        if current is None:
            return self.store.create(rt, admitted, dry_run)
        return self.store.update(rt, admitted, dry_run)

    def select(self, rt: ResourceType, namespace: str | None, query: Mapping[str, str]) -> list[dict[str, Any]]:
        """The objects of a list request, filtered by ``labelSelector`` and ``fieldSelector``."""
        requirements = parse_label_selector(query.get("labelSelector", ""))
        field_match = parse_field_selector(query.get("fieldSelector", ""))
        return [
            obj for obj in self.store.list(rt, namespace)
            if labels_match(requirements, obj["metadata"].get("labels")) and field_match(obj)
        ]

    def create(self, rt: ResourceType, namespace: str, body: Any, dry_run: bool = False) -> dict[str, Any]:
        """POST: create; AlreadyExists if the name is taken."""
        return self.save(rt, _check_identity(rt, body, namespace, None), None, dry_run)

    def replace(self, rt: ResourceType, namespace: str, name: str, body: Any, dry_run: bool = False) -> dict[str, Any]:
        """PUT: replace an existing object."""
        obj = _check_identity(rt, body, namespace, name)
        with self.store.lock:
            return self.save(rt, obj, self.store.require(rt, namespace, name), dry_run)

    def patch(
        self, rt: ResourceType, namespace: str, name: str, content_type: str, body: Any, manager: str | None,
        dry_run: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """PATCH: server-side apply (creates if absent) or a merge / strategic merge / JSON patch.
        Returns the object and whether it was created."""
        with self.store.lock:
            current = self.store.get(rt, namespace, name)
            if content_type == APPLY:
                if not manager:
                    raise errors.bad_request("PATCH request must have a fieldManager for apply requests")
                applied = _check_identity(rt, body, namespace, name)
                result = patches.server_side_apply(current, applied, manager)
                return self.save(rt, result, current, dry_run), current is None
            if current is None:
                raise errors.not_found(rt, name)
            patched = PATCHERS[content_type](current, body)
            return self.save(rt, _check_identity(rt, patched, namespace, name), current, dry_run), False

    def delete(
        self, rt: ResourceType, namespace: str, name: str, propagation: str, dry_run: bool = False,
        grace: float | None = None,
    ) -> dict[str, Any]:
        """DELETE one object (a pod within ``grace`` seconds, default its terminationGracePeriodSeconds, when pods
        run). Dependents are garbage-collected by the controller, or orphaned on request."""
        with self.store.lock:
            if dry_run:
                return self.store.require(rt, namespace, name)
            if rt.kind == "Pod" and self.pod_deleter is not None:
                return self.pod_deleter(self.store.require(rt, namespace, name), grace)
            gone = self.store.delete(rt, namespace, name)
            if propagation == "Orphan":
                self._orphan(gone["metadata"]["uid"])
            return gone

    def _orphan(self, owner_uid: str) -> None:
        for dependent_rt in (by_kind("Pod"), by_kind("PersistentVolumeClaim")):
            for obj in self.store.list(dependent_rt):
                refs = obj["metadata"].get("ownerReferences") or []
                kept = [r for r in refs if r.get("uid") != owner_uid]
                if len(kept) != len(refs):
                    updated = copy.deepcopy(obj)
                    updated["metadata"]["ownerReferences"] = kept
                    self.store.update(dependent_rt, updated)

    # --- the scale subresource of StatefulSets -------------------------------------------------------------

    def get_scale(self, namespace: str, name: str) -> dict[str, Any]:
        """GET statefulsets/NAME/scale as an autoscaling/v1 Scale."""
        sts = self.store.require(STATEFULSETS, namespace, name)
        meta = sts["metadata"]
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")},
            "spec": {"replicas": sts["spec"].get("replicas", 1)},
            "status": {
                "replicas": (sts.get("status") or {}).get("replicas", 0),
                "selector": selector_string((sts["spec"].get("selector") or {}).get("matchLabels") or {}),
            },
        }

    def update_scale(self, namespace: str, name: str, content_type: str | None, body: Any) -> dict[str, Any]:
        """PUT (content_type None) or PATCH statefulsets/NAME/scale: set spec.replicas."""
        with self.store.lock:
            scale = self.get_scale(namespace, name)
            new_scale = body if content_type is None else PATCHERS[content_type](scale, body)
            replicas = ((new_scale or {}).get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise errors.invalid(STATEFULSETS, name, f"spec.replicas: Invalid value: {replicas!r}")
            sts = copy.deepcopy(self.store.require(STATEFULSETS, namespace, name))
            sts["spec"]["replicas"] = replicas
            self.save(STATEFULSETS, sts, self.store.get(STATEFULSETS, namespace, name))
            return self.get_scale(namespace, name)
