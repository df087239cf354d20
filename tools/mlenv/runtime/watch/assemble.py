"""The one place a launch's observers are built : each later option adds its own here."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from ..forensics import collectives
from ..node.topology import host_name
from .faultsigns import NodeFaultWatch
from .hang import HangWatchdog
from .idle import DEFAULT_IDLE_UTIL, IdleWatch, Sampler, sample_interval
from .progress import ProgressFacts
from .protocol import Observer
from .stragglers import StragglerWatch
from .transportproof import TransportProof, expectation


def observers_for(options: argparse.Namespace, environ: Mapping[str, str]) -> list[Observer]:
    """Every observer of a launch, from its options (``python3 -m mlenv.runtime launch ...``) and environment."""
    found: list[Observer] = [TransportProof(expectation(getattr(options, "expect_transport", None), environ), environ),
                             NodeFaultWatch(), ProgressFacts(environ)]
    if getattr(options, "hang_timeout", None):
        found.append(HangWatchdog(options.hang_timeout, getattr(options, "on_hang", None)))
    if getattr(options, "idle_seconds", None):
        window = float(options.idle_seconds)
        threshold = DEFAULT_IDLE_UTIL if options.idle_util is None else float(options.idle_util)
        found.append(IdleWatch(threshold, window, getattr(options, "on_idle", None),
                               Sampler(sample_interval(window), environ), host_name(environ)))
    if collectives.enabled(environ):
        found.append(StragglerWatch(on_straggler=getattr(options, "on_straggler", None)))
    return found
