"""The cluster's moving parts, reduced to what a deploy tool sees: the StatefulSet controller, the scheduler
call, a kubelet that starts (or fails to start) pods, PVC binding, garbage collection and events.

``reconcile()`` is idempotent; the server calls it after every write and a timer thread calls it every
``resync_seconds`` (for delayed readiness and for fault switches flipped while pods wait).
StatefulSets are handled as if ``podManagementPolicy: Parallel``: all missing pods are created at once.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import logging
import re
import threading
import time
import uuid
from dataclasses import astuple
from typing import TYPE_CHECKING, Any

from . import scheduler
from .api import Api
from .errors import ApiError
from .faults import Faults
from .incluster import CA
from .resources import RESOURCES, ResourceType, by_kind
from .store import Store, now_iso

if TYPE_CHECKING:
    from .kubelet import Kubelet, View

log = logging.getLogger(__name__)

PODS = by_kind("Pod")
PVCS = by_kind("PersistentVolumeClaim")
NODES = by_kind("Node")
EVENTS = by_kind("Event")
NAMESPACES = by_kind("Namespace")
STATEFULSETS = by_kind("StatefulSet")
SERVICES = by_kind("Service")
CONFIG_MAPS = by_kind("ConfigMap")
ROOT_CA = "kube-root-ca.crt"
"""The ConfigMap of the cluster's CA that Kubernetes' root CA publisher keeps in every namespace."""
POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
REVISION_LABEL = "controller-revision-hash"
DEFAULT_SCHEDULER = "default-scheduler"
GATED_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"
"""The real scheduler's PodScheduled message for a gated pod (pkg/scheduler)."""


def _natural_key(obj: dict[str, Any]) -> tuple[str, str]:
    """Sort ``x-2`` before ``x-10``."""
    meta = obj["metadata"]
    return meta.get("namespace", ""), re.sub(r"\d+", lambda m: m.group().zfill(8), meta["name"])


