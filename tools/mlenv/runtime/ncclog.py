"""Read ``NCCL_DEBUG=INFO`` output and tell which transport NCCL really used, NCCL 2.3 to today.

A record is ``[prefix]host:pid:tid [cudaDev] NCCL INFO message`` (``file.cc:123 NCCL WARN`` for warnings);
the prefix may be a launcher's tag (``[default0]:``, ``0: ``, ``[1,0]<stdout>:``, mlenv's ``[node-1 r3]``) or a
timestamp, the host may be redacted or missing, and two records may share a line. Records are grouped by
process (``host:pid``, else the launcher's tag) and by node (mlenv's tag, else the host).

What proves the data transport, strongest first: the channels NCCL connects (``Ring 00 : 7 -> 8 via NET/IB/0``,
``Channel 02/1 : 3[3] -> 11[3] [send] via NET/AWS Libfabric/0/GDRDMA``), the network it names (``Using network
IB``; NCCL 2.3's ``Using internal Network Socket``), and last the devices a network reports (``NET/IB : Using
[0]mlx5_0:1/IB``). Bootstrap and sideband sockets (``Bootstrap : Using eth0``, 2.4's ``NET/Socket : Using`` before
the IB one, 2.3's ``for sideband communication``) never decide it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

RDMA_GDR = "RDMA+GDR"
RDMA = "RDMA (no GDR)"
SOCKETS = "SOCKETS"
INTRA_NODE = "INTRA-NODE"
MNNVL = "MNNVL"  # multi-node NVLink: a network transport, not INTRA-NODE
UNKNOWN = "UNKNOWN"
VERDICTS = (RDMA_GDR, RDMA, MNNVL, SOCKETS, INTRA_NODE, UNKNOWN)
EXPECTATIONS = ("rdma", "sockets", "any")
PROOF = {"rdma": {RDMA_GDR, RDMA, MNNVL, INTRA_NODE}, "sockets": {SOCKETS, INTRA_NODE}}
"""The verdicts each expectation accepts (INTRA-NODE: no network was used, so nothing contradicts)."""
CONTRADICTS = {"rdma": {SOCKETS}, "sockets": {RDMA_GDR, RDMA, MNNVL}}
"""The verdicts that prove the opposite of the expectation (stop a running job on them)."""

MAX_LINE = 64 * 1024
"""Characters of one line that are read; the rest of a longer line is skipped unread."""
_CHUNK = 1 << 20
_MAX_PROCESSES = 4096
_MAX_LOCAL_GPUS = 16  # no node holds more GPUs: a higher rank number means ranks on several nodes
_MAX_KEPT = 8  # warnings and evidence kept per process

_TIMESTAMP = re.compile(r"\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?")
_MARKER = re.compile(r"NCCL (INFO|WARN)\b:? ?")
_HEADER_CHARS = 256  # of the text before a marker: the record's header (host:pid:tid [dev] file:line)
_MESSAGE_CHARS = 2048  # of a record's message that is read
_SOURCE_LINE = re.compile(r"[\w./-]+\.\w+:\d+")  # transport/net_ib.cc:1295, before a WARN
_DEVICE_TAG = re.compile(r"\[(\d+)\]")
_MLENV_TAG = re.compile(r"\s*\[node-(?P<node>\d+) r(?P<rank>\d+)\]")
_LAUNCHER_TAG = re.compile(r"^\s*(?:\[(?P<tag>default\d+|\d+(?:,\d+)?)\](?:<std\w+>)?:?|(?P<label>\d+):\s)")
_VERSION = re.compile(r"[NR]CCL version (\d+\.\d+\.\d+[\w.+-]*)")
_COMM = re.compile(r"\brank (\d+) n[Rr]anks (\d+)")
_NNODES = re.compile(r"\bnNodes (\d+)")
_LOCAL_RANKS = re.compile(r"\blocalRanks (\d+)")
_MNNVL_COMM = re.compile(r"\bMNNVL (\d)\b")
_NAMED_NETWORK = re.compile(r"^(?:NET : )?Using (?:internal )?[Nn]etwork (?!plugin)(.+)")
_NET_USING = re.compile(r"^NET/(?P<name>[^:]+?) ?: ?Using (?P<rest>.*)$")
_NET_23_DEVICE = re.compile(r"^NET/(?P<name>\w+) ?: \[\d+\] ?(?P<device>\S+)")
_DEVICE = re.compile(r"\[\d+\]\s*([^\s;<\[]+)")
_CHANNEL = re.compile(r"^(?:Ring|Channel) \d+(?:/\d+)? : (?P<path>[^v]*(?:v(?!ia )[^v]*)*)via (?P<via>.+)")
_NET_VIA = re.compile(r"^(?:NET|COLLNET)/(?P<name>.+?)/(?P<dev>\d+)(?:\(\d+\))?(?P<flags>(?:/[\w-]+)*)(?P<more>.*)$")
_PATH_RANK = re.compile(r"(?<![\w\[])(\d+)(?:\[[0-9a-fA-F]+\])?")
_GDR_SUMMARY = re.compile(r"\bGDR ([01])\b")
_P2P_PLUGIN = re.compile(r"^P2P plugin (?:name )?(\S+)")
_OFI_PROVIDER = re.compile(r"Selected [Pp]rovider is (?P<provider>[\w;]+)")
_OFI_VERSION = re.compile(r"(?:Using|Initializing) (aws-ofi-[rn]ccl \S+)")
_SOCKET_PROVIDERS = ("tcp", "sockets", "udp", "shm")
_TCP_PLUGINS = ("tcpx", "fastrak", "tcpxo")


def is_socket_network(name: str, provider: str | None = None) -> bool:
    """True for NCCL's socket transport, TCP-based plugins (GPUDirect-TCPX) and OFI over a TCP provider."""
    lowered = name.lower()
    if lowered.startswith("socket") or any(word in lowered for word in _TCP_PLUGINS):
        return True
    return bool(provider) and str(provider).split(";")[0].lower() in _SOCKET_PROVIDERS


