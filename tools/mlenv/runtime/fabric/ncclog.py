"""Which transport NCCL really used, from its ``NCCL_DEBUG=INFO`` records (ncclines.py reads them): per process,
per node and for the whole job.

Records are grouped by process (``host:pid``, else the launcher's tag) and by node (mlenv's tag, else the host).
A verdict comes from what NCCL did, strongest first: the channels it connected (``Channel 02/1 : 3[3] -> 11[3]
[send] via NET/IB/0/GDRDMA``: across nodes; ``via P2P/IPC``, ``via SHM/direct/direct``: inside one), then the
network it named (``Using network IB``; 2.3's ``Using internal Network Socket``), the devices a network set up
(``NET/IB : Using [0]mlx5_0:1/IB``) and last a network's own errors (``NET/IB : Got completion from peer ...
with error``: it was used, and failed). What NCCL merely set up proves nothing where its channels show that no
network was crossed. GPUDirect RDMA is known from the channels (``/GDRDMA``), ``GDR 0|1`` or the HCAs' lines;
without them it is "not shown", never "no". Bootstrap and sideband sockets (``Bootstrap : Using eth0``, 2.4's
``NET/Socket : Using`` before the IB one, 2.3's ``for sideband communication``) never decide it.

:meth:`NcclLogReader.feed` reads a log after the run (``nccl-log-check``, ``mlenv nccl-test``), whose processes
are gone: it cannot know their pids, so it reads records as logs are written and pasted. The live proof
(transportproof.py) hands :meth:`NcclLogReader.add` only records in NCCL's own shape from the job's own processes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from .ncclines import MAX_KEPT, MAX_LINE, Evidence, NcclRecord, is_socket_network, net_name, records
from .ncclines import iter_lines as iter_lines  # the public reading of a log file, as callers know it

RDMA_GDR = "RDMA+GDR"
RDMA = "RDMA (no GDR)"
RDMA_UNSHOWN = "RDMA (GDR not shown)"  # an RDMA network, and no line says whether GPUDirect RDMA is used
SOCKETS = "SOCKETS"
INTRA_NODE = "INTRA-NODE"
MNNVL = "MNNVL"  # multi-node NVLink: a network transport, not INTRA-NODE
UNKNOWN = "UNKNOWN"
VERDICTS = (RDMA_GDR, RDMA, RDMA_UNSHOWN, MNNVL, SOCKETS, INTRA_NODE, UNKNOWN)
EXPECTATIONS = ("rdma", "sockets", "any")
PROOF = {"rdma": {RDMA_GDR, RDMA, RDMA_UNSHOWN, MNNVL, INTRA_NODE}, "sockets": {SOCKETS, INTRA_NODE}}
"""The verdicts each expectation accepts (INTRA-NODE: no network was used, so nothing contradicts)."""
CONTRADICTS = {"rdma": {SOCKETS}, "sockets": {RDMA_GDR, RDMA, RDMA_UNSHOWN, MNNVL}}
"""The verdicts that prove the opposite of the expectation (stop a running job on them)."""
ORDER = (SOCKETS, RDMA, RDMA_UNSHOWN, RDMA_GDR, MNNVL, INTRA_NODE, UNKNOWN)
"""Worst first: one node on sockets makes the whole job SOCKETS; a node that proves nothing changes nothing."""

_MAX_PROCESSES = 4096  # records of further processes are not read
_MAX_LOCAL_GPUS = 16  # no node holds more GPUs: a higher rank number means ranks on several nodes


@dataclass(frozen=True)
class Decision:
    verdict: str
    reason: str


def decide(ev: Evidence, multi_node: bool | None) -> Decision:
    """The verdict for one process's or one node's evidence; ``multi_node``: whether its communicators span
    nodes (None: not known)."""
    network = ev.network()
    plugin = f"NET/{network}" if network else None
    provider = f" (libfabric provider {ev.provider})" if ev.provider else ""
    if ev.net_channels():
        names = sorted({str(net_name(via)) for via in ev.channels if net_name(via)})
        over = ", ".join(f"NET/{n}" for n in names)
        if any(is_socket_network(name, ev.provider) for name in names):
            return Decision(SOCKETS, f"channels cross nodes over {over}{provider}")
        return _rdma(ev.gdr(), f"{ev.net_channels()} channels cross nodes over {over}",
                     ", not all with GPUDirect RDMA")
    if ev.mnnvl and multi_node:
        return Decision(MNNVL, "ranks on several nodes share one NVLink domain (MNNVL) and no channel uses NET/")
    if multi_node is False:
        return Decision(INTRA_NODE, f"one node: NCCL set up {plugin} but no channel crossed it" if network
                        else "one node ran every rank: no network to cross")
    if network:
        failed = not (ev.named or ev.inits or ev.ib_missing)  # known only from the network's own errors
        warning = next((w for w in ev.warnings if w.startswith(f"NET/{network}")), "its WARN lines")
        how = f"NCCL used {plugin} and it failed: {warning}" if failed else f"NCCL chose {plugin}"
        if is_socket_network(network, ev.provider):
            return Decision(SOCKETS, how + provider)
        return _rdma(ev.gdr(), how, ", without GPUDirect RDMA")
    local = sorted({via.split("/")[0] for via in ev.channels if not net_name(via)})
    if local and multi_node is not True:
        return Decision(INTRA_NODE, f"one node: channels via {', '.join(local)}")
    if ev.single_node_comm and multi_node is not True:
        return Decision(INTRA_NODE, "one node: every communicator has nNodes 1")
    if local:
        return Decision(UNKNOWN, "only intra-node channels here, and no network named")
    return Decision(UNKNOWN, "NCCL named no network and set up no channel (NCCL_DEBUG=INFO with "
                             "NCCL_DEBUG_SUBSYS including INIT,NET shows them)")


def _rdma(gdr: bool | None, how: str, without: str) -> Decision:
    if gdr:
        return Decision(RDMA_GDR, how)
    if gdr is None:
        return Decision(RDMA_UNSHOWN, f"{how}; no channel line shows GPUDirect RDMA")
    return Decision(RDMA, how + without)


@dataclass
class RankReport:
    """What one process's NCCL lines say."""

    process: str  # host:pid, else the launcher's tag
    node: str
    evidence_: Evidence = field(default_factory=Evidence)
    decision: Decision = Decision(UNKNOWN, "no NCCL lines")

    @property
    def rank(self) -> int | None:
        return self.evidence_.rank

    @property
    def network(self) -> str | None:
        return self.evidence_.network()

    @property
    def devices(self) -> list[str]:
        return self.evidence_.devices()

    @property
    def warnings(self) -> list[str]:
        return self.evidence_.warnings

    @property
    def verdict(self) -> str:
        return self.decision.verdict

    def to_dict(self) -> dict[str, object]:
        ev = self.evidence_
        network = ev.network()
        return {
            "process": self.process,
            "node": self.node,
            "rank": ev.rank,
            "nranks": ev.nranks,
            "nccl_version": ev.nccl_version,
            "network": network,
            "plugin": f"NET/{network}" if network else None,
            "devices": ev.devices(),
            "gdr": None if self.verdict == RDMA_UNSHOWN else self.verdict == RDMA_GDR,
            "net_channels": ev.net_channels(),
            "p2p": any(via.startswith("P2P") for via in ev.channels),
            "shm": any(via.startswith("SHM") for via in ev.channels),
            "transports": dict(ev.channels),
            "warnings": ev.warnings,
            "verdict": self.verdict,
            "reason": self.decision.reason,
            "evidence": ev.evidence,
        }

    def summary(self) -> str:
        """One human line."""
        ev = self.evidence_
        rank = "?" if ev.rank is None else str(ev.rank)
        parts = [f"rank {rank} ({self.process}): {self.verdict}"]
        network = ev.network()
        if network:
            parts.append(f"network {network} [{', '.join(ev.devices())}]")
        net = {via: n for via, n in ev.channels.items() if net_name(via)}
        if net:
            gdr = sum(n for via, n in net.items() if "GDRDMA" in via)
            parts.append(f"{sum(net.values())} net channels ({gdr} GDRDMA)")
        local = sorted({via.split("/")[0] for via in ev.channels if not net_name(via)})
        if local:
            parts.append(f"intra-node {', '.join(local)}")
        if ev.nccl_version:
            parts.append(f"NCCL {ev.nccl_version}")
        return "; ".join(parts)


