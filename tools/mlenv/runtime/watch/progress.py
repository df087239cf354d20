"""The progress facts of a node's share, for the run's goodput (records/goodput.py): an observer on every node's
supervisor that records, as ``progress`` in the attempt's state.json (epoch seconds, each null until known):

- ``first_collective_at``: when the first ``torch.distributed`` collective of a rank of this node was entered (the
  ranks' collective records, forensics/collectives.py: their ``first_ns``), the job's first productive moment;
- ``first_output_at``: when a rank of this node wrote its first whole line (the productive moment of a job that
  records no collective);
- ``checkpoint_at``: the newest modification time of a file under ``$MLENV_CHECKPOINT_DIR`` when the share ended
  (at most :data:`CHECKPOINT_FILES` files looked at): the work since then is recomputed after a failure;
- ``ended_at``: when the share ended.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from ..forensics import collectives
from ..records.runlayout import CHECKPOINT_VARIABLE
from .protocol import BaseObserver, JobControl, RankInfo

FIELD = "progress"
"""The key of state.json that holds the facts."""
CHECKPOINT_FILES = 10000


class ProgressFacts(BaseObserver):
    """Record the node's first output line, first collective, newest checkpoint and end in its state.json."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.checkpoints = environ.get(CHECKPOINT_VARIABLE) or None
        self.collectives = collectives.enabled(environ)
        self.facts: dict[str, float | None] = {"first_collective_at": None, "first_output_at": None,
                                               "checkpoint_at": None, "ended_at": None}

    def started(self, control: JobControl) -> None:
        super().started(control)
        self._record()

    def line(self, rank: RankInfo | None, text: str) -> None:
        if rank is not None and self.facts["first_output_at"] is None:
            self.facts["first_output_at"] = round(time.time(), 3)
            self._record()

    def tick(self, now: float) -> None:
        if self.control is None or not self.collectives or self.facts["first_collective_at"] is not None \
                or not self.control.ranks():
            return
        directory = self.control.run_dir / "stacks" / "collectives"
        found = [first for record in collectives.read(
                     directory, [rank.rank for rank in self.control.ranks()], wait=0).values()
                 if isinstance(first := record.get("first_ns"), int)]
        if found:
            self.facts["first_collective_at"] = round(min(found) / 1e9, 3)
            self._record()

    def finished(self, exit_code: int) -> int:
        if self.control is not None:
            self.tick(time.monotonic())  # a short job's first collective, recorded since the last tick
        self.facts["checkpoint_at"] = newest_mtime(Path(self.checkpoints)) if self.checkpoints else None
        self.facts["ended_at"] = round(time.time(), 3)
        self._record()
        return exit_code

    def _record(self) -> None:
        if self.control is not None:
            self.control.record(**{FIELD: dict(self.facts)})


def newest_mtime(root: Path, limit: int = CHECKPOINT_FILES) -> float | None:
    """The newest modification time of a file under ``root`` (the first ``limit`` files found); None without one."""
    newest: float | None = None
    seen = 0
    for directory, _, names in os.walk(root):
        for name in names:
            seen += 1
            if seen > limit:
                return newest
            try:
                mtime = os.stat(os.path.join(directory, name)).st_mtime
            except OSError:
                continue
            newest = mtime if newest is None else max(newest, mtime)
    return None if newest is None else round(newest, 3)
