"""Nodes left out on Kubernetes: the StatefulSet's pods are kept off the excluded Kubernetes nodes by a required
node affinity (``kubernetes.io/hostname NotIn``), beside the pinned nodes' ``In``. ``deploy`` renders it from the
deployment's excluded nodes; ``launch`` brings the live StatefulSet to the run's exclusions (a node the restart
policy just left out, or one ``mlenv nodes --forget-excluded`` let back), which replaces its pods, and waits until
every pod is Ready again; when no node can take a pod, the scheduler's reason ends the launch. A detached run
whose pods may move (``scheduling.move_faulty_pods``) makes the same patch itself, through its pods' mover
(runtime/supervise/podmover.py); mlenv records the nodes it left out when it next looks (:func:`record_moves`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from mlenv.backends.kubeapi.client import Client, KubeError
from mlenv.backends.kubeapi.naming import KubeHandle
from mlenv.backends.kubeapi.objects import ObjectMeta, Pod, StatefulSet
from mlenv.backends.kubeapi.waiting import wait_ready
from mlenv.core.registry import Records
from mlenv.errors import OperationError
from mlenv.runtime.records.runlayout import LEFT_OUT_ANNOTATION, LEFT_OUT_UNRECORDED
from mlenv.runtime.supervise.kubemove import recorded
from mlenv.runtime.supervise.podmover import affinity_patch, kept_off
from mlenv.ui import info, warn

READY_TIMEOUT = 900.0
"""Seconds the pods get to be Ready on other nodes (a reason the scheduler gives that lasts ends it sooner)."""


def _annotation(obj: Pod | StatefulSet, key: str) -> str:
    """An object's annotation ``key`` ('' when it has none)."""
    return str(((obj.get("metadata") or ObjectMeta()).get("annotations") or {}).get(key, ""))


def _statefulset(client: Client, target: KubeHandle) -> StatefulSet:
    """The live StatefulSet; OperationError saying so where it was deleted by hand."""
    try:
        found: StatefulSet = json.loads(client.run("get", ["statefulset", target.app, "-o=json"]))
    except KubeError as exc:
        if exc.reason != "NotFound":
            raise
        raise OperationError(f"the StatefulSet {target.app} of {target.cluster_name} is not in {target.namespace} "
                             f"(deleted by hand?): nothing to launch on; mlenv deploy makes it again") from None
    return found


def record_moves(client: Client, target: KubeHandle, statefulset: StatefulSet, records: Records) -> list[str]:
    """Record on the deployment the nodes that a detached run left out for a node-fault sign and moved its pods off
    (the StatefulSet's LEFT_OUT_UNRECORDED, removed then), each said; their hosts, which stay kept off."""
    move = recorded(_annotation(statefulset, LEFT_OUT_UNRECORDED))
    if move is None:
        return []
    for entry in move.nodes:
        warn(f"run {move.run} left {entry.host} (node-{entry.node}) out and moved its pod: {entry.reason}"
             + ("" if entry.saved else " (for that run only)"))
    saved = {entry.node: (entry.host, entry.reason) for entry in move.nodes if entry.saved}
    if saved:
        records.exclude(target.cluster_name, saved)
    try:
        client.run("annotate", ["statefulset", target.app, f"{LEFT_OUT_UNRECORDED}-"])
    except KubeError as exc:  # recorded here all the same; said, as the next look records it again
        warn(f"{target.app}: the move could not be marked recorded on the cluster: {exc}")
    return [host for host, _ in saved.values()]


def moved_by_a_run(pods: Iterable[Pod], records: Records, name: str) -> bool:
    """Whether a pod was made again by a detached run's move off a node that the records of deployment ``name``
    lack (read only where a pod says it was moved)."""
    hosts = set()
    for pod in pods:
        move = recorded(_annotation(pod, LEFT_OUT_ANNOTATION))
        if move is not None:
            hosts |= {entry.host for entry in move.nodes if entry.saved}
    return bool(hosts - {entry.host for entry in (records.excluded_of(name) if hosts else ())})


def record_seen_moves(client: Client, target: KubeHandle, pods: Iterable[Pod], records: Records) -> None:
    """What ``status`` does with the pods it listed: where they say a detached run moved them off a node that the
    records lack, read the StatefulSet and record it (:func:`record_moves`); no call otherwise."""
    if moved_by_a_run(pods, records, target.cluster_name):
        record_moves(client, target, _statefulset(client, target), records)


def keep_off(client: Client, target: KubeHandle, excluded: Sequence[str], records: Records) -> None:
    """Bring the live StatefulSet to ``excluded`` and the nodes a detached run moved its pods off since mlenv last
    looked (recorded then: :func:`record_moves`), a merge patch of its node affinity that replaces its pods, and
    wait until every pod is Ready again; nothing when it is there already."""
    statefulset = _statefulset(client, target)
    excluded = [*excluded, *record_moves(client, target, statefulset, records)]
    patch = affinity_patch(statefulset, excluded)
    if patch is None:
        return
    before = kept_off(statefulset)
    back, away = sorted(set(before) - set(excluded)), sorted(set(excluded) - set(before))
    info(f"{target.app}: keeping the pods off {', '.join(away)}" if away else f"{target.app}: letting the pods back "
         f"on {', '.join(back)}")
    client.run("patch", ["statefulset", target.app, "--type=merge", "--field-manager=mlenv", "-p", json.dumps(patch)])
    wait_ready(client, target, READY_TIMEOUT)
