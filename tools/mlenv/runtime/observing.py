"""The one place a launch's observers are built (CONTRACT.md section 2): each later option adds its own here."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from .hang import HangWatchdog
from .nodefault import NodeFaultWatch
from .observers import Observer
from .transport import TransportProof, expectation


def observers_for(options: argparse.Namespace, environ: Mapping[str, str]) -> list[Observer]:
    """Every observer of a launch, from its options (``python3 -m mlenv.runtime launch ...``) and environment."""
    found: list[Observer] = [TransportProof(expectation(getattr(options, "expect_transport", None), environ), environ),
                             NodeFaultWatch()]
    if getattr(options, "hang_timeout", None):
        found.append(HangWatchdog(options.hang_timeout, getattr(options, "on_hang", None)))
    return found
