"""Wait for a deployment's pods to be Ready (or gone) with a live view; one list call per kind per tick.

The pods are a :class:`PodSet`: the StatefulSet's pods of the Kubernetes backend (:func:`statefulset_pods`), or any
other workload's pods found by their labels and put in node order by the backend that knows their names."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from mlenv.backends.kubeapi import pods as podview
from mlenv.backends.kubeapi.client import Client
from mlenv.backends.kubeapi.explain import Trouble, pod_trouble, statefulset_trouble
from mlenv.backends.kubeapi.naming import KubeHandle, instance
from mlenv.backends.kubeapi.objects import Event, Pod, StatefulSet
from mlenv.backends.kubeapi.queued import queues
from mlenv.errors import OperationError
from mlenv.ui import View, cut, layout, live_view

POLL_SECONDS = 1.0
CLOCK_SLACK = timedelta(seconds=30)
"""Events up to this much older than the start of a deploy still count (client and server clocks differ)."""
MAX_ROWS = 16
REVISION_LABEL = "controller-revision-hash"


@dataclass(frozen=True)
class PodSet:
    """The pods a wait follows: how to list them, their node order, and what explains the ones not there yet."""

    target: KubeHandle
    """The deployment they belong to (namespace, name, node count, cluster file) as messages name it."""
    selector: Mapping[str, str]
    """The labels that list them (one list call per tick)."""
    order: Callable[[list[Pod]], dict[int, Pod]]
    """Listed pods -> the deployment's pods by node ordinal."""
    pod_name: Callable[[int], str]
    """The name of node ``ordinal``'s pod before it exists (a row of the live view)."""
    missing: Callable[[list[Event], datetime], Trouble | None]
    """Why pods are missing, from the namespace's warning events since the wait started."""
    statefulset: bool = False
    """Made by the deployment's StatefulSet: a pod counts as ready only on the StatefulSet's latest revision."""
    again: str = "deploy again once fixed (it converges)"
    """What the failure message says to do once the reason is fixed."""

    @property
    def label_selector(self) -> str:
        """The selector as ``-l`` takes it."""
        return ",".join(f"{key}={value}" for key, value in self.selector.items())


def statefulset_pods(d: KubeHandle) -> PodSet:
    """The pods of the Kubernetes backend's StatefulSet ``d.app``: ``<app>-N`` with ordinal N."""
    return PodSet(d, instance(d.app), lambda pods: podview.by_ordinal(pods, d.app), lambda index: f"{d.app}-{index}",
                  lambda events, since: statefulset_trouble(events, d, since), statefulset=True)


def _view(pods: PodSet, found: dict[int, Pod], ready: set[int], troubles: dict[str, Trouble],
          elapsed: float) -> View:
    """Ready x/N, then one line per pod, those not ready first (at most MAX_ROWS), then the troubles that are not a
    pod's (a StatefulSet's, a workload's); drawn at the terminal's width (the details cut first)."""
    d = pods.target
    rows: list[list[str]] = []
    order = sorted(range(d.nodes), key=lambda i: (i in ready, i))
    for index in order[:MAX_ROWS]:
        pod = found.get(index)
        if pod is None:
            rows.append([pods.pod_name(index), "-", "not created", ""])
            continue
        name = pod["metadata"]["name"]
        trouble = troubles.get(name)
        rows.append([name, (pod.get("spec") or {}).get("nodeName") or "-",
                     "Ready" if index in ready else (pod.get("status") or {}).get("phase", "Unknown"),
                     trouble.words if trouble else ""])
    if len(order) > MAX_ROWS:
        rows.append([f"... {len(order) - MAX_ROWS} more", "", "", ""])
    names = {pod["metadata"]["name"] for pod in found.values()}
    others = [str(trouble) for subject, trouble in troubles.items() if subject not in names]
    title = f"{d.app} in {d.namespace}: {len(ready)}/{d.nodes} pods ready ({elapsed:.0f}s)"

    def draw(width: int | None, style: bool) -> str:
        notes = [cut(line, width) for line in (title, *others)]
        return (notes[0] + "\n" + layout(None, ("POD", "NODE", "PHASE", "DETAIL"), rows, width, style)
                + "".join(f"{note}\n" for note in notes[1:]))

    return draw


def _current(pod: Pod, sts: StatefulSet | None) -> bool:
    """Whether the pod runs the StatefulSet's latest spec, as far as its controller has seen it."""
    if sts is None:
        return False
    status = sts.get("status") or {}
    if status.get("observedGeneration", 0) < sts["metadata"].get("generation", 0):
        return False
    revision = status.get("updateRevision")
    return revision is None or (pod["metadata"].get("labels") or {}).get(REVISION_LABEL, revision) == revision


