"""The signals that are a user's stop (SIGINT, SIGTERM, SIGHUP), handled while a block runs: the supervisor's, the
drill's."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterator

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def handling_user_signals(handler: Callable[[int, object], None]) -> Iterator[None]:
    """``handler`` for SIGINT/SIGTERM/SIGHUP (a user's stop) while the block runs; the previous handlers after."""
    previous = {sig: signal.signal(sig, handler) for sig in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for sig, handler_before in previous.items():
            signal.signal(sig, handler_before)
