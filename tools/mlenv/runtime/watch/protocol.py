"""What the node supervisor hands out: every whole line (each finished state of a line updated in place with ``\\r``
is one), that a rank wrote at all, and every rank event, to observers.

Observers (the transport proof, the hang watchdog, the restart policy) never read the output another way. They
act through :class:`JobControl`: notes to the user, the node's state, and one way to stop the whole job. All of
them are built in :func:`mlenv.runtime.watch.assemble.observers_for`, from the options of
``python3 -m mlenv.runtime launch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..records.jsonvalue import JsonObject
from ..records.states import NodeFault, RunState


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
    node: int
    num_nodes: int

    @property
    def hub(self) -> bool:
        """Whether this node decides for the job (node 0, or a node that cannot reach node 0)."""

    def tell_hub(self, message: JsonObject) -> None:
        """Hand ``message`` to the observers of the hub (this node's own when it is the hub)."""

    def tell_all(self, message: JsonObject) -> None:
        """From the hub: hand ``message`` to the observers of every node, this one included."""

    def ranks(self) -> list[RankInfo]:
        """The ranks of this node that have started, by global rank."""

    def note(self, message: str) -> None:
        """``mlenv: message`` to the attached user and output.log."""

    def set_state(self, state: RunState, **fields: object) -> None:
        """Set this node's state and extra fields of state.json, e.g. ``set_state(RunState.HUNG, stacks=path)``."""

    def record(self, **fields: object) -> None:
        """Set extra fields of state.json (``None`` clears one); the state stays what it is."""

    def stop(self, reason: str, exit_code: int) -> None:
        """Stop the whole job on every node; recorded as ``reason``, the node exits ``exit_code``."""


class Observer(Protocol):
    """Told of everything the node supervisor sees, in order, from the supervisor's one thread."""

    def started(self, control: JobControl) -> None: ...

    def rank_started(self, rank: RankInfo) -> None: ...

    def line(self, rank: RankInfo | None, text: str) -> None:
        """One whole line without its newline (or one state of a line updated in place, without its ``\\r``);
        ``rank`` None for the launcher's own (torchrun, DeepSpeed)."""

    def output(self, rank: RankInfo) -> None:
        """The rank wrote: any bytes, a whole line or not (a progress bar's ``\\r`` update, part of a line)."""

    def rank_exited(self, rank: RankInfo, exit_code: int, signal: str | None) -> None: ...

    def tick(self, now: float) -> None:
        """About once a second (``time.monotonic()``), for watchdogs."""

    def finished(self, exit_code: int) -> int:
        """The node's exit code so far; returns it, or another (e.g. nothing proven -> 1)."""

    def message(self, message: Mapping[str, Any]) -> None:
        """A message an observer sent with ``tell_hub``/``tell_all`` (observers tell their kind apart)."""

    def node_fault(self) -> NodeFault | None:
        """When a rank of this node fails first: a sign that the node is at fault (faultsigns.py), else None."""


class BaseObserver:
    """No-op methods: an observer implements only what it needs."""

    control: JobControl | None = None

    def started(self, control: JobControl) -> None:
        self.control = control

    def rank_started(self, rank: RankInfo) -> None:
        return None

    def line(self, rank: RankInfo | None, text: str) -> None:
        return None

    def output(self, rank: RankInfo) -> None:
        return None

    def rank_exited(self, rank: RankInfo, exit_code: int, signal: str | None) -> None:
        return None

    def tick(self, now: float) -> None:
        return None

    def finished(self, exit_code: int) -> int:
        return exit_code

    def message(self, message: Mapping[str, Any]) -> None:
        return None

    def node_fault(self) -> NodeFault | None:
        return None

    def note(self, message: str) -> None:
        if self.control is not None:
            self.control.note(message)

