"""Wait for a deployment's pods to be Ready (or gone) with a live view; one list call per kind per tick."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

from mlenv.backends.kubernetes import pods as podview
from mlenv.backends.kubernetes.client import Client
from mlenv.backends.kubernetes.explain import Trouble, pod_trouble, statefulset_trouble
from mlenv.errors import OperationError
from mlenv.plan import Deployment

POLL_SECONDS = 1.0
CLOCK_SLACK = timedelta(seconds=30)
"""Events up to this much older than the start of a deploy still count (client and server clocks differ)."""
MAX_ROWS = 16
REVISION_LABEL = "controller-revision-hash"


@contextmanager
def live_view() -> Iterator[Callable[[Any], None]]:
    """Yields ``update(renderable)``: a rich Live display on a terminal's stderr; elsewhere (CI logs, pipes)
    only the last state is printed, once."""
    from rich.console import Console
    from rich.live import Live

    console = Console(stderr=True)
    if console.is_terminal:
        with Live(console=console, refresh_per_second=4) as live:
            yield live.update
        return
    last: list[Any] = []
    try:
        yield last.append
    finally:
        if last:
            console.print(last[-1])


def _view(d: Deployment, found: dict[int, dict[str, Any]], ready: set[int], troubles: dict[str, Trouble],
          elapsed: float) -> Any:
    """Ready x/N, then one line per pod, those not ready first (at most MAX_ROWS), and the StatefulSet's trouble."""
    from rich.table import Table

    table = Table(title=f"{d.app} in {d.namespace}: {len(ready)}/{d.nodes} pods ready ({elapsed:.0f}s)",
                  title_justify="left", show_edge=False, pad_edge=False, header_style="bold")
    for column in ("POD", "NODE", "PHASE"):
        table.add_column(column, no_wrap=True)
    table.add_column("DETAIL", no_wrap=True, overflow="ellipsis")
    order = sorted(range(d.nodes), key=lambda i: (i in ready, i))
    for index in order[:MAX_ROWS]:
        pod = found.get(index)
        name = f"{d.app}-{index}"
        if pod is None:
            table.add_row(name, "-", "not created", "")
            continue
        trouble = troubles.get(name)
        table.add_row(name, (pod.get("spec") or {}).get("nodeName") or "-",
                      "Ready" if index in ready else (pod.get("status") or {}).get("phase", "Unknown"),
                      trouble.words if trouble else "")
    if len(order) > MAX_ROWS:
        table.add_row(f"... {len(order) - MAX_ROWS} more", "", "", "")
    statefulset = troubles.get(f"statefulset {d.app}")
    if statefulset is None:
        return table
    from rich.console import Group
    from rich.text import Text

    return Group(table, Text(str(statefulset), no_wrap=True, overflow="ellipsis"))


def _current(pod: dict[str, Any], sts: dict[str, Any] | None) -> bool:
    """Whether the pod runs the StatefulSet's latest spec, as far as its controller has seen it."""
    if sts is None:
        return False
    status = sts.get("status") or {}
    if status.get("observedGeneration", 0) < sts["metadata"].get("generation", 0):
        return False
    revision = status.get("updateRevision")
    return revision is None or (pod["metadata"].get("labels") or {}).get(REVISION_LABEL, revision) == revision


def _observe(client: Client, d: Deployment, since: datetime
             ) -> tuple[dict[int, dict[str, Any]], set[int], dict[str, Trouble]]:
    """One tick: (pods by ordinal, ordinals ready on the latest spec, troubles by subject); one list call per
    kind, warning events only while something is not ready."""
    selector = podview.selector(d)
    statefulset = next(iter(client.select("statefulsets", selector)), None)
    found = {i: p for i, p in podview.by_ordinal(client.select("pods", selector), d.app).items() if i < d.nodes}
    ready = {i for i, p in found.items() if podview.is_ready(p) and _current(p, statefulset)}
    if len(ready) == d.nodes:
        return found, ready, {}
    events = client.select("events", fields={"type": "Warning"})  # every reason explain reads is a warning
    troubles = [pod_trouble(p, events) for i, p in found.items() if i not in ready]
    if len(found) < d.nodes:
        troubles.append(statefulset_trouble(events, d, since))
    return found, ready, {t.subject: t for t in troubles if t is not None}


def wait_ready(client: Client, d: Deployment, timeout: float) -> None:
    """Return once every pod is Ready on the latest spec; OperationError once a reason has lasted its grace
    period (see explain.GRACE_SECONDS) or at ``timeout``, naming the reasons."""
    started, since = time.monotonic(), datetime.now(timezone.utc) - CLOCK_SLACK
    first_seen: dict[tuple[str, str], float] = {}
    with live_view() as update:
        while True:
            found, ready, troubles = _observe(client, d, since)
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
    lines.append(f"deploy again once fixed (it converges), or remove it: mlenv clean --cluster {d.cluster.source}")
    return "\n".join(lines)


def wait_gone(client: Client, d: Deployment, timeout: float) -> None:
    """Return once no pod of the deployment is left; OperationError after ``timeout``."""
    started = time.monotonic()
    selector = podview.selector(d)
    left = [p["metadata"]["name"] for p in client.select("pods", selector)]
    if not left:
        return
    with live_view() as update:
        while left:
            elapsed = time.monotonic() - started
            if elapsed >= timeout:
                raise OperationError(f"pods still there after {timeout:.0f}s: {', '.join(left[:5])}; see: "
                                     f"{client.flavour} get pods -n {d.namespace} -l {podview.INSTANCE_LABEL}={d.app}")
            update(f"{d.app} in {d.namespace}: waiting for {len(left)} pods to go ({elapsed:.0f}s)")
            time.sleep(POLL_SECONDS)
            left = [p["metadata"]["name"] for p in client.select("pods", selector)]
        update(f"{d.app} in {d.namespace}: all pods gone ({time.monotonic() - started:.0f}s)")
