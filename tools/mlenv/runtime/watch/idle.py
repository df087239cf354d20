"""The idle-GPU watch (``launch --idle-seconds S [--idle-util P] [--on-idle stop]``): an observer on every node's
supervisor.

From its first rank's start on (a launcher starting is not idle), every node samples its own GPUs with the forensics
GPU reader (:func:`mlenv.runtime.node.gpus.read_gpus`, in a thread of its own so that a slow ``nvidia-smi`` never holds
up the job's output), only those of ``CUDA_VISIBLE_DEVICES`` when it is set. A node is idle once every one of its
GPUs has stayed under P percent for S seconds; it tells node 0 (the hub), and again when one of them is busy again.
When every node is idle, node 0 flags the job: every node says so in its output (``mlenv: node-N (HOST) idle: ...``)
and records ``"idle": {...}`` in its state.json; the run's state stays what it was. A node that becomes busy again
clears the flag everywhere. With ``--on-idle stop`` node 0 then stops the job with :data:`IDLE_EXIT_CODE`, which is
never restarted (an idle job would idle again).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from ..node.gpus import Gpu, read_gpus
from ..records.jsonvalue import JsonObject, int_of, number_of
from ..records.restartpolicy import IDLE_EXIT_CODE
from .protocol import BaseObserver, RankInfo

DEFAULT_IDLE_UTIL = 5.0
"""Percent: a GPU under this is idle (``launch.idle_util``)."""
MAX_SAMPLE_SECONDS = 10.0
"""The longest time between two samples of a node's GPUs."""
KIND = "idle"


@dataclass(frozen=True)
class Sample:
    """One reading of a node's GPUs: ``(index, utilization percent or None)`` each, or why there is none."""

    at: float
    """``time.monotonic()`` when it was taken."""
    gpus: tuple[tuple[int, float | None], ...] = ()
    error: str | None = None


def sample_interval(window: float) -> float:
    """Seconds between samples: six in a window, one a second at most, one every 10 s at least."""
    return min(MAX_SAMPLE_SECONDS, max(1.0, window / 6))


def visible(gpus: Sequence[Gpu], environ: Mapping[str, str]) -> list[Gpu]:
    """The GPUs of the run: those ``CUDA_VISIBLE_DEVICES`` names (by index or UUID), every one without it."""
    names = [name.strip() for name in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if name.strip()]
    if not names:
        return list(gpus)
    return [gpu for gpu in gpus if str(gpu.index) in names or any(gpu.uuid.startswith(n) for n in names)]


class Sampler:
    """A thread that reads this node's GPUs every ``interval`` seconds; :meth:`drain` hands over what it read."""

    def __init__(self, interval: float, environ: Mapping[str, str],
                 read: Callable[[], list[Gpu]] = read_gpus) -> None:
        self.interval = interval
        self.environ = environ
        self.read = read
        self.samples: queue.SimpleQueue[Sample] = queue.SimpleQueue()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="mlenv-idle-gpus", daemon=True)

    def start(self) -> None:
        """Start sampling, unless it already started (or was closed)."""
        if self.thread.ident is None and not self.done.is_set():
            self.thread.start()

    def close(self) -> None:
        self.done.set()

    def drain(self) -> list[Sample]:
        found = []
        while not self.samples.empty():
            found.append(self.samples.get_nowait())
        return found

    def _run(self) -> None:
        while True:
            self.samples.put(self._sample())
            if self.done.wait(self.interval):
                return

    def _sample(self) -> Sample:
        try:
            gpus = visible(self.read(), self.environ)
        except (OSError, ValueError) as err:
            return Sample(time.monotonic(), error=str(err))
        if not gpus:
            return Sample(time.monotonic(), error="no GPU of the run listed by nvidia-smi")
        return Sample(time.monotonic(), tuple((gpu.index, gpu.utilization) for gpu in gpus))


class Idleness:
    """One node's judgement: idle once every GPU stayed under ``threshold`` percent for ``window`` seconds of
    samples. A sample without figures (nvidia-smi failed, a GPU's utilization N/A) proves nothing: not idle."""

    def __init__(self, threshold: float, window: float) -> None:
        self.threshold = threshold
        self.window = window
        self.since: float | None = None
        self.idle = False
        self.last: Sample | None = None

    def add(self, sample: Sample) -> bool:
        """Take ``sample`` (in order); whether the node went from busy to idle or back."""
        under = sample.error is None and all(util is not None and util < self.threshold
                                             for _, util in sample.gpus)
        if under:
            self.since = sample.at if self.since is None else self.since
            self.last = sample
        else:
            self.since = None
        idle = self.since is not None and sample.at - self.since >= self.window
        changed, self.idle = idle != self.idle, idle
        return changed

    def report(self, host: str, node: int) -> IdleReport:
        """This node's idle GPUs, for the hub, the note and state.json."""
        first, last = self.since, self.last
        if first is None or last is None:
            raise ValueError("the node's GPUs are not under the threshold")
        since = datetime.fromtimestamp(time.time() - (time.monotonic() - first), timezone.utc)
        return IdleReport(node, host, self.threshold, since.isoformat(timespec="seconds"), round(last.at - first, 1),
                          tuple((index, util) for index, util in last.gpus if util is not None))