@dataclass
class Evidence:
    """What the NCCL lines of one process (or, merged, of a node) say about the transport."""

    nccl_version: str | None = None
    named: str | None = None  # "Using network X"
    inits: list[str] = field(default_factory=list)  # NET/X : Using [...] (not sideband)
    bootstrap_format: bool = False  # 2.5+ names its bootstrap socket "Bootstrap : Using"
    ib_missing: bool = False  # "NET/IB : No device found": NCCL goes on to sockets
    socket_data: bool = False  # a "NET/Socket : Using" line that is not NCCL 2.4's bootstrap one
    net_devices: dict[str, list[str]] = field(default_factory=dict)  # network -> devices it reported
    provider: str | None = None  # libfabric provider (OFI plugin)
    ofi: str | None = None  # aws-ofi-nccl version
    channels: Counter[str] = field(default_factory=Counter)  # "NET/IB/0/GDRDMA" -> count
    net_gdr: list[bool] = field(default_factory=list)  # per receive-side (or undirected) NET channel: GDRDMA?
    send_gdr: list[bool] = field(default_factory=list)
    gdr_summary: bool | None = None  # "Connected all rings ... GDR 1"
    gdr_enabled: bool = False  # "GPU Direct RDMA Enabled for HCA"
    nnodes: int | None = None
    top_rank: int = -1  # the highest rank number any line of it names
    single_node_comm: bool = False  # a communicator with nNodes 1 / nRanks == localRanks
    mnnvl: bool = False
    rank: int | None = None
    nranks: int | None = None
    warnings: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    hosts: set[str] = field(default_factory=set)

    def network(self) -> str | None:
        """The data network: the one NCCL named, else the channels', else the last non-socket one set up."""
        if self.named:
            return self.named
        net = [_net_name(via) for via in self.channels if _net_name(via)]
        if net:
            return str(net[0])
        rdma = [name for name in self.inits if not is_socket_network(name)]
        if rdma:
            return rdma[-1]
        sockets = [name for name in self.inits if is_socket_network(name)]
        if sockets and self.socket_data:
            return sockets[-1]
        return "Socket" if self.ib_missing else None

    def devices(self) -> list[str]:
        """The devices of the data network (a bootstrap socket's interface is not one)."""
        network = self.network()
        if network is None:
            return []
        if network in self.net_devices:
            return self.net_devices[network]
        sockets = is_socket_network(network, self.provider)  # IBext, UCX: the devices come as "NET/IB : Using"
        return next((found for name, found in self.net_devices.items() if is_socket_network(name) == sockets), [])

    def net_channels(self) -> int:
        return sum(n for via, n in self.channels.items() if _net_name(via))

    def gdr(self) -> bool | None:
        """True when every receiving NET channel (else every sending one) uses GPUDirect RDMA; None: not known."""
        if self.gdr_summary is not None:
            return self.gdr_summary
        sides = self.net_gdr or self.send_gdr
        if sides:
            return all(sides)
        return True if self.gdr_enabled and self.network() else None

    def merge(self, other: Evidence) -> None:
        self.nccl_version = self.nccl_version or other.nccl_version
        self.named = self.named or other.named
        self.inits += other.inits
        for name, found in other.net_devices.items():
            mine = self.net_devices.setdefault(name, [])
            mine += [d for d in found if d not in mine]
        self.provider = self.provider or other.provider
        self.ofi = self.ofi or other.ofi
        self.channels.update(other.channels)
        self.net_gdr += other.net_gdr
        self.send_gdr += other.send_gdr
        if other.gdr_summary is not None:
            self.gdr_summary = bool(self.gdr_summary is not False and other.gdr_summary)
        self.gdr_enabled |= other.gdr_enabled
        self.nnodes = max(self.nnodes or 0, other.nnodes or 0) or None
        self.top_rank = max(self.top_rank, other.top_rank)
        self.bootstrap_format |= other.bootstrap_format
        self.ib_missing |= other.ib_missing
        self.socket_data |= other.socket_data
        self.single_node_comm |= other.single_node_comm
        self.mnnvl |= other.mnnvl
        self.evidence += other.evidence[: _MAX_KEPT - len(self.evidence)]
        self.hosts |= other.hosts


