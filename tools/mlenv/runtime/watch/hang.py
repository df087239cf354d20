"""The hang watchdog (``launch --hang-timeout SECONDS [--on-hang stop]``): an observer on every node's supervisor.

Silence is judged for the whole job, by node 0 (the hub): every node tells it, at most once a second, that its ranks
wrote output: any bytes, so a progress bar's updates (``\\r``, no newline until its loop ends) are output. When no
rank anywhere has written for the timeout, node 0 asks every node for its ranks' stacks (``stacks.sample``: py-spy,
else faulthandler), and again a few seconds later: a job that is busy without a word
(importing, compiling) shows other functions the second time, and the watch goes on. When both samples agree, node 0
writes one capture of the whole job into its run directory
(``stacks/<UTC time>/``: stacks.json, stacks.txt, and ncclras.txt where NCCL's RAS client exists), and every node
tells its attached user and records the state ``hung`` with ``stacks`` = the capture's path. With ``--on-hang
stop`` node 0 then stops the job (exit code 124, as ``timeout``). Output again leaves ``hung``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..forensics import collectives
from ..forensics.culprit import culprit_of
from ..forensics.flightrecorder import flight_dumps, keep_ras_answer
from ..forensics.stacks import group, render, sample
from ..records.jsonvalue import JsonObject, JsonValue, int_of
from ..records.runlayout import write_atomic
from ..records.states import RunState
from .protocol import BaseObserver, JobControl, RankInfo

HANG_EXIT_CODE = 124
"""What ``--on-hang stop`` exits with: the code ``timeout`` uses."""
ANSWER_SECONDS = 30.0
"""How long node 0 waits for the other nodes' stacks before it goes on without them."""
CONFIRM_SECONDS = 5.0
"""Time between the two samples that must agree before a silent job is called hung."""
KIND = "hang"


@dataclass
class _Capture:
    """Node 0's capture while it collects every node's stacks: its name (the UTC time), until when it waits, and
    what the nodes sent (the ranks' stacks and collective records, the flight recorder's dumps)."""

    name: str
    deadline: float
    ranks: list[JsonObject] = field(default_factory=list)
    nodes: set[int] = field(default_factory=set)
    collectives: JsonObject = field(default_factory=dict)
    flight_dumps: list[JsonValue] = field(default_factory=list)