@dataclass(frozen=True)
class NodeTransportReport:
    """One node's verdict, from all its processes."""

    node: str
    verdict: str
    reason: str
    network: str | None
    plugin: str | None
    devices: list[str]
    nccl_version: str | None
    provider: str | None
    evidence: list[str]

    def to_dict(self) -> dict[str, object]:
        return {"verdict": self.verdict, "reason": self.reason, "plugin": self.plugin, "devices": self.devices,
                "nccl_version": self.nccl_version, "evidence": self.evidence}

    def line(self) -> str:
        """``node-1: RDMA+GDR via mlx5_0..3 (NET/IB, NCCL 2.21.5)``."""
        via = f" via {compact_devices(self.devices)}" if self.devices and self.verdict != INTRA_NODE else ""
        details = [d for d in (self.plugin if self.verdict != INTRA_NODE else None,
                               f"libfabric {self.provider}" if self.provider else None,
                               f"NCCL {short_version(self.nccl_version)}" if self.nccl_version else None) if d]
        suffix = f" ({', '.join(details)})" if details else ""
        why = f": {self.reason}" if self.verdict in (UNKNOWN, INTRA_NODE, SOCKETS) else ""
        return f"{self.node}: {self.verdict}{via}{suffix}{why}"


@dataclass
class LogReport:
    """All ranks and nodes found in the logs and the overall verdict."""

    ranks: list[RankReport]
    nodes: list[NodeTransportReport]
    verdict: str
    reason: str
    nccl_version: str | None = None

    def node(self, name: str) -> NodeTransportReport | None:
        return next((n for n in self.nodes if n.node == name), None)

    def to_dict(self) -> dict[str, object]:
        """The JSON shape of ``nccl-log-check --json``."""
        deciding = [n for n in self.nodes if n.verdict == self.verdict] or self.nodes
        devices = [d for n in deciding for d in n.devices]
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "plugin": next((n.plugin for n in deciding if n.plugin), None),
            "devices": list(dict.fromkeys(devices)),
            "nccl_version": self.nccl_version,
            "evidence": [e for n in deciding for e in n.evidence][:MAX_KEPT],
            "nodes": {n.node: n.to_dict() for n in self.nodes},
            "ranks": [r.to_dict() for r in self.ranks],
        }