def _net_name(via: str) -> str | None:
    match = _NET_VIA.match(via)
    return match["name"] if match else None


@dataclass(frozen=True)
class Decision:
    verdict: str
    reason: str


def decide(ev: Evidence, multi_node: bool | None) -> Decision:
    """The verdict for one process's or one node's evidence; ``multi_node``: whether the job spans nodes."""
    network = ev.network()
    plugin = f"NET/{network}" if network else None
    if ev.net_channels():
        names = sorted({str(_net_name(via)) for via in ev.channels if _net_name(via)})
        if any(is_socket_network(name, ev.provider) for name in names):
            return Decision(SOCKETS, f"channels cross nodes over {', '.join(f'NET/{n}' for n in names)}"
                            + (f" (libfabric provider {ev.provider})" if ev.provider else ""))
        gdr = ev.gdr()
        return Decision(RDMA_GDR if gdr else RDMA,
                        f"{ev.net_channels()} channels cross nodes over {', '.join(f'NET/{n}' for n in names)}"
                        + ("" if gdr else ", not all with GPUDirect RDMA"))
    if ev.mnnvl and multi_node:
        return Decision(MNNVL, "ranks on several nodes share one NVLink domain (MNNVL) and no channel uses NET/")
    if multi_node is False:
        return Decision(INTRA_NODE, f"one node: NCCL set up {plugin} but no channel crossed it" if network
                        else "one node ran every rank: no network to cross")
    if network:
        if is_socket_network(network, ev.provider):
            return Decision(SOCKETS, f"NCCL chose {plugin}" + (f" (libfabric provider {ev.provider})"
                                                                if ev.provider else ""))
        gdr = ev.gdr()
        return Decision(RDMA_GDR if gdr else RDMA, f"NCCL chose {plugin}" + (
            "" if gdr else "; no channel line shows GPUDirect RDMA" if gdr is None else ", without GPUDirect RDMA"))
    local = [via for via in ev.channels if not _net_name(via)]
    if local and multi_node is not True:
        return Decision(INTRA_NODE, f"one node: channels via {', '.join(sorted({v.split('/')[0] for v in local}))}")
    if ev.single_node_comm and multi_node is not True:
        return Decision(INTRA_NODE, "one node: every communicator has nNodes 1")
    if local:
        return Decision(UNKNOWN, "only intra-node channels here, and no network named")
    return Decision(UNKNOWN, "NCCL named no network and set up no channel (NCCL_DEBUG=INFO with "
                             "NCCL_DEBUG_SUBSYS including INIT,NET shows them)")


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
            "gdr": bool(ev.gdr()) and self.verdict == RDMA_GDR,
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
        net = {via: n for via, n in ev.channels.items() if _net_name(via)}
        if net:
            gdr = sum(n for via, n in net.items() if "GDRDMA" in via)
            parts.append(f"{sum(net.values())} net channels ({gdr} GDRDMA)")
        local = sorted({via.split("/")[0] for via in ev.channels if not _net_name(via)})
        if local:
            parts.append(f"intra-node {', '.join(local)}")
        if ev.nccl_version:
            parts.append(f"NCCL {ev.nccl_version}")
        return "; ".join(parts)


