"""A launch's nodes that run on spare hosts: said before the run starts, with why their own host was left out, and
kept on the run's record (status shows them)."""

from __future__ import annotations

from collections.abc import Mapping

from mlenv import state
from mlenv.core.capabilities import LaunchRequest
from mlenv.ops.target import Target


def announce(target: Target, request: LaunchRequest, run_only: Mapping[str, str]) -> None:
    """``node-K: HOST excluded (why), using spare SPARE`` for each node of ``request`` on a spare (why: the
    deployment's record, else ``run_only``: host -> why it is left out of this run only); recorded on the
    deployment's latest run as ``spares``."""
    from mlenv.ui import warn

    if not request.spares:
        return
    known = state.load().deployments.get(target.recorded.name) if target.recorded else None
    reasons = {**run_only, **{str(entry.get("host")): str(entry.get("reason"))
                              for entry in (known.excluded if known else ())}}
    for ordinal, (host, spare) in sorted(request.spares.items()):
        warn(f"node-{ordinal}: {host} excluded ({reasons.get(host, 'mlenv nodes says why')}), using spare {spare}")
    if known is not None and known.runs and known.runs[-1].get("id") == request.spec.run_id:
        used = [{"node": ordinal, "host": host, "spare": spare}
                for ordinal, (host, spare) in sorted(request.spares.items())]
        state.update(known.name, runs=(*known.runs[:-1], {**known.runs[-1], "spares": used}))