class NcclLogReader:
    """Takes NCCL's records one at a time (from files, or live from a running job) and reports at any moment."""

    def __init__(self, nodes: int | None = None) -> None:
        """``nodes``: how many nodes the job has, when the caller knows (1: a verdict can only be INTRA-NODE)."""
        self._nodes = nodes
        self._processes: dict[str, RankReport] = {}
        self._version: str | None = None
        self.lines = 0

    def feed(self, text: str, where: str = "", *, node: str | None = None, rank: int | None = None) -> bool:
        """Read one line of a log as people paste them (ncclines.records); ``node``/``rank``: who wrote it, when
        the caller knows. True when it said something about the transport (worth a new report)."""
        self.lines += 1
        found = False
        for record in records(text[:MAX_LINE]):
            found |= self.add(record, where, node=node, rank=rank)
        return found

    def add(self, record: NcclRecord, where: str = "", *, node: str | None = None, rank: int | None = None) -> bool:
        """Take one record; True when it bears on the transport."""
        node, rank = (node, rank) if node is not None else (record.node, record.rank if rank is None else rank)
        self._version = self._version or record.version
        if record.level == "VERSION":
            return True
        key = _key(record, node, rank)
        report = self._processes.get(key)
        if report is None:
            if len(self._processes) >= _MAX_PROCESSES:
                return False
            report = self._processes[key] = RankReport(key, node or record.host or "?")
        if rank is not None and report.evidence_.rank is None:
            report.evidence_.rank = rank
        return report.evidence_.read(record, where)

    def report(self) -> LogReport:
        """Verdicts per rank, per node and overall from what was read so far."""
        processes = list(self._processes.values())
        nodes: dict[str, Evidence] = {}
        for process in processes:
            process.evidence_.nccl_version = process.evidence_.nccl_version or self._version
            nodes.setdefault(process.node, Evidence()).merge(process.evidence_)
        multi = self._multi_node(nodes)
        for process in processes:
            process.decision = decide(process.evidence_, _multi_for(process.evidence_, multi, nodes[process.node]))
        node_reports = [_node_report(name, ev, _node_decision(ev, multi, [p for p in processes if p.node == name]))
                        for name, ev in sorted(nodes.items(), key=lambda item: _natural(item[0]))]
        _, verdict, reason = combine((n.node, n.verdict, n.reason) for n in node_reports)
        if not processes:
            reason = "no NCCL lines" + (" (NCCL_DEBUG unset, or set to WARN?)" if self.lines else ": empty input")
        ordered = sorted(processes, key=lambda r: (r.rank is None, r.rank or 0, _natural(r.process)))
        return LogReport(ordered, node_reports, verdict, reason, self._version)

    def _multi_node(self, nodes: dict[str, Evidence]) -> bool | None:
        if self._nodes is not None:
            return self._nodes > 1
        named = [name for name in nodes if name != "?"]
        if len(named) > 1 or any(ev.net_channels() or (ev.nnodes or 0) > 1 for ev in nodes.values()):
            return True
        if len(named) == 1 and "?" not in nodes:  # one host: single-node when its communicators say one node ...
            if nodes[named[0]].single_node_comm and nodes[named[0]].nnodes == 1:
                return False
            processes = [p.evidence_ for p in self._processes.values()]  # ... or it ran every rank of the job
            ranks = max((ev.nranks or 0 for ev in processes), default=0)
            running = {ev.rank for ev in processes if ev.rank is not None}
            running.update(r for ev in processes if ev.nranks == ranks for r in ev.comm_ranks)
            if ranks and (len(processes) >= ranks or len(running) >= ranks):
                return False
        return None