def _observe(client: Client, pods: PodSet, since: datetime
             ) -> tuple[dict[int, Pod], set[int], dict[str, Trouble]]:
    """One tick: (pods by ordinal, ordinals ready (on the latest spec), troubles by subject); one list call per
    kind, warning events only while something is not ready."""
    d = pods.target
    statefulset = next(iter(client.statefulsets(pods.selector)), None) if pods.statefulset else None
    found = {i: p for i, p in pods.order(client.pods(pods.selector)).items() if i < d.nodes}
    ready = {i for i, p in found.items()
             if podview.is_ready(p) and (not pods.statefulset or _current(p, statefulset))}
    if len(ready) == d.nodes:
        return found, ready, {}
    events = client.warning_events()
    waiting = [p for i, p in found.items() if i not in ready]
    held = queues(client, waiting)
    troubles = [pod_trouble(p, events, held) for p in waiting]
    if len(found) < d.nodes:
        troubles.append(pods.missing(events, since))
    return found, ready, {t.subject: t for t in troubles if t is not None}


def wait_ready(client: Client, d: KubeHandle, timeout: float) -> None:
    """:func:`wait_pods_ready` for the StatefulSet's pods."""
    wait_pods_ready(client, statefulset_pods(d), timeout)


def wait_pods_ready(client: Client, pods: PodSet, timeout: float) -> None:
    """Return once every pod is Ready (on the latest spec); OperationError once a reason has lasted its grace
    period (see explain.GRACE_SECONDS) or at ``timeout``, naming the reasons."""
    d = pods.target
    started, since = time.monotonic(), datetime.now(timezone.utc) - CLOCK_SLACK
    first_seen: dict[tuple[str, str], float] = {}
    with live_view() as update:
        while True:
            found, ready, troubles = _observe(client, pods, since)
            now = time.monotonic()
            update(_view(pods, found, ready, troubles, now - started))
            if len(ready) == d.nodes:
                return
            first_seen = {(t.subject, t.reason): first_seen.get((t.subject, t.reason), now)
                          for t in troubles.values()}
            permanent = [t for t in troubles.values()
                         if t.grace is not None and now - first_seen[(t.subject, t.reason)] >= t.grace]
            if permanent:
                raise OperationError(_failure(pods, ready, permanent, "cannot become ready"))
            if now - started >= timeout:
                raise OperationError(_failure(pods, ready, list(troubles.values()),
                                              f"not ready after {timeout:.0f}s"))
            time.sleep(POLL_SECONDS)


def _failure(pods: PodSet, ready: set[int], troubles: list[Trouble], what: str) -> str:
    """The headline, then one line per distinct reason with the pods it hits."""
    d = pods.target
    by_words: dict[str, list[str]] = {}
    for trouble in troubles:
        by_words.setdefault(trouble.words, []).append(trouble.subject)
    lines = [f"{d.app} in {d.namespace} {what} ({len(ready)}/{d.nodes} pods ready)"]
    for words, subjects in by_words.items():
        more = f" and {len(subjects) - 3} more" if len(subjects) > 3 else ""
        lines.append(f"{', '.join(subjects[:3])}{more}: {words}")
    lines.append(f"{pods.again}, or remove it: mlenv clean --cluster {d.cluster_file}")
    return "\n".join(lines)


def wait_gone(client: Client, d: KubeHandle, timeout: float) -> None:
    """:func:`wait_pods_gone` for the StatefulSet's pods."""
    wait_pods_gone(client, statefulset_pods(d), timeout)


def wait_pods_gone(client: Client, pods: PodSet, timeout: float) -> None:
    """Return once no pod of the deployment is left; OperationError after ``timeout``."""
    d = pods.target
    started = time.monotonic()
    left = [p["metadata"]["name"] for p in client.pods(pods.selector)]
    if not left:
        return
    with live_view() as update:
        while left:
            elapsed = time.monotonic() - started
            if elapsed >= timeout:
                raise OperationError(f"pods still there after {timeout:.0f}s: {', '.join(left[:5])}; see: "
                                     f"{client.flavour} get pods -n {d.namespace} -l {pods.label_selector}")
            update(f"{d.app} in {d.namespace}: waiting for {len(left)} pods to go ({elapsed:.0f}s)")
            time.sleep(POLL_SECONDS)
            left = [p["metadata"]["name"] for p in client.pods(pods.selector)]
        update(f"{d.app} in {d.namespace}: all pods gone ({time.monotonic() - started:.0f}s)")
