"""The one restart loop: a run's attempts, one at a time, each judged by the restart policy (restartpolicy.py) on
the same facts (:class:`~.restartpolicy.AttemptEnd`). mlenv's attached driver (ops/launch.py), a detached run's
supervisor (supervise/detached.py, where each attempt's end starts the next in the background) and a Slurm run's
script (supervise/slurmsteps.py) call it; each brings how an attempt starts and ends, and what it does with a
verdict (who takes a left-out node's place, what is said)."""

from __future__ import annotations

from collections.abc import Callable

from .restartpolicy import AttemptEnd, History, Verdict, decide

Start = Callable[[int], AttemptEnd]
"""Runs attempt K to its end (or finds how it ended) and hands back the facts of its end."""
GoOn = Callable[[AttemptEnd, "Verdict | None"], "int | None"]
"""The caller's part of a verdict (None: the attempt is not run again): the next attempt's number, or None where the
run ends (a stop, no node to take a left-out one's place, the next attempt started elsewhere)."""


def run_attempts(start: Start, go_on: GoOn, attempt: int, max_restarts: int,
                 history: History | None = None) -> tuple[AttemptEnd, Verdict | None]:
    """Attempt ``attempt`` and each one after it that the policy allows (``max_restarts``) and ``go_on`` starts, the
    run's ``history`` (None: a new run's) carried from one to the next; the last attempt's end and verdict."""
    history = history or History()
    while True:
        end = start(attempt)
        verdict = decide(end, max_restarts, history)
        if verdict is not None:
            history = verdict.history
        following = go_on(end, verdict)
        if following is None:
            return end, verdict
        attempt = following
