"""A launch's nodes that run on spare hosts: said before the run starts, with why their own host was left out, and
kept on the run's record (status shows them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from mlenv import state
from mlenv.core.capabilities import LaunchRequest
from mlenv.core.recorded import SpareUse
from mlenv.ops.target import Target
from mlenv.ui import warn


def announce(target: Target, request: LaunchRequest, reasons: Mapping[str, str]) -> None:
    """``node-K: HOST excluded (why), using spare SPARE`` for each node of ``request`` on a spare (``reasons``: host
    -> why it is left out); recorded on the deployment's latest run as ``spares`` when that is this run."""
    if not request.spares:
        return
    for ordinal, (host, spare) in sorted(request.spares.items()):
        warn(f"node-{ordinal}: {host} excluded ({reasons.get(host, 'mlenv nodes says why')}), using spare {spare}")
    if target.recorded is None:
        return
    used = tuple(SpareUse(ordinal, host, spare) for ordinal, (host, spare) in sorted(request.spares.items()))

    def with_spares(runs: state.Runs) -> state.Runs:
        if runs and runs[-1].id == request.spec.run_id:
            return (*runs[:-1], replace(runs[-1], spares=used))
        return runs

    state.update(target.recorded.name, runs=with_spares)