@dataclass(frozen=True)
class NodeReport:
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


_ORDER = (SOCKETS, RDMA, RDMA_GDR, MNNVL, INTRA_NODE, UNKNOWN)
"""Worst first: one node on sockets makes the whole job SOCKETS."""


@dataclass
class LogReport:
    """All ranks and nodes found in the logs and the overall verdict."""

    ranks: list[RankReport]
    nodes: list[NodeReport]
    verdict: str
    reason: str
    nccl_version: str | None = None

    def node(self, name: str) -> NodeReport | None:
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
            "evidence": [e for n in deciding for e in n.evidence][:_MAX_KEPT],
            "nodes": {n.node: n.to_dict() for n in self.nodes},
            "ranks": [r.to_dict() for r in self.ranks],
        }


class NcclLogReader:
    """Reads NCCL lines one at a time (from files, or live from a running job) and reports at any moment."""

    def __init__(self, nodes: int | None = None) -> None:
        """``nodes``: how many nodes the job has, when the caller knows (1: a verdict can only be INTRA-NODE)."""
        self._nodes = nodes
        self._processes: dict[str, RankReport] = {}
        self._version: str | None = None
        self.lines = 0
        self.skipped_processes = 0

    def feed(self, text: str, where: str = "", *, node: str | None = None, rank: int | None = None) -> bool:
        """Read one line; ``node``/``rank``: who wrote it when the caller knows (mlenv's supervisor).
        True when the line said something about the transport (worth a new report)."""
        self.lines += 1
        if "NCCL" not in text:
            return False
        text = text[:MAX_LINE]
        tag = _MLENV_TAG.match(text)
        if tag and node is None:
            node, rank = f"node-{tag['node']}", int(tag["rank"])
        version = _VERSION.search(text) if "CCL version" in text else None
        if version:
            self._version = self._version or version[1]
        launcher = _LAUNCHER_TAG.match(text)
        found = False
        markers = list(_MARKER.finditer(text))
        headers, previous = [], 0
        for marker in markers:
            headers.append(_header(text, max(previous, marker.start() - _HEADER_CHARS), marker.start()))
            previous = marker.end()
        for index, marker in enumerate(markers):
            host, pid, dev, _ = headers[index]
            end = headers[index + 1][3] if index + 1 < len(markers) else len(text)
            message = text[marker.end():min(end, marker.end() + _MESSAGE_CHARS)].strip()
            report = self._process(_key(host, pid, dev, launcher, node, rank), node or host or "?", host)
            if report is None:
                continue
            if version and report.evidence_.nccl_version is None:
                report.evidence_.nccl_version = version[1]
            if rank is not None and report.evidence_.rank is None:
                report.evidence_.rank = rank
            found |= _read_message(report.evidence_, marker[1], message, where)
        return found or bool(version)

    def _process(self, key: str, node: str, host: str | None) -> RankReport | None:
        report = self._processes.get(key)
        if report is None:
            if len(self._processes) >= _MAX_PROCESSES:
                self.skipped_processes += 1
                return None
            report = self._processes[key] = RankReport(key, node)
        if host:
            report.evidence_.hosts.add(host)
        return report

    def report(self) -> LogReport:
        """Verdicts per rank, per node and overall from what was read so far."""
        processes = list(self._processes.values())
        for process in processes:
            process.evidence_.nccl_version = process.evidence_.nccl_version or self._version
        nodes: dict[str, Evidence] = {}
        for process in processes:
            nodes.setdefault(process.node, Evidence()).merge(process.evidence_)
        multi = self._multi_node(nodes)
        for process in processes:
            process.decision = decide(process.evidence_, _multi_for(process.evidence_, multi))
        node_reports = [_node_report(name, ev, _node_decision(ev, multi, [p for p in processes if p.node == name]))
                        for name, ev in sorted(nodes.items(), key=lambda item: _natural(item[0]))]
        verdict, reason = _overall(node_reports)
        if not processes:
            reason = "no NCCL lines" + (" (NCCL_DEBUG unset, or set to WARN?)" if self.lines else ": empty input")
        ordered = sorted(processes, key=lambda r: (r.rank is None, r.rank or 0, _natural(r.process)))
        return LogReport(ordered, node_reports, verdict, reason, self._version)

    def _multi_node(self, nodes: dict[str, Evidence]) -> bool | None:
        if self._nodes is not None:
            return self._nodes > 1
        named = [name for name in nodes if name != "?"]
        if len(named) > 1 or any(ev.net_channels() for ev in nodes.values()):
            return True
        if any((ev.nnodes or 0) > 1 for ev in nodes.values()):
            return True
        if len(named) == 1 and "?" not in nodes:  # one host: single-node when it ran every rank of the job
            ranks = max((p.evidence_.nranks or 0 for p in self._processes.values()), default=0)
            running = {p.evidence_.rank for p in self._processes.values() if p.evidence_.rank is not None}
            if ranks and (len(self._processes) >= ranks or len(running) >= ranks):
                return False
        return None


