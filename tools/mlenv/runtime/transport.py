"""What a launch expects NCCL to prove about its transport, and how the job's own output proves it.

:class:`TransportProof` watches the ranks' lines while the job runs (an observer of the node's supervisor).
The expectation is ``--expect-transport`` (from ``mlenv launch``, ``EXPECT_TRANSPORT=`` or the cluster file's
``network.expect_transport``), else ``rdma`` in rdma mode and ``any`` otherwise. An explicit expectation that
nothing proves fails the job; the rdma-mode default only warns, saying why nothing was proven.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .ncclog import UNKNOWN, LogReport, NcclLogReader, NodeReport, contradicts, judge
from .observers import BaseObserver, RankInfo
from .runlayout import RUNNING

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


def final_verdict(report: LogReport, expected: Expectation, environ: Mapping[str, str],
                  status: int) -> tuple[int, list[str]]:
    """The node's exit status once the job ended and the lines that say why: a contradiction fails a successful
    job, and so does nothing proven under an explicit expectation; the default only warns."""
    if not expected.judged:
        return status, [f"NCCL transport: {report.verdict}"] if report.ranks else []
    if report.verdict == UNKNOWN:
        reason = why_unproven(environ, report)
        if expected.explicit:
            return status or 1, [f"error: could not prove {expected.expect}: {reason}"]
        return status, [f"warning: could not prove {expected.expect}: {reason}"]
    passed, message = judge(report, expected.expect)
    if not passed:
        return status or 1, [f"error: {message}"]
    return status, [message]


class TransportProof(BaseObserver):
    """The live proof: reads the ranks' NCCL lines while the job runs, prints this node's verdict as soon as NCCL
    names its network or connects its channels (and again when the channels add GDR detail), records it in
    state.json, stops the whole job on a contradiction and judges what was proven once the job ends."""

    def __init__(self, expected: Expectation, environ: Mapping[str, str]) -> None:
        self.expected = expected
        self.environ = environ
        nodes = environ.get("MLENV_NUM_NODES", "")
        self.reader = NcclLogReader(nodes=int(nodes) if nodes.isdigit() else None)
        self.lines: dict[int | None, int] = {}
        self.changed = False
        self.shown: tuple[object, ...] | None = None
        self.stopped = False

    def line(self, rank: RankInfo | None, text: str) -> None:
        if "NCCL" not in text or self.stopped:
            return
        who = rank.rank if rank else None
        self.lines[who] = self.lines.get(who, 0) + 1
        where = f"rank{who}:{self.lines[who]}" if rank else f"launcher:{self.lines[who]}"
        node = f"node-{rank.node}" if rank else None
        self.changed |= self.reader.feed(text, where, node=node, rank=who)

    def tick(self, now: float) -> None:
        if self.changed and not self.stopped:
            self.changed = False
            self._decide()

    def finished(self, exit_code: int) -> int:
        if self.stopped:
            return exit_code
        report = self._decide()
        if self.stopped:
            return exit_code or 1
        status, lines = final_verdict(report, self.expected, self.environ, exit_code)
        for line in lines:
            self.note(line)
        return status

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
                self.control.set_state(RUNNING, transport=transport_record(node))
        if self.expected.judged and contradicts(node.verdict, self.expected.expect):
            self.stopped = True
            reason = (f"NCCL uses {node.verdict} but --expect-transport is {self.expected.expect}: {node.reason} "
                      f"(evidence: {', '.join(node.evidence)})")
            self.note(f"error: {reason}; stopping the job on every node")
            if self.control is not None:
                self.control.stop(reason, 1)
        return report


def transport_record(node: NodeReport) -> dict[str, object]:
    """What state.json keeps of a node's verdict (``latest_run.transport`` of ``mlenv status --json``)."""
    return {"verdict": node.verdict, "plugin": node.plugin, "devices": node.devices,
            "nccl_version": node.nccl_version}