def _condition(kind: str, status: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    condition = {"type": kind, "status": "True" if status else "False", "lastProbeTime": None,
                 "lastTransitionTime": now_iso()}
    if reason:
        condition.update(reason=reason, message=message)
    return condition


def _same_state(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> bool:
    """Conditions equal but for their timestamps."""
    def strip(conditions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in conditions]
    return strip(old) == strip(new)


def _controller_uid(obj: dict[str, Any]) -> str | None:
    refs = obj["metadata"].get("ownerReferences") or []
    return next((r.get("uid") for r in refs if r.get("controller")), None)


class Controller:
    """Reconciles the store towards what real controllers, scheduler and kubelets would make of it."""

    def __init__(self, store: Store, api: Api, faults: Faults, failures: list[str], ready_delay: float = 0.0,
                 resync_seconds: float = 0.1, kubelet: Kubelet | None = None) -> None:
        self.store = store
        self.kubelet = kubelet
        """Runs the pods' containers for real when set; else pods only look Running."""
        self.api = api
        self.faults = faults
        self.failures = failures
        self.ready_delay = ready_delay
        self.resync_seconds = resync_seconds
        self.schedulers = {DEFAULT_SCHEDULER}
        """The schedulerNames whose pods this cluster places (a test playing Volcano adds ``volcano``)."""
        self._scheduled_at: dict[str, float] = {}
        self._pod_ips = itertools.count()
        self._events: dict[tuple[str, str, str, str], tuple[str, str]] = {}
        self._event_clock = 0
        self._waiting = False  # some pod waits out ready_delay: the timer must pass again even if nothing changed
        self._settled: tuple[str, tuple[bool, ...]] = ("", ())  # (resourceVersion, faults) after the last pass
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Run ``reconcile`` every ``resync_seconds`` in a daemon thread."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="fakekube-controller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the timer thread."""
        self._stop.set()
        if self._thread:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.resync_seconds):
            if not self._waiting and self._settled == (self.store.resource_version, astuple(self.faults)):
                continue  # nothing changed since the last pass and no pod is waiting to start
            try:
                self.reconcile()
            except Exception as exc:  # keep the timer alive; the failure is reported by the fixture
                log.exception("fakekube controller failed")
                self.failures.append(repr(exc))

    def reconcile(self) -> None:
        """One pass over everything (under the store lock, so each pass sees and leaves a consistent state)."""
        with self.store.lock:
            before = (self.store.resource_version, astuple(self.faults))
            self._collect_garbage()
            self._publish_root_ca()
            for sts in self.store.list(STATEFULSETS):
                self._sync_statefulset(sts)
            self._bind_claims()
            self._run_pods()
            for sts in self.store.list(STATEFULSETS):
                self._update_statefulset_status(sts)
            # settled only by a pass that changed nothing: what this pass wrote (a pod's IP, its status) is seen by
            # the next one (a pod's /etc/hosts names peers scheduled after it, and itself once it has an IP)
            self._settled = before

    # --- events ---------------------------------------------------------------------------------------------

    def record_event(self, obj: dict[str, Any], kind: str, reason: str, message: str, component: str,
                     host: str = "") -> None:
        """Create an Event about ``obj``; the same (object, type, reason, message) is recorded only once.

        Names are ``<object>.<nanoseconds in hex>`` like the real ones, so they list in creation order."""
        meta = obj["metadata"]
        key = (meta["uid"], kind, reason, message)
        known = self._events.get(key)
        if known and self.store.get(EVENTS, *known) is not None:
            return
        self._event_clock = max(time.time_ns(), self._event_clock + 1)
        name = f"{meta['name']}.{self._event_clock:x}"
        stamp = now_iso()
        self.store.create(EVENTS, {
            "metadata": {"name": name, "namespace": meta.get("namespace", "default")},
            "involvedObject": {
                "kind": obj["kind"], "namespace": meta.get("namespace", ""), "name": meta["name"],
                "uid": meta["uid"], "apiVersion": obj["apiVersion"], "resourceVersion": meta["resourceVersion"],
            },
            "reason": reason, "message": message, "type": kind, "count": 1,
            "source": {"component": component, **({"host": host} if host else {})},
            "reportingComponent": component, "reportingInstance": host,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "eventTime": None,
        })
        self._events[key] = (meta.get("namespace", "default"), name)

    # --- garbage collection and claims ----------------------------------------------------------------------

    def _collect_garbage(self) -> None:
        """Delete what lives in a deleted namespace, and dependents whose controller owner is gone."""
        namespaces = {ns["metadata"]["name"] for ns in self.store.list(NAMESPACES)}
        uids = set()
        everything: list[tuple[ResourceType, dict[str, Any]]] = []
        for rt in RESOURCES:
            for obj in self.store.list(rt):
                uids.add(obj["metadata"]["uid"])
                everything.append((rt, obj))
        for rt, obj in everything:
            meta = obj["metadata"]
            owner = _controller_uid(obj)
            if (rt.namespaced and meta.get("namespace") not in namespaces) or (owner and owner not in uids):
                if rt is PODS:
                    self.delete_pod(obj)
                else:
                    self.store.delete(rt, meta.get("namespace", ""), meta["name"])
                self._scheduled_at.pop(meta["uid"], None)

    def _publish_root_ca(self) -> None:
        """Every namespace has :data:`ROOT_CA` with the CA the API server's certificate verifies against (its
        ``ca.crt``), as kube-controller-manager's root CA publisher makes it."""
        for namespace in self.store.list(NAMESPACES):
            name = namespace["metadata"]["name"]
            if self.store.get(CONFIG_MAPS, name, ROOT_CA) is None:
                self.store.create(CONFIG_MAPS, {"apiVersion": "v1", "kind": "ConfigMap",
                                                "metadata": {"name": ROOT_CA, "namespace": name},
                                                "data": {"ca.crt": CA.read_text()}})

    def _bind_claims(self) -> None:
        for claim in self.store.list(PVCS):
            if (claim.get("status") or {}).get("phase") == "Bound":
                continue
            bound = copy.deepcopy(claim)
            spec = bound.setdefault("spec", {})
            spec.setdefault("volumeName", f"pvc-{claim['metadata']['uid']}")
            storage = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
            bound["status"] = {"phase": "Bound", "accessModes": spec.get("accessModes", []),
                               "capacity": {"storage": storage}}
            self.store.update(PVCS, bound)

    # --- StatefulSets ---------------------------------------------------------------------------------------

    @staticmethod
    def revision(sts: dict[str, Any]) -> str:
        """``<name>-<hash of the pod template>``, the controller-revision-hash of up-to-date pods."""
        template = json.dumps(sts["spec"].get("template") or {}, sort_keys=True).encode()
        return f"{sts['metadata']['name']}-{hashlib.sha256(template).hexdigest()[:10]}"

    def _owned_pods(self, sts: dict[str, Any]) -> dict[int, dict[str, Any]]:
        name, uid = sts["metadata"]["name"], sts["metadata"]["uid"]
        owned = {}
        for pod in self.store.list(PODS, sts["metadata"]["namespace"]):
            prefix, _, index = pod["metadata"]["name"].rpartition("-")
            if prefix == name and index.isdigit() and _controller_uid(pod) == uid:
                owned[int(index)] = pod
        return owned

    def _sync_statefulset(self, sts: dict[str, Any]) -> None:
        spec = sts["spec"]
        replicas = spec.get("replicas", 1)
        revision = self.revision(sts)
        rolling = (spec.get("updateStrategy") or {}).get("type") != "OnDelete"
        for index, pod in self._owned_pods(sts).items():
            outdated = rolling and pod["metadata"].get("labels", {}).get(REVISION_LABEL) != revision
            if (index >= replicas or outdated) and not pod["metadata"].get("deletionTimestamp"):
                self.delete_pod(pod)
                self.record_event(sts, "Normal", "SuccessfulDelete",
                                  f"delete Pod {pod['metadata']['name']} in StatefulSet "
                                  f"{sts['metadata']['name']} successful", "statefulset-controller")
        owned = self._owned_pods(sts)
        for index in range(replicas):
            if index not in owned and not self._create_pod(sts, index, revision):
                break

    def _create_pod(self, sts: dict[str, Any], index: int, revision: str) -> bool:
        """Create claims and pod ``index`` of a StatefulSet; False (and a FailedCreate event) if rejected."""
        meta, spec = sts["metadata"], sts["spec"]
        name, namespace = f"{meta['name']}-{index}", meta["namespace"]
        template = copy.deepcopy(spec.get("template") or {})
        tmeta = template.get("metadata") or {}
        pod_spec = template.get("spec") or {}
        pod_spec.setdefault("hostname", name)
        if spec.get("serviceName"):
            pod_spec.setdefault("subdomain", spec["serviceName"])
        volumes = list(pod_spec.get("volumes") or [])
        for claim_template in spec.get("volumeClaimTemplates") or []:
            claim = self._ensure_claim(sts, claim_template, index, name)
            claim_volume = claim_template["metadata"]["name"]
            volumes = [v for v in volumes if v.get("name") != claim_volume]
            volumes.append({"name": claim_volume, "persistentVolumeClaim": {"claimName": claim}})
        if volumes:
            pod_spec["volumes"] = volumes
        labels = {**(tmeta.get("labels") or {}), POD_NAME_LABEL: name, POD_INDEX_LABEL: str(index),
                  REVISION_LABEL: revision}
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": namespace, "labels": labels,
                "annotations": tmeta.get("annotations") or {},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": meta["name"],
                                     "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": pod_spec,
        }
        try:
            self.api.save(PODS, pod, None)
        except ApiError as exc:
            self.record_event(sts, "Warning", "FailedCreate",
                              f"create Pod {name} in StatefulSet {meta['name']} failed error: {exc.message}",
                              "statefulset-controller")
            return False
        self.record_event(sts, "Normal", "SuccessfulCreate",
                          f"create Pod {name} in StatefulSet {meta['name']} successful", "statefulset-controller")
        return True

    def _ensure_claim(self, sts: dict[str, Any], template: dict[str, Any], index: int, pod_name: str) -> str:
        """Create ``<template>-<sts>-<index>`` if missing (claims outlive the StatefulSet unless its
        persistentVolumeClaimRetentionPolicy says whenDeleted: Delete); return its name."""
        meta, spec = sts["metadata"], sts["spec"]
        tmeta = template.get("metadata") or {}
        name = f"{tmeta['name']}-{meta['name']}-{index}"
        if self.store.get(PVCS, meta["namespace"], name) is not None:
            return name
        claim_meta: dict[str, Any] = {
            "name": name, "namespace": meta["namespace"],
            "labels": {**(tmeta.get("labels") or {}), **((spec.get("selector") or {}).get("matchLabels") or {})},
        }
        if tmeta.get("annotations"):
            claim_meta["annotations"] = tmeta["annotations"]
        if (spec.get("persistentVolumeClaimRetentionPolicy") or {}).get("whenDeleted") == "Delete":
            claim_meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": meta["name"],
                                              "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True}]
        self.api.save(PVCS, {"metadata": claim_meta, "spec": copy.deepcopy(template.get("spec") or {})}, None)
        self.record_event(sts, "Normal", "SuccessfulCreate",
                          f"create Claim {name} Pod {pod_name} in StatefulSet {meta['name']} success",
                          "statefulset-controller")
        return name

    def _update_statefulset_status(self, sts: dict[str, Any]) -> None:
        pods = self._owned_pods(sts).values()
        revision = self.revision(sts)
        ready = sum(1 for p in pods if self.pod_ready(p))
        current = sum(1 for p in pods if p["metadata"]["labels"].get(REVISION_LABEL) == revision)
        status: dict[str, Any] = {
            "observedGeneration": sts["metadata"]["generation"], "replicas": len(pods),
            "readyReplicas": ready, "currentReplicas": current, "updatedReplicas": current,
            "availableReplicas": ready, "currentRevision": revision, "updateRevision": revision,
            "collisionCount": 0,
        }
        # Like the real API, the omitempty counters vanish when zero.
        status = {k: v for k, v in status.items()
                  if v or k not in ("readyReplicas", "currentReplicas", "updatedReplicas")}
        if sts.get("status") != status:
            self.store.update(STATEFULSETS, {**sts, "status": status})

    # --- pod deletion ---------------------------------------------------------------------------------------

    def delete_pod(self, pod: dict[str, Any], grace: float | None = None) -> dict[str, Any]:
        """Delete a pod: at once, or (with a kubelet running it) gracefully: marked with deletionTimestamp, its
        container stopped (SIGTERM, SIGKILL after ``grace``, default terminationGracePeriodSeconds), then removed.
        Returns the pod as the DELETE answers it."""
        meta = pod["metadata"]
        if self.kubelet is None or not (pod.get("spec") or {}).get("nodeName"):
            return self.store.delete(PODS, meta["namespace"], meta["name"])
        if meta.get("deletionTimestamp"):
            return pod
        seconds = grace if grace is not None else float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        marked = copy.deepcopy(pod)
        marked["metadata"].update(deletionTimestamp=now_iso(), deletionGracePeriodSeconds=int(seconds))
        marked = self.store.update(PODS, marked)
        container = (pod["spec"].get("containers") or [{}])[0].get("name", "")
        self.record_event(pod, "Normal", "Killing", f"Stopping container {container}", "kubelet",
                          pod["spec"]["nodeName"])
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        self.kubelet.delete(uid, seconds, lambda: self._forget_pod(namespace, name, uid))
        return marked

    def _forget_pod(self, namespace: str, name: str, uid: str) -> None:
        """Remove a gracefully deleted pod once its kubelet stopped it."""
        with self.store.lock:
            current = self.store.get(PODS, namespace, name)
            if current is not None and current["metadata"]["uid"] == uid:
                self.store.delete(PODS, namespace, name)

    # --- scheduler and kubelet ------------------------------------------------------------------------------

    @staticmethod
    def pod_ready(pod: dict[str, Any]) -> bool:
        """Whether the pod's Ready condition is True."""
        conditions = (pod.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _run_pods(self) -> None:
        self._waiting = False
        nodes = {n["metadata"]["name"]: n for n in self.store.list(NODES)}
        pods = sorted(self.store.list(PODS), key=_natural_key)
        placed = [(p, nodes[p["spec"]["nodeName"]]) for p in pods
                  if (p.get("spec") or {}).get("nodeName") in nodes]
        services = self.store.list(SERVICES) if self.kubelet is not None else []
        if self.kubelet is not None:
            self.kubelet.prune({p["metadata"]["uid"] for p in pods})
            self._waiting = self.kubelet.waiting()
        for index, pod in enumerate(pods):
            if self.kubelet is None and (pod.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed"):
                continue
            node_name = (pod.get("spec") or {}).get("nodeName")
            if not node_name:
                if not self._ours_to_schedule(pod):
                    continue
                node = self._schedule(pod, list(nodes.values()), placed)
                if node is None:
                    continue
                placed.append((pod, node))
                pod = pods[index] = self.store.get(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"]) or pod
            if self.kubelet is None:
                self._start_containers(pod, nodes.get(pod["spec"]["nodeName"]))
            elif not pod["metadata"].get("deletionTimestamp"):
                self._write_view(pod, self.kubelet.sync(pod, pods, services))
        alive = {p["metadata"]["uid"] for p in pods}
        for uid in set(self._scheduled_at) - alive:
            del self._scheduled_at[uid]

    def _ours_to_schedule(self, pod: dict[str, Any]) -> bool:
        """Whether the scheduler places this pod now: its schedulerName is one this cluster runs, and it has no
        scheduling gates (a gated pod gets the PodScheduled=False/SchedulingGated condition the real scheduler
        writes, and waits until every gate is lifted)."""
        spec = pod.get("spec") or {}
        if (spec.get("schedulerName") or DEFAULT_SCHEDULER) not in self.schedulers:
            return False  # another scheduler's (Volcano's): nobody here places it
        if not spec.get("schedulingGates"):
            return True
        conditions = [_condition("PodScheduled", False, "SchedulingGated", GATED_MESSAGE)]
        status = (pod.get("status") or {})
        if not _same_state(status.get("conditions") or [], conditions):
            updated = copy.deepcopy(pod)
            updated.setdefault("status", {}).update(phase="Pending", conditions=conditions)
            self.store.update(PODS, updated)
        return False

    def _schedule(self, pod: dict[str, Any], nodes: list[dict[str, Any]],
                  placed: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any] | None:
        if self.faults.unschedulable:
            node, message = None, scheduler.unschedulable_message([[scheduler.INSUFFICIENT_GPU]] * len(nodes),
                                                                  len(nodes))
        else:
            node, message = scheduler.schedule(pod, nodes, placed)
        updated = copy.deepcopy(pod)
        status = updated.setdefault("status", {})
        if node is None:
            conditions = [_condition("PodScheduled", False, "Unschedulable", message)]
            if _same_state(status.get("conditions") or [], conditions):
                return None
            status.update(phase="Pending", conditions=conditions)
            self.store.update(PODS, updated)
            self.record_event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
            return None
        node_name = node["metadata"]["name"]
        node_ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
        n = next(self._pod_ips)
        pod_ip = self.kubelet.pod_ip(n) if self.kubelet else f"10.128.{n // 250}.{n % 250 + 2}"
        updated["spec"]["nodeName"] = node_name
        status.update(phase="Pending", conditions=[_condition("PodScheduled", True)], hostIP=node_ip,
                      hostIPs=[{"ip": node_ip}], podIP=pod_ip, podIPs=[{"ip": pod_ip}], startTime=now_iso())
        self.store.update(PODS, updated)
        self._scheduled_at[pod["metadata"]["uid"]] = time.monotonic()
        self.record_event(pod, "Normal", "Scheduled",
                          f"Successfully assigned {pod['metadata']['namespace']}/{pod['metadata']['name']} "
                          f"to {node_name}", "default-scheduler")
        return node

    def _start_containers(self, pod: dict[str, Any], node: dict[str, Any] | None) -> None:
        """The kubelet: pull images (or fail to), then run the containers once ``ready_delay`` has passed."""
        containers = (pod.get("spec") or {}).get("containers") or []
        uid = pod["metadata"]["uid"]
        since = self._scheduled_at.setdefault(uid, time.monotonic())
        if self.faults.image_pull_backoff:
            states = [{"waiting": {"reason": "ImagePullBackOff",
                                   "message": f'Back-off pulling image "{c.get("image", "")}"'}} for c in containers]
            running = False
        elif time.monotonic() - since < self.ready_delay:
            states = [{"waiting": {"reason": "ContainerCreating"}} for _ in containers]
            running, self._waiting = False, True
        else:
            states = [{"running": {"startedAt": now_iso()}} for _ in containers]
            running = True
        old_states = [s.get("state") for s in (pod.get("status") or {}).get("containerStatuses") or []]
        if not running and states == old_states:
            return
        self._write_container_status(pod, containers, states, running)
        host = node["metadata"]["name"] if node else ""
        for container in containers:
            self._container_events(pod, container, running, host)

    def _write_view(self, pod: dict[str, Any], view: View) -> None:
        """The status of a pod the kubelet runs, from what it reports; events on the transitions."""
        container = (pod["spec"].get("containers") or [{}])[0]
        image, name = container.get("image", ""), container.get("name", "")
        entry: dict[str, Any] = {"name": name, "image": image, "imageID": "", "ready": view.running,
                                 "started": view.running, "restartCount": view.restarts, "state": view.state,
                                 "lastState": view.last_state}
        if view.container_id:
            entry.update(imageID=f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}",
                         containerID=view.container_id)
        why = ("", "") if view.running else ("ContainersNotReady", f"containers with unready status: [{name}]")
        status = {**pod["status"], "phase": view.phase, "containerStatuses": [entry], "conditions": [
            _condition("PodReadyToStartContainers", True), _condition("Initialized", True),
            _condition("Ready", view.running, *why), _condition("ContainersReady", view.running, *why),
            _condition("PodScheduled", True)]}
        old = pod.get("status") or {}
        if old.get("containerStatuses") == status["containerStatuses"] and old.get("phase") == view.phase:
            return
        self.store.update(PODS, {**pod, "status": status})
        host = pod["spec"].get("nodeName", "")
        waiting = view.state.get("waiting") or {}
        if view.running and view.restarts == 0:
            self._container_events(pod, container, True, host)
        elif view.running:
            self.record_event(pod, "Normal", "Started", f"Started container {name} (restart {view.restarts})",
                              "kubelet", host)
        elif waiting.get("reason") == "CrashLoopBackOff":
            self.record_event(pod, "Warning", "BackOff", f"Back-off restarting failed container {name} in pod "
                              f"{pod['metadata']['name']}_{pod['metadata']['namespace']}({pod['metadata']['uid']})",
                              "kubelet", host)
        elif waiting.get("reason") in ("CreateContainerError", "CreateContainerConfigError"):
            self.record_event(pod, "Warning", "Failed", f"Error: {waiting.get('message', '')}", "kubelet", host)

    def _write_container_status(self, pod: dict[str, Any], containers: list[dict[str, Any]],
                                states: list[dict[str, Any]], running: bool) -> None:
        updated = copy.deepcopy(pod)
        status = updated["status"]
        statuses = []
        for container, state in zip(containers, states, strict=True):
            image = container.get("image", "")
            entry: dict[str, Any] = {"name": container.get("name", ""), "image": image, "imageID": "",
                                     "ready": running, "started": running, "restartCount": 0,
                                     "state": state, "lastState": {}}
            if running:
                entry["imageID"] = f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"
                entry["containerID"] = f"cri-o://{uuid.uuid4().hex}"
            statuses.append(entry)
        unready = " ".join(c.get("name", "") for c in containers)
        why = ("", "") if running else ("ContainersNotReady", f"containers with unready status: [{unready}]")
        status.update(
            phase="Running" if running else "Pending",
            containerStatuses=statuses,
            conditions=[
                _condition("PodReadyToStartContainers", True),
                _condition("Initialized", True),
                _condition("Ready", running, *why),
                _condition("ContainersReady", running, *why),
                _condition("PodScheduled", True),
            ],
        )
        self.store.update(PODS, updated)

    def _container_events(self, pod: dict[str, Any], container: dict[str, Any], running: bool, host: str) -> None:
        image, name = container.get("image", ""), container.get("name", "")
        if running:
            self.record_event(pod, "Normal", "Pulled", f'Container image "{image}" already present on machine',
                              "kubelet", host)
            self.record_event(pod, "Normal", "Created", f"Created container: {name}", "kubelet", host)
            self.record_event(pod, "Normal", "Started", f"Started container {name}", "kubelet", host)
        elif self.faults.image_pull_backoff:
            for kind, reason, message in (
                ("Normal", "Pulling", f'Pulling image "{image}"'),
                ("Warning", "Failed", f'Failed to pull image "{image}": initializing source docker://{image}: '
                                      "reading manifest: manifest unknown"),
                ("Warning", "Failed", "Error: ErrImagePull"),
                ("Normal", "BackOff", f'Back-off pulling image "{image}"'),
                ("Warning", "Failed", "Error: ImagePullBackOff"),
            ):
                self.record_event(pod, kind, reason, message, "kubelet", host)