def _header(text: str, start: int, marker: int) -> tuple[str | None, str | None, str | None, int]:
    """(host, pid, cudaDev, where the header begins) of the record whose ``NCCL INFO`` is at ``marker``,
    read right to left over the tokens of ``text[start:marker]``."""
    tokens = _TIMESTAMP.sub(" ", text[start:marker]).split()
    host = pid = dev = None
    taken = 0
    if tokens and _SOURCE_LINE.fullmatch(tokens[-1]) and tokens[-1].count(":") == 1:
        taken += 1
    if len(tokens) > taken and (device := _DEVICE_TAG.search(tokens[-1 - taken])) and tokens[-1 - taken].endswith("]"):
        dev, taken = device[1], taken + 1
    if len(tokens) > taken:
        head, _, rest = tokens[-1 - taken].rpartition(":")
        name, _, number = head.rpartition(":")
        if rest.isdigit() and number.isdigit():
            name = name.rsplit("]", 1)[-1].rsplit("|", 1)[-1].rsplit(":", 1)[-1]
            host, pid, taken = name or None, number, taken + 1
            if dev is None and (device := _DEVICE_TAG.search(tokens[-taken])) and tokens[-taken].startswith("["):
                dev = device[1]
    if not taken:
        return None, None, None, marker
    first = tokens[-taken]
    return host, pid, dev, text.rfind(first, start, marker) if first in text[start:marker] else marker


def _key(host: str | None, pid: str | None, dev: str | None, launcher: re.Match[str] | None, node: str | None,
         rank: int | None) -> str:
    """The process a record belongs to: host:pid, else who the caller or the launcher's tag says wrote it."""
    if host and pid:
        return f"{host}:{pid}"
    if node is not None and rank is not None:
        return f"{node} r{rank}"
    if launcher:
        return f"[{launcher['tag'] or launcher['label']}]"
    return f"[{dev}]" if dev else "?"


