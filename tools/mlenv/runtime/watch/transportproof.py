"""What a launch expects NCCL to prove about its transport, and how the job's own output proves it.

:class:`TransportProof` watches the ranks' lines while the job runs (an observer of the node's supervisor).
The expectation is ``--expect-transport`` (from ``mlenv launch``, ``EXPECT_TRANSPORT=`` or the cluster file's
``network.expect_transport``), else ``rdma`` in rdma mode and ``any`` otherwise. An explicit expectation that
nothing proves fails the job; the rdma-mode default only warns, saying why nothing was proven.

Only NCCL's own records are evidence: a line in NCCL's exact shape (``host:pid:tid [dev] NCCL INFO ...``,
ncclines.nccl_record) whose pid is the process of the rank that wrote it or one of its descendants (read from
``/proc/<pid>/stat``), so that a rank printing an old log echoes nothing into the proof (NCCL run in a pid
namespace of its own, a container the rank starts, is not seen: the end says which pids were not believed; a
rank that prints a line with its own pid is believed). Each node tells the hub
(node 0) its verdict; the hub makes the run's one verdict from them, stops the job when it contradicts the
expectation and tells every node, which then judge that same verdict at the end.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..fabric.ncclines import nccl_record
from ..fabric.ncclog import UNKNOWN, LogReport, NcclLogReader, NodeTransportReport, combine, contradicts, judge_verdict
from ..node.readfs import read_text
from ..records.states import RunState
from .protocol import BaseObserver, RankInfo

KIND = "transport"
"""The ``kind`` of the proof's messages between nodes: ``node`` (a node's verdict, to the hub), ``run`` (the run's,
from the hub to every node)."""
_MAX_WAITING = 256  # lines of a rank kept until its pid is known
_MAX_DEPTH = 64  # parents walked up from a record's pid to a rank's
_MAX_PIDS = 4096  # (rank, pid) answers kept

DEBUG_SUBSYS = "INIT,NET"
"""The NCCL_DEBUG_SUBSYS that prints what the proof reads: the network NCCL picks and the channels it sets up."""


@dataclass(frozen=True)
class Expectation:
    """``expect``: rdma, sockets or any; ``explicit``: the user asked for it (not the mode's default)."""

    expect: str
    explicit: bool

    @property
    def judged(self) -> bool:
        return self.expect != "any"


def expectation(option: str | None, environ: Mapping[str, str]) -> Expectation:
    """The user's ``--expect-transport``, else the default for ``MLENV_NETWORK_MODE``."""
    if option:
        return Expectation(option, True)
    return Expectation("rdma" if environ.get("MLENV_NETWORK_MODE") == "rdma" else "any", False)


def debug_env(expected: Expectation, environ: Mapping[str, str]) -> dict[str, str]:
    """NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=INIT,NET when a transport is to be proven, unless the user set
    their own NCCL_DEBUG."""
    if not expected.judged or "NCCL_DEBUG" in environ:
        return {}
    return {"NCCL_DEBUG": "INFO", **({} if "NCCL_DEBUG_SUBSYS" in environ else {"NCCL_DEBUG_SUBSYS": DEBUG_SUBSYS})}


def why_unproven(environ: Mapping[str, str], report: LogReport) -> str:
    """Why the output proves nothing: the NCCL_DEBUG settings that hide the lines, else what the lines lacked."""
    debug_file = environ.get("NCCL_DEBUG_FILE")
    if debug_file:
        return f"NCCL_DEBUG_FILE={debug_file} sends NCCL's lines to a file, not to the output"
    level = environ.get("NCCL_DEBUG", "").strip().upper()
    if level and level not in ("INFO", "TRACE"):
        return f"NCCL_DEBUG={environ['NCCL_DEBUG']} hides the INFO lines that name the transport"
    subsys = environ.get("NCCL_DEBUG_SUBSYS", "").upper()
    if subsys and not {"INIT", "NET", "ALL"} & set(subsys.replace("^", "").split(",")):
        return f"NCCL_DEBUG_SUBSYS={environ['NCCL_DEBUG_SUBSYS']} leaves out INIT and NET"
    if not report.ranks:
        return "no NCCL lines in the output: the job may not use NCCL"
    return report.reason


def final_verdict(verdict: str, reason: str, expected: Expectation, status: int, seen: bool) -> tuple[int, list[str]]:
    """The node's exit status once the job ended and the lines that say why, for the run's ``verdict`` and
    ``reason`` (``seen``: whether any NCCL record was read): a contradiction fails a successful job, and so does
    nothing proven under an explicit expectation; the default only warns."""
    if not expected.judged:
        return status, [f"NCCL transport: {verdict}"] if seen else []
    if verdict == UNKNOWN:
        if expected.explicit:
            return status or 1, [f"error: could not prove {expected.expect}: {reason}"]
        return status, [f"warning: could not prove {expected.expect}: {reason}"]
    passed, message = judge_verdict(verdict, reason, expected.expect)
    if not passed:
        return status or 1, [f"error: {message}"]
    return status, [message]


class TransportProof(BaseObserver):
    """The live proof: reads the ranks' NCCL records while the job runs, prints this node's verdict as soon as NCCL
    names its network or connects its channels (and again when the channels add GDR detail), records it in
    state.json and tells the hub; the hub stops the whole job when the run's verdict contradicts the expectation.
    Every node judges the run's verdict once the job ends. ``proc_root``: where the ranks' processes are read."""

    def __init__(self, expected: Expectation, environ: Mapping[str, str], proc_root: str | Path = "/proc") -> None:
        self.expected = expected
        self.environ = environ
        self.proc_root = Path(proc_root)
        nodes = environ.get("MLENV_NUM_NODES", "")
        self.reader = NcclLogReader(nodes=int(nodes) if nodes.isdigit() else None)
        self.lines: dict[int | None, int] = {}
        self.changed = False
        self.shown: tuple[object, ...] | None = None
        self.stopped = False
        self.pids: dict[int, set[int]] = {}  # rank -> the pids its process had (one per start)
        self.owned: dict[tuple[int | None, int], bool] = {}  # (rank, pid) -> whether pid is that rank's
        self.waiting: dict[int, list[str]] = {}  # a rank's lines that came before its pid
        self.foreign: list[str] = []  # NCCL-shaped records of no process of the job (a few, for the reason)
        self.node_verdicts: dict[str, tuple[str, str, list[str]]] = {}  # the hub's: node -> verdict, reason, evidence
        self.run: tuple[str, str, str] | None = None  # the run's (node, verdict, reason), as the hub said

    def rank_started(self, rank: RankInfo) -> None:
        self.pids.setdefault(rank.rank, set()).add(rank.pid)
        for text in self.waiting.pop(rank.rank, []):
            self.line(rank, text)

    def line(self, rank: RankInfo | None, text: str) -> None:
        if "NCCL" not in text or self.stopped or (record := nccl_record(text)) is None:
            return
        if rank is not None and not rank.pid and rank.rank not in self.pids:  # its pid is not known yet
            waiting = self.waiting.setdefault(rank.rank, [])
            if len(waiting) < _MAX_WAITING:
                waiting.append(text)
            return
        if record.pid is not None and not self._of_job(rank, int(record.pid)):
            if len(self.foreign) < 3 and f"{record.host}:{record.pid}" not in self.foreign:
                self.foreign.append(f"{record.host}:{record.pid}")
            return
        who = rank.rank if rank else None
        self.lines[who] = self.lines.get(who, 0) + 1
        where = f"rank{who}:{self.lines[who]}" if rank else f"launcher:{self.lines[who]}"
        node = f"node-{rank.node}" if rank else None
        self.changed |= self.reader.add(record, where, node=node, rank=who)

    def _of_job(self, rank: RankInfo | None, pid: int) -> bool:
        """Whether ``pid`` is the process of ``rank`` (any rank's for the launcher's lines) or a descendant."""
        key = (rank.rank if rank else None, pid)
        if key in self.owned:
            return self.owned[key]
        roots = self.pids.get(rank.rank, set()) | {rank.pid} if rank else set().union(*self.pids.values())
        found = any(ancestor in roots for ancestor in _ancestry(pid, self.proc_root))
        if len(self.owned) < _MAX_PIDS:
            self.owned[key] = found
        return found

    def tick(self, now: float) -> None:
        self._flush()

    def _flush(self) -> None:
        """Decide on the records read since the last time."""
        if self.changed and not self.stopped:
            self.changed = False
            self._decide()

    def message(self, message: Mapping[str, Any]) -> None:
        if message.get("kind") != KIND or self.control is None:
            return
        self._flush()  # this node's own verdict first: said, and known to the hub, before any stop ends its lines
        if message.get("event") == "node" and self.control.hub:
            self.node_verdicts[str(message["node"])] = (str(message["verdict"]), str(message["reason"]),
                                                        [str(e) for e in message.get("evidence", [])])
            node, verdict, reason = combine((n, found[0], found[1]) for n, found in self.node_verdicts.items())
            if self.run != (node, verdict, reason):
                self.control.tell_all({"kind": KIND, "event": "run", "node": node, "verdict": verdict,
                                       "reason": reason})
        elif message.get("event") == "run":
            self.run = (str(message["node"]), str(message["verdict"]), str(message["reason"]))
            self._stop_on_contradiction()

    def _stop_on_contradiction(self) -> None:
        if self.run is None or self.stopped or not self.expected.judged:
            return
        node, verdict, reason = self.run
        if not contradicts(verdict, self.expected.expect):
            return
        self.stopped = True
        if self.control is not None and self.control.hub:
            evidence = ", ".join(self.node_verdicts.get(node, ("", "", []))[2])
            why = (f"NCCL uses {verdict} but --expect-transport is {self.expected.expect}: {reason} "
                   f"(evidence: {evidence})")
            self.note(f"error: {why}; stopping the job on every node")
            self.control.stop(why, 1)

    def finished(self, exit_code: int) -> int:
        if self.stopped:
            return exit_code
        report = self._decide()
        if self.stopped:
            return exit_code or 1
        own = {n.node: (n.verdict, n.reason) for n in report.nodes if n.verdict != UNKNOWN}
        if self.run is not None:
            own.setdefault(self.run[0], self.run[1:])
        _, verdict, reason = (combine((n, *found) for n, found in own.items()) if own
                              else ("", UNKNOWN, self._unproven(report)))
        status, lines = final_verdict(verdict, reason, self.expected, exit_code, bool(own or report.ranks))
        for line in lines:
            self.note(line)
        return status

    def _unproven(self, report: LogReport) -> str:
        """Why nothing was proven: NCCL's settings, else what the records lacked, and what was not believed."""
        reason = why_unproven(self.environ, report)
        if self.foreign:
            reason += f"; lines in NCCL's shape from {', '.join(self.foreign)} (no process of this job) are no evidence"
        return reason

    def _decide(self) -> LogReport:
        report = self.reader.report()
        node = report.nodes[0] if report.nodes else None
        if node is None or node.verdict == UNKNOWN:
            return report
        shown = (node.verdict, tuple(node.devices), node.plugin, node.nccl_version)
        if shown != self.shown:
            self.shown = shown
            self.note(node.line())
            if self.control is not None:
                self.control.set_state(RunState.RUNNING, transport=transport_record(node))
                self.control.tell_hub({"kind": KIND, "event": "node", "node": node.node, "verdict": node.verdict,
                                       "reason": node.reason, "evidence": [*node.evidence]})
        return report


def _ancestry(pid: int, proc_root: Path) -> list[int]:
    """``pid`` and its parents, nearest first (``/proc/<pid>/stat``), as far as they are known."""
    found = [pid]
    while len(found) < _MAX_DEPTH and (stat := read_text(proc_root / str(found[-1]) / "stat")):
        parent = int(stat.rpartition(")")[2].split()[1])
        if parent <= 1 or parent in found:
            break
        found.append(parent)
    return found


def transport_record(node: NodeTransportReport) -> dict[str, object]:
    """What state.json keeps of a node's verdict (``latest_run.transport`` of ``mlenv status --json``)."""
    return {"verdict": node.verdict, "plugin": node.plugin, "devices": node.devices,
            "nccl_version": node.nccl_version}
