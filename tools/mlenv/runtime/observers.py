"""What the node supervisor hands out: every whole line and every rank event, to observers.

Observers (the transport proof, the hang watchdog, the restart policy) never read the output another way. They
act through :class:`JobControl`: notes to the user, the node's state, and one way to stop the whole job. All of
them are built in :func:`observers_for`, from the options of ``python3 -m mlenv.runtime launch``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .ncclog import contradicts, parse_nccl_log


@dataclass(frozen=True)
class RankInfo:
    """One rank of the job: ``rank`` is the global rank read from the worker's own ``RANK``."""

    rank: int
    local_rank: int
    node: int
    host: str
    pid: int  # the user's training process (the one py-spy attaches to)


class JobControl(Protocol):
    """What an observer may do to the job."""

    run_dir: Path
    """This node's attempt directory: ``runs/<id>/attempt-<K>/node<R>``."""

    def ranks(self) -> list[RankInfo]:
        """The ranks of this node that have started, by global rank."""

    def note(self, message: str) -> None:
        """``mlenv: message`` to the attached user and output.log."""

    def set_state(self, state: str, **fields: object) -> None:
        """Set this node's state (one of runlayout.RUN_STATES) and extra fields of state.json, e.g.
        ``set_state("hung", stacks=path)``."""

    def stop(self, reason: str, exit_code: int) -> None:
        """Stop the whole job on every node; recorded as ``reason``, the node exits ``exit_code``."""


class Observer(Protocol):
    """Told of everything the node supervisor sees, in order, from the supervisor's one thread."""

    def started(self, control: JobControl) -> None: ...

    def rank_started(self, rank: RankInfo) -> None: ...

    def line(self, rank: RankInfo | None, text: str) -> None:
        """One whole line without its newline; ``rank`` None for the launcher's own (torchrun, DeepSpeed)."""

    def rank_exited(self, rank: RankInfo, exit_code: int, signal: str | None) -> None: ...

    def tick(self, now: float) -> None:
        """About once a second (``time.monotonic()``), for watchdogs."""

    def finished(self, exit_code: int) -> int:
        """The node's exit code so far; returns it, or another (e.g. nothing proven -> 1)."""


class BaseObserver:
    """No-op methods: an observer implements only what it needs."""

    control: JobControl | None = None

    def started(self, control: JobControl) -> None:
        self.control = control

    def rank_started(self, rank: RankInfo) -> None:
        return None

    def line(self, rank: RankInfo | None, text: str) -> None:
        return None

    def rank_exited(self, rank: RankInfo, exit_code: int, signal: str | None) -> None:
        return None

    def tick(self, now: float) -> None:
        return None

    def finished(self, exit_code: int) -> int:
        return exit_code

    def note(self, message: str) -> None:
        if self.control is not None:
            self.control.note(message)


class TransportCheck(BaseObserver):
    """After the job: what NCCL's INFO lines say it used; a successful job that contradicts ``expect`` fails."""

    def __init__(self, expect: str | None) -> None:
        self.expect = expect
        self.lines: list[str] = []

    def line(self, rank: RankInfo | None, text: str) -> None:
        if "NCCL" in text:
            self.lines.append(text)

    def finished(self, exit_code: int) -> int:
        report = parse_nccl_log(self.lines)
        if not report.ranks:
            if self.expect:
                self.note(f"no NCCL INFO lines in the output: cannot verify that NCCL used {self.expect}")
            return exit_code
        for rank in report.ranks:
            self.note(rank.summary())
        self.note(f"NCCL transport: {report.verdict}")
        if self.expect and contradicts(report.verdict, self.expect):
            self.note(f"error: the cluster file asks for {self.expect} but NCCL used {report.verdict}")
            return exit_code or 1
        return exit_code


def expected_transport(environ: Mapping[str, str]) -> str | None:
    """``rdma`` when the cluster file asked for it (``MLENV_NETWORK_MODE``)."""
    return "rdma" if environ.get("MLENV_NETWORK_MODE") == "rdma" else None


def observers_for(options: argparse.Namespace, environ: Mapping[str, str]) -> list[Observer]:
    """Every observer of a launch, from its options (``python3 -m mlenv.runtime launch ...``) and environment.
    The one place observers are built: each later option adds its own here."""
    return [TransportCheck(expected_transport(environ))]