def _multi_for(ev: Evidence, job: bool | None) -> bool | None:
    """Whether ``ev``'s communicators span nodes: never when the job has one node, else its own comm lines first,
    then the whole log's."""
    if job is False:
        return False
    if (ev.nnodes or 0) > 1 or ev.net_channels() or (ev.top_rank >= _MAX_LOCAL_GPUS and not ev.mnnvl):
        return True
    if ev.single_node_comm and ev.nnodes == 1:
        return False
    if job is not None:
        return job
    if ev.channels:  # channels set up and none crossed a node
        return False
    return False if ev.single_node_comm else None


def _node_decision(ev: Evidence, multi: bool | None, processes: list[RankReport]) -> Decision:
    """The node's verdict from all its processes' lines together; one process on sockets makes it SOCKETS."""
    on_sockets = [p.decision for p in processes if p.verdict == SOCKETS]
    return on_sockets[0] if on_sockets else decide(ev, _multi_for(ev, multi))


def _node_report(name: str, ev: Evidence, decision: Decision) -> NodeReport:
    network = ev.network()
    return NodeReport(name, decision.verdict, decision.reason, network, f"NET/{network}" if network else None,
                      ev.devices(), ev.nccl_version, ev.provider, ev.evidence)


def _overall(nodes: list[NodeReport]) -> tuple[str, str]:
    if not nodes:
        return UNKNOWN, "no NCCL lines"
    worst = min(nodes, key=lambda n: _ORDER.index(n.verdict))
    reason = worst.reason if len(nodes) == 1 else f"{worst.node}: {worst.reason}"
    return worst.verdict, reason


def _read_message(ev: Evidence, level: str, message: str, where: str) -> bool:
    """Fold one record into ``ev``; True when it bears on the transport."""
    def note() -> bool:
        if where and len(ev.evidence) < _MAX_KEPT and where not in ev.evidence:
            ev.evidence.append(where)
        return True

    if level == "WARN":
        if len(ev.warnings) < _MAX_KEPT:
            ev.warnings.append(message[:300])
        return False
    if channel := _CHANNEL.match(message):
        return _read_channel(ev, channel["via"].strip()[:200], channel["path"]) and note()
    if named := _NAMED_NETWORK.match(message):
        ev.named = named[1].strip().rstrip(".")
        return note()
    if "for sideband communication" in message:
        return False
    if message.startswith("Bootstrap"):
        ev.bootstrap_format = True
        return False
    if message.startswith("NET/IB") and "No device found" in message:
        ev.ib_missing = True
        return note()
    if net := _NET_USING.match(message):
        name, rest = net["name"].strip(), net["rest"]
        if name.upper() == "OFI":
            if version := _OFI_VERSION.search(message):
                ev.ofi = version[1]
            return False
        if rest.lstrip().startswith("[") or name.upper().startswith(("IB", "UCX")):
            if is_socket_network(name):
                # NCCL 2.4 set up its bootstrap socket with this same line, before the data network
                ev.socket_data |= ev.bootstrap_format or ev.ib_missing or name in ev.inits
            ev.inits.append(name)
            ev.net_devices[name] = _DEVICE.findall(rest) or ev.net_devices.get(name, [])
            return note()
        return False
    if device := _NET_23_DEVICE.match(message):
        found = ev.net_devices.setdefault(device["name"], [])
        if device["device"] not in found:
            found.append(device["device"])
        if device["name"] not in ev.inits:
            ev.inits.append(device["name"])
        return note()
    if provider := _OFI_PROVIDER.search(message):
        ev.provider = provider["provider"]
        return note()
    if version := _OFI_VERSION.search(message):
        ev.ofi = version[1]
        return False
    if "GPU Direct RDMA Enabled" in message:
        ev.gdr_enabled = True
        return note()
    if message.startswith("Connected all") and (summary := _GDR_SUMMARY.search(message)):
        ev.gdr_summary = summary[1] == "1"
        return note()
    if comm := _COMM.search(message):
        _read_comm(ev, message, comm)
        return note() if _NNODES.search(message) or _MNNVL_COMM.search(message) else False
    if plugin := _P2P_PLUGIN.match(message):
        ev.inits.append(plugin[1])
        return note()
    return False