def _key(record: NcclRecord, node: str | None, rank: int | None) -> str:
    """The process a record belongs to: host:pid, else who the caller or the launcher's tag says wrote it."""
    if record.host and record.pid:
        return f"{record.host}:{record.pid}"
    if node is not None and rank is not None:
        return f"{node} r{rank}"
    if record.tag:
        return record.tag
    return f"[{record.dev}]" if record.dev else "?"


def _multi_for(ev: Evidence, job: bool | None, node: Evidence) -> bool | None:
    """Whether ``ev``'s communicators span nodes: never when the job has one node, else its own comm lines first,
    then the whole log's, then its node's channels (set up, and none crossed a node)."""
    if job is False:
        return False
    if (ev.nnodes or 0) > 1 or ev.net_channels() or (ev.top_rank >= _MAX_LOCAL_GPUS and not ev.mnnvl):
        return True
    if ev.single_node_comm and ev.nnodes == 1:
        return False
    if job is not None:
        return job
    if node.channels and not node.net_channels() and node.top_rank < _MAX_LOCAL_GPUS and (node.nnodes or 0) < 2:
        return False
    return False if ev.single_node_comm else None


def _node_decision(ev: Evidence, multi: bool | None, processes: list[RankReport]) -> Decision:
    """The node's verdict from all its processes' lines together; one process on sockets makes it SOCKETS."""
    on_sockets = [p.decision for p in processes if p.verdict == SOCKETS]
    return on_sockets[0] if on_sockets else decide(ev, _multi_for(ev, multi, ev))


def _node_report(name: str, ev: Evidence, decision: Decision) -> NodeTransportReport:
    network = ev.network()
    return NodeTransportReport(name, decision.verdict, decision.reason, network, f"NET/{network}" if network else None,
                      ev.devices(), ev.nccl_version, ev.provider, ev.evidence)


def combine(nodes: Iterable[tuple[str, str, str]]) -> tuple[str, str, str]:
    """The job's ``(node, verdict, reason)`` from its nodes' ones: the worst verdict (ORDER, the first node that
    has it), the reason naming that node where there are several."""
    found = sorted(nodes, key=lambda n: _natural(n[0]))
    if not found:
        return "", UNKNOWN, "no NCCL lines"
    node, verdict, reason = min(found, key=lambda n: ORDER.index(n[1]))
    return node, verdict, reason if len(found) == 1 else f"{node}: {reason}"


def _natural(name: str) -> tuple[object, ...]:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def short_version(version: str | None) -> str:
    """``2.21.5+cuda12.4`` -> ``2.21.5``."""
    return (version or "").split("+")[0]


def compact_devices(devices: list[str]) -> str:
    """``mlx5_0:1/IB mlx5_1:1/IB mlx5_2:1/IB mlx5_3:1/IB`` -> ``mlx5_0..3``."""
    names = [d.split(":")[0].split("/")[0] for d in devices]
    match = [re.fullmatch(r"(.*?)(\d+)", n) for n in names]
    if len(names) > 2 and all(match):
        stems = {m[1] for m in match if m}
        numbers = sorted({int(m[2]) for m in match if m})
        if len(stems) == 1 and len(numbers) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
            return f"{stems.pop()}{numbers[0]}..{numbers[-1]}"
    return ",".join(dict.fromkeys(names))


def parse_nccl_log(lines: Iterable[str], source: str = "-") -> LogReport:
    """The report of ``lines`` (their positions cited as ``source:N``)."""
    reader = NcclLogReader()
    for number, line in enumerate(lines, 1):
        reader.feed(line, f"{source}:{number}")
    return reader.report()


def judge(report: LogReport, expect: str) -> tuple[bool, str]:
    """(whether ``report`` meets ``expect`` — rdma, sockets or any —, the line that says so)."""
    return judge_verdict(report.verdict, report.reason, expect)


def judge_verdict(verdict: str, reason: str, expect: str) -> tuple[bool, str]:
    """(whether ``verdict`` meets ``expect``, the line that says so); ``reason``: why the verdict."""
    if expect == "any":
        return True, f"NCCL transport: {verdict}"
    if verdict == UNKNOWN:
        return False, f"could not prove {expect}: {reason}"
    if verdict not in PROOF[expect]:
        return False, f"expected {expect}, the log shows {verdict} ({reason})"
    if verdict == INTRA_NODE:
        return True, f"{verdict}: a single node, no network was used, nothing to prove"
    return True, f"{verdict}, as expected"


def contradicts(found: str, expect: str) -> bool:
    """True when verdict ``found`` proves the opposite of what ``expect`` (rdma, sockets or any) asked for."""
    return found in CONTRADICTS.get(expect, set())
