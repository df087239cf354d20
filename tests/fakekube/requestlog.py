"""A record of every request the fake served, so tests and benchmarks can count a client's API calls."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RequestRecord:
    """One served request. ``verb`` is the Kubernetes verb (get, list, watch, create, update, patch, delete,
    deletecollection) for resource requests, ``discovery`` for /api, /apis, /version and /openapi."""

    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    verb: str = ""
    resource: str = ""
    namespace: str = ""
    name: str = ""
    status: int = 0
    user_agent: str = ""


class RequestLog:
    """Thread-safe list of :class:`RequestRecord`; ``count(verb="list", resource="pods")`` filters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []

    def append(self, record: RequestRecord) -> None:
        """Add one record (the HTTP handler does this)."""
        with self._lock:
            self._records.append(record)

    def clear(self) -> None:
        """Forget everything recorded so far."""
        with self._lock:
            self._records.clear()

    def records(self, **match: str | int) -> list[RequestRecord]:
        """The records whose fields equal every given keyword (``verb="list"``, ``resource="pods"``...)."""
        with self._lock:
            snapshot = list(self._records)
        return [r for r in snapshot if all(getattr(r, k) == v for k, v in match.items())]

    def count(self, **match: str | int) -> int:
        """How many records match (see :meth:`records`)."""
        return len(self.records(**match))

    def api_calls(self) -> list[RequestRecord]:
        """The records that touched resources (not discovery)."""
        return [r for r in self.records() if r.verb != "discovery"]