def _read_comm(ev: Evidence, message: str, comm: re.Match[str]) -> None:
    rank, nranks = int(comm[1]), int(comm[2])
    ev.top_rank = max(ev.top_rank, nranks - 1)
    if ev.nranks is None or nranks > ev.nranks:
        ev.rank = ev.rank if ev.rank is not None and ev.nranks == nranks else rank
        ev.nranks = nranks
    nnodes = _NNODES.search(message)
    local = _LOCAL_RANKS.search(message)
    if nnodes:
        ev.nnodes = max(ev.nnodes or 0, int(nnodes[1]))
        ev.single_node_comm |= nnodes[1] == "1"
    elif local and int(local[1]) == nranks:
        ev.single_node_comm = True
    if (mnnvl := _MNNVL_COMM.search(message)) and mnnvl[1] == "1":
        ev.mnnvl = True


def _read_channel(ev: Evidence, via: str, path: str) -> bool:
    ev.top_rank = max([ev.top_rank, *(int(r) for r in _PATH_RANK.findall(path))])
    net = _NET_VIA.match(via)
    if net is None:
        ev.channels[via] += 1
        return True
    flags = net["flags"]
    key = f"NET/{net['name']}/{net['dev']}{flags}"
    ev.channels[key] += 1
    summary = _GDR_SUMMARY.search(net["more"])
    gdr = "GDRDMA" in flags or (summary is not None and summary[1] == "1")
    (ev.send_gdr if "[send]" in path else ev.net_gdr).append(gdr)
    del ev.net_gdr[:-256], ev.send_gdr[:-256]  # bounded: the latest channels tell as much
    return True


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


def iter_lines(stream: BinaryIO, limit: int = MAX_LINE) -> Iterator[str]:
    """The lines of a binary stream, read in bounded chunks; a line longer than ``limit`` is cut there and the
    rest of it skipped without being held."""
    partial = b""
    skipping = False
    while chunk := stream.read(_CHUNK):
        start = 0
        while (end := chunk.find(b"\n", start)) != -1:
            if not skipping:
                yield (partial + chunk[start:end])[:limit].decode(errors="replace")
            partial, skipping, start = b"", False, end + 1
        if not skipping:
            partial += chunk[start:start + limit - len(partial)]
            if len(partial) >= limit:
                yield partial.decode(errors="replace")
                partial, skipping = b"", True
    if partial and not skipping:
        yield partial.decode(errors="replace")


def parse_nccl_log(lines: Iterable[str], source: str = "-") -> LogReport:
    """The report of ``lines`` (their positions cited as ``source:N``)."""
    reader = NcclLogReader()
    for number, line in enumerate(lines, 1):
        reader.feed(line, f"{source}:{number}")
    return reader.report()


def judge(report: LogReport, expect: str) -> tuple[bool, str]:
    """(whether ``report`` meets ``expect`` — rdma, sockets or any —, the line that says so)."""
    verdict = report.verdict
    if expect == "any":
        return True, f"NCCL transport: {verdict}"
    if verdict == UNKNOWN:
        return False, f"could not prove {expect}: {report.reason}"
    if verdict not in PROOF[expect]:
        return False, f"expected {expect}, the log shows {verdict} ({report.reason})"
    if verdict == INTRA_NODE:
        return True, f"{verdict}: a single node, no network was used, nothing to prove"
    return True, f"{verdict}, as expected"


def contradicts(found: str, expect: str) -> bool:
    """True when verdict ``found`` proves the opposite of what ``expect`` (rdma, sockets or any) asked for."""
    return found in CONTRADICTS.get(expect, set())