@dataclass(frozen=True)
class IdleReport:
    """A node whose GPUs are idle: every one under ``threshold`` percent since ``since`` (ISO 8601) for ``seconds``,
    each GPU's ``(index, utilization percent)`` at the last sample."""

    node: int
    host: str
    threshold: float
    since: str
    seconds: float
    gpus: tuple[tuple[int, float], ...]

    def to_json(self) -> JsonObject:
        """``{"node", "host", "threshold", "since", "seconds", "gpus": [{"index", "utilization"}]}`` (the hub's
        message, state.json's ``idle``)."""
        return {"node": self.node, "host": self.host, "threshold": self.threshold, "since": self.since,
                "seconds": self.seconds, "gpus": [{"index": index, "utilization": util} for index, util in self.gpus]}

    @classmethod
    def parse(cls, data: object) -> IdleReport | None:
        """The report :meth:`to_json` wrote; None for anything else."""
        if not isinstance(data, dict) or not isinstance(gpus := data.get("gpus"), list):
            return None
        try:
            return cls(int_of(data["node"], "node"), str(data["host"]), number_of(data["threshold"], "threshold"),
                       str(data["since"]), number_of(data["seconds"], "seconds"),
                       tuple((int_of(gpu["index"], "index"), number_of(gpu["utilization"], "utilization"))
                             for gpu in gpus if isinstance(gpu, dict)))
        except (KeyError, TypeError):
            return None


def describe(report: IdleReport) -> str:
    """``node-1 (gpu-b) idle: every GPU under 5% for 31 s (GPU 0 0%, GPU 1 2%)``."""
    gpus = ", ".join(f"GPU {index} {util:g}%" for index, util in report.gpus)
    return (f"node-{report.node} ({report.host}) idle: every GPU under {report.threshold:g}% for "
            f"{report.seconds:.0f} s ({gpus})")


class IdleWatch(BaseObserver):
    """Every GPU of the job under ``threshold`` percent for ``window`` seconds: flag the job idle (and, with
    ``on_idle`` ``stop``, stop it with :data:`IDLE_EXIT_CODE`)."""

    def __init__(self, threshold: float, window: float, on_idle: str | None, sampler: Sampler, host: str) -> None:
        self.on_idle = on_idle
        self.host = host
        self.idleness = Idleness(threshold, window)
        self.sampler = sampler
        self.unreadable: str | None = None  # the last reading error told, so that each is told once
        self.flagged = False
        self.idle_nodes: dict[int, IdleReport] = {}  # the hub's: node -> its report

    def rank_started(self, rank: RankInfo) -> None:
        self.sampler.start()

    def tick(self, now: float) -> None:
        for sample in self.sampler.drain():
            self.take(sample)

    def take(self, sample: Sample) -> None:
        """One sample of this node's GPUs: tell the hub when the node became idle or busy."""
        if self.control is None:
            return
        if sample.error is not None and sample.error != self.unreadable:
            self.note(f"idle GPUs not judged on node-{self.control.node}: {sample.error}")
        self.unreadable = sample.error
        if not self.idleness.add(sample):
            return
        node = self.control.node
        if self.idleness.idle:
            self.control.tell_hub({"kind": KIND, "event": "idle",
                                   "report": self.idleness.report(self.host, node).to_json()})
        else:
            self.control.tell_hub({"kind": KIND, "event": "busy", "node": node})

    def message(self, message: Mapping[str, Any]) -> None:
        if message.get("kind") != KIND or self.control is None:
            return
        event = message.get("event")
        if event == "idle" and self.control.hub and (report := IdleReport.parse(message.get("report"))) is not None:
            self.idle_nodes[report.node] = report
            self._judge()
        elif event == "busy" and self.control.hub:
            self.idle_nodes.pop(int(message["node"]), None)
            if self.flagged:
                self.control.tell_all({"kind": KIND, "event": "resumed", "node": message["node"]})
        elif event == "flagged":
            self.flagged = True
            report = message["nodes"].get(str(self.control.node))
            if (mine := IdleReport.parse(report)) is not None:
                self.note(describe(mine) + "; every GPU of the job is idle")
            self.control.record(idle=report)
        elif event == "resumed" and self.flagged:
            self.flagged = False
            if int(message["node"]) == self.control.node:
                self.note(f"node-{self.control.node}'s GPUs are busy again: the job is no longer idle")
            self.control.record(idle=None)

    def _judge(self) -> None:
        """The hub: every node idle flags the job, and with --on-idle stop ends it."""
        if self.control is None or self.flagged or len(self.idle_nodes) < self.control.num_nodes:
            return
        self.control.tell_all({"kind": KIND, "event": "flagged",
                               "nodes": {str(node): report.to_json() for node, report in self.idle_nodes.items()}})
        if self.on_idle == "stop":
            seconds = min(report.seconds for report in self.idle_nodes.values())
            threshold = self.idleness.threshold
            self.control.stop(f"idle: every GPU of the job under {threshold:g}% for {seconds:.0f} s "
                              f"(--on-idle stop)", IDLE_EXIT_CODE)

    def finished(self, exit_code: int) -> int:
        self.sampler.close()
        if self.flagged and exit_code != IDLE_EXIT_CODE and self.control is not None:
            self.control.record(idle=None)  # the job ended; only an idle stop keeps why
        return exit_code
