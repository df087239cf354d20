"""Wait for a deployment's pods to be Ready (or gone) with a live view; one list call per kind per tick."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from mlenv.backends.kube import pods as podview
from mlenv.backends.kube.client import Client
from mlenv.backends.kube.explain import Trouble, pod_trouble, statefulset_trouble
from mlenv.errors import OperationError
from mlenv.plan import Deployment

POLL_SECONDS = 1.0
CLOCK_SLACK = timedelta(seconds=30)
"""Events up to this much older than the start of a deploy still count (client and server clocks differ)."""
MAX_ROWS = 16
REVISION_LABEL = "controller-revision-hash"


@contextmanager
def live_view() -> Iterator[Callable[[Any], None]]:
    """A rich Live display on stderr; yields ``update(renderable)``."""
    from rich.console import Console
    from rich.live import Live

    with Live(console=Console(stderr=True), refresh_per_second=4, transient=False) as live:
        yield live.update


def _table(title: str, rows: list[tuple[str, str, str, str]], hidden: int) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, header_style="bold")
    for column in ("POD", "NODE", "PHASE", "DETAIL"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*row)
    if hidden:
        table.add_row(f"... {hidden} more ready", "", "", "")
    return table


def _view(d: Deployment, found: dict[int, dict[str, Any]], ready: set[int], troubles: dict[str, Trouble],
          elapsed: float) -> Any:
    """Ready x/N and the pods that are not ready first (at most MAX_ROWS rows)."""
    rows = []
    for index in sorted(range(d.nodes), key=lambda i: (i in ready, i)):
        name = f"{d.app}-{index}"
        pod = found.get(index)
        if pod is None:
            rows.append((name, "-", "not created", str(troubles.get(f"statefulset {d.app}", ""))))
            continue
        trouble = troubles.get(name)
        phase = (pod.get("status") or {}).get("phase", "Unknown")
        rows.append((name, (pod.get("spec") or {}).get("nodeName") or "-", "Ready" if index in ready else phase,
                     trouble.words if trouble else ""))
    title = f"{d.app} in {d.namespace}: {len(ready)}/{d.nodes} pods ready ({elapsed:.0f}s)"
    return _table(title, rows[:MAX_ROWS], len(rows) - MAX_ROWS if len(rows) > MAX_ROWS else 0)


def _current(pod: dict[str, Any], sts: dict[str, Any] | None) -> bool:
    """Whether the pod runs the StatefulSet's latest spec, as far as its controller has seen it."""
    if sts is None:
        return False
    status = sts.get("status") or {}
    if status.get("observedGeneration", 0) < sts["metadata"].get("generation", 0):
        return False
    revision = status.get("updateRevision")
    return revision is None or (pod["metadata"].get("labels") or {}).get(REVISION_LABEL, revision) == revision


def wait_ready(client: Client, d: Deployment, timeout: float) -> None:
    """Return once every pod is Ready on the current revision; OperationError on a permanent reason or timeout."""
    selector = podview.selector(d)
    started, since = time.monotonic(), datetime.now(timezone.utc) - CLOCK_SLACK
    first_seen: dict[tuple[str, str], float] = {}
    with live_view() as update:
        while True:
            statefulset = next(iter(client.list("statefulsets", selector)), None)
            found = {i: p for i, p in podview.by_ordinal(client.list("pods", selector), d.app).items() if i < d.nodes}
            ready = {i for i, p in found.items() if podview.is_ready(p) and _current(p, statefulset)}
            troubles: dict[str, Trouble] = {}
            if len(ready) < d.nodes:
                events = client.list("events")
                found_troubles = [pod_trouble(p, events) for i, p in found.items() if i not in ready]
                if len(found) < d.nodes:
                    found_troubles.append(statefulset_trouble(events, d, since))
                troubles = {t.subject: t for t in found_troubles if t is not None}
            now = time.monotonic()
            update(_view(d, found, ready, troubles, now - started))
            if len(ready) == d.nodes:
                return
            first_seen = {(t.subject, t.reason): first_seen.get((t.subject, t.reason), now)
                          for t in troubles.values()}
            permanent = [t for t in troubles.values()
                         if t.grace is not None and now - first_seen[(t.subject, t.reason)] >= t.grace]
            if permanent:
                raise OperationError(_failure(d, ready, permanent, "cannot become ready"))
            if now - started >= timeout:
                raise OperationError(_failure(d, ready, list(troubles.values()), f"not ready after {timeout:.0f}s"))
            time.sleep(POLL_SECONDS)


def _failure(d: Deployment, ready: set[int], troubles: list[Trouble], what: str) -> str:
    """The headline, then one line per distinct reason with the pods it hits."""
    by_words: dict[str, list[str]] = {}
    for trouble in troubles:
        by_words.setdefault(trouble.words, []).append(trouble.subject)
    lines = [f"{d.app} in {d.namespace} {what} ({len(ready)}/{d.nodes} pods ready)"]
    for words, subjects in by_words.items():
        more = f" and {len(subjects) - 3} more" if len(subjects) > 3 else ""
        lines.append(f"{', '.join(subjects[:3])}{more}: {words}")
    return "\n".join(lines)


def wait_gone(client: Client, d: Deployment, timeout: float) -> None:
    """Return once no pod of the deployment is left; OperationError after ``timeout``."""
    started = time.monotonic()
    selector = podview.selector(d)
    with live_view() as update:
        while True:
            left = [p["metadata"]["name"] for p in client.list("pods", selector)]
            elapsed = time.monotonic() - started
            update(f"{d.app} in {d.namespace}: {len(left)} pods left ({elapsed:.0f}s)")
            if not left:
                return
            if elapsed >= timeout:
                raise OperationError(f"pods still there after {timeout:.0f}s: {', '.join(left[:5])}; "
                                     f"see: oc get pods -n {d.namespace} -l app.kubernetes.io/instance={d.app}")
            time.sleep(POLL_SECONDS)
