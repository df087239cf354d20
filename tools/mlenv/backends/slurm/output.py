"""A run's combined output (srun's ``--label`` lines of every node, and the job script's own) as the user sees
it: ``[node-N] line`` on stdout and each node's lines in its own local log; the script's lines as they are."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import IO

from mlenv.parallel import node_line

LABEL = re.compile(r" *(\d+): (.*)")
FAILED = re.compile(r"mlenv: node (\d+) failed first, with exit code (\d+)")
"""The script's last words when a node failed (body.sh.j2)."""


class NodeOutput:
    """Splits labelled output into per-node logs (``log_dir/node-N.log``) and prefixed lines on stdout."""

    def __init__(self, log_dir: Path, nodes: int) -> None:
        self.paths = {node: log_dir / f"node-{node}.log" for node in range(nodes)}
        self._files: dict[int, IO[str]] = {node: path.open("a", encoding="utf-8") for node, path in self.paths.items()}
        self._partial = b""
        self.failed: tuple[int, int] | None = None
        """(node, exit code) of the node that failed first, as the script reported it."""

    def feed(self, data: bytes) -> None:
        """Take more of the output; complete lines are shown at once."""
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            self.line(raw.decode(errors="replace").rstrip("\r"))

    def line(self, text: str) -> None:
        """One line of the output."""
        labelled = LABEL.fullmatch(text)
        if labelled and int(labelled[1]) in self._files:
            node = int(labelled[1])
            self._files[node].write(labelled[2] + "\n")
            self._files[node].flush()
            text = node_line(node, labelled[2])
        elif failed := FAILED.fullmatch(text):
            self.failed = (int(failed[1]), int(failed[2]))
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def close(self) -> None:
        """Show what is left of an unfinished last line; close the logs."""
        if self._partial:
            self.line(self._partial.decode(errors="replace"))
            self._partial = b""
        for handle in self._files.values():
            handle.close()