class HangWatchdog(BaseObserver):
    """No rank output for ``timeout`` seconds, job-wide: capture every rank's stack once, state ``hung``."""

    def __init__(self, timeout: float, on_hang: str | None) -> None:
        self.timeout = timeout
        self.on_hang = on_hang
        self.last_output = time.monotonic()  # the job's, as node 0 knows it
        self.last_told = 0.0
        self.hung = False
        self.capture: _Capture | None = None  # node 0, while it collects
        self.reference: list[tuple[int, tuple[tuple[str, str], ...]]] | None = None  # the previous sample's
        self.confirm_at: float | None = None

    # what every node does ---------------------------------------------------------------------------------------
    def started(self, control: JobControl) -> None:
        super().started(control)
        self.last_output = time.monotonic()

    def output(self, rank: RankInfo) -> None:
        """Any bytes from a rank are output: a progress bar's ``\\r`` updates keep a job from looking hung."""
        if self.control is None:
            return
        now = time.monotonic()
        if now - self.last_told >= 1.0 or self.hung:
            self.last_told = now
            self.control.tell_hub({"kind": KIND, "event": "output"})

    def message(self, message: Mapping[str, Any]) -> None:
        if message.get("kind") != KIND or self.control is None:
            return
        event = message.get("event")
        if event == "output" and self.control.hub:
            self.last_output = time.monotonic()
            self.capture = self.reference = self.confirm_at = None
            if self.hung:
                self.control.tell_all({"kind": KIND, "event": "resumed"})
        elif event == "sample":
            ranks = [asdict(rank) for rank in self.control.ranks()]
            records = self.control.run_dir / "stacks" / "collectives"
            token = collectives.ask(records)  # answered while the stacks are taken
            taken = sample(ranks, dumps=self.control.run_dir / "stacks" / "faulthandler",
                           workspace=Path.cwd())
            progress = collectives.read(records, [int(rank["rank"]) for rank in ranks], token)
            self.control.tell_hub({"kind": KIND, "event": "stacks", "name": message.get("name"),
                                   "node": self.control.node, "ranks": [stack.to_dict() for stack in taken],
                                   "collectives": {str(rank): record for rank, record in progress.items()},
                                   "flight_dumps": [str(p) for p in flight_dumps(self.control.run_dir)]})
        elif event == "stacks" and self.control.hub:
            self._collected(message)
        elif event == "hung":
            self.hung = True
            self.note(f"no rank wrote output for {self.timeout:g} s: the job looks hung; every rank's stack is in "
                      f"{message['stacks']}")
            for line in str(message.get("text") or "").splitlines():
                self.note(f"  {line}")
            self.control.set_state(RunState.HUNG, stacks=message["stacks"])
        elif event == "resumed" and self.hung:
            self.hung = False
            self.note("output again: the job is no longer hung")
            self.control.set_state(RunState.RUNNING)

    # what node 0 does -------------------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        if self.control is None or not self.control.hub:
            return
        if self.capture is not None and now >= self.capture.deadline:
            self._sampled()
        elif not self.hung and self.capture is None and now - self.last_output >= self.timeout \
                and (self.confirm_at is None or now >= self.confirm_at):
            name = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
            self.capture = _Capture(name, now + ANSWER_SECONDS)
            self.control.tell_all({"kind": KIND, "event": "sample", "name": name})

    def _collected(self, message: Mapping[str, Any]) -> None:
        if self.capture is None or message.get("name") != self.capture.name or self.control is None:
            return
        self.capture.nodes.add(int_of(message["node"], "node"))
        self.capture.ranks += [rank for rank in message.get("ranks") or [] if isinstance(rank, dict)]
        self.capture.collectives.update(message.get("collectives") or {})
        self.capture.flight_dumps += list(message.get("flight_dumps") or [])
        if len(self.capture.nodes) >= self.control.num_nodes:
            self._sampled()

    def _sampled(self) -> None:
        """A sample of every rank is in: the capture when it agrees with the previous one, else the reference for
        the next."""
        if self.capture is None:
            return
        capture, self.capture = self.capture, None
        signature = sorted(map(_signature, capture.ranks))
        if self.reference is not None and signature == self.reference:
            self._write(capture)
        else:
            self.reference, self.confirm_at = signature, time.monotonic() + CONFIRM_SECONDS

    def _write(self, capture: _Capture) -> None:
        """The capture of the whole job into node 0's run directory; then every node is told."""
        if self.control is None:
            return
        self.reference = self.confirm_at = None
        directory = self.control.run_dir / "stacks" / capture.name.split(".")[0]
        directory.mkdir(parents=True, exist_ok=True)
        ranks = sorted(capture.ranks, key=lambda r: int_of(r["rank"], "rank"))
        groups = group(ranks)
        behind = culprit_of(ranks, capture.collectives)
        text = f"collectives: {behind.text}\n{render(groups)}"
        missing = sorted(set(range(self.control.num_nodes)) - capture.nodes)
        if missing:
            text += "\n" + "\n".join(f"node-{n}: no stacks (no answer within {ANSWER_SECONDS:g} s)" for n in missing)
        write_atomic(directory / "stacks.txt", text + "\n")
        report = {"captured_at": capture.name, "reason": f"no rank output for {self.timeout:g} s",
                  "ranks": ranks, "groups": groups, "collectives": behind.to_json(),
                  "flight_dumps": capture.flight_dumps, "missing_nodes": missing}
        write_atomic(directory / "stacks.json", json.dumps(report, indent=2) + "\n")
        keep_ras_answer(directory)
        self.control.tell_all({"kind": KIND, "event": "hung", "stacks": str(directory.absolute()), "text": text})
        if self.on_hang == "stop":
            self.control.stop(f"hung: no rank output for {self.timeout:g} s (stacks in {directory.absolute()})",
                              HANG_EXIT_CODE)


def _signature(stack: JsonObject) -> tuple[int, tuple[tuple[str, str], ...]]:
    """A rank's stack as two samples are compared: its rank, and each frame's function and file."""
    frames = stack.get("frames")
    listed = frames if isinstance(frames, list) else []
    return int_of(stack["rank"], "rank"), tuple((str(frame["function"]), str(frame["file"]))
                                                for frame in listed if isinstance(frame, dict))
