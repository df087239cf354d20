"""NCCL's ``NCCL_DEBUG=INFO`` lines, NCCL 2.0 to today: records and what each says about the transport.

NCCL writes a record as ``host:pid:tid [cudaDev] NCCL INFO message``, a warning as ``host:pid:tid [cudaDev]
file.cc:123 [(function) ]NCCL WARN message`` (src/debug.cc; the host cut at its first dot; a ``[%F %T] ``
timestamp where NCCL_DEBUG_TIMESTAMP_LEVELS asks, warnings by default since 2.21) and its version alone, as
``NCCL version 2.21.5+cuda12.4``. NCCL 2.0 to 2.2 wrote no ``NCCL`` before the level (``host:pid:tid [0] INFO
Using internal Network IB``): :func:`records` reads those as the same records. A launcher may put its tag
first: mlenv's ``[node-1 r3] ``, torchrun's ``[default0]:`` or ``[rank0]:``, mpirun's ``[1,0]<stdout>:``, srun's
``0: ``, DeepSpeed's and pdsh's ``host: ``.

:func:`nccl_record` takes only a line in that exact shape (what a running job's proof may believe);
:func:`records` reads logs as people paste them (host redacted or missing, other prefixes, two records on one
line). :class:`Evidence` folds records into what they prove: networks set up, channels, GPUDirect RDMA, errors.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO

MAX_LINE = 64 * 1024
"""Characters of one line that are read; the rest of a longer line is skipped unread."""
MAX_KEPT = 8  # warnings and evidence kept per process
_CHUNK = 1 << 20
_HEADER_CHARS = 256  # of the text before a marker: the record's header (host:pid:tid [dev] file:line)
_MESSAGE_CHARS = 2048  # of a record's message that is read

_TIMESTAMP = re.compile(r"\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?")
_MARKER = re.compile(r"NCCL (INFO|WARN)\b:? ?")
_BARE_LEVEL = re.compile(r"(?P<head>:\d+:\d+ \[-?\d+\] (?:[\w./-]+\.\w+:\d+ )?)(?P<level>INFO|WARN) ")
"""NCCL 2.0-2.2's header (``host:pid:tid [0] `` and a warning's ``file.cu:12 ``), then its level without ``NCCL``."""
_SOURCE_LINE = re.compile(r"[\w./-]+\.\w+:\d+")  # transport/net_ib.cc:1295, before a WARN
_DEVICE_TAG = re.compile(r"\[(\d+)\]")
_MLENV_TAG = re.compile(r"\s*\[node-(?P<node>\d+) r(?P<rank>\d+)\]")
LAUNCHER_TAG = re.compile(r"\s*(?:\[node-\d+(?: r\d+)?\] |\[(?P<tag>default\d+|rank\d+|\d+(?:,\d+)?)\](?:<std\w+>)?:?"
                          r"|(?P<label>\d+): |[\w.-]+: )")
_OWN = re.compile(r"(?:\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)?\] )?(?P<host>[\w-]+):(?P<pid>\d+):\d+ "
                  r"\[(?P<dev>-?\d+)\] (?:[\w./<>-]+:\d+ (?:\(\w+\) )?(?=NCCL WARN))?NCCL (?P<level>INFO|WARN) "
                  r"(?P<message>.*)")
_VERSION = re.compile(r"[NR]CCL version (\d+\.\d+\.\d+[\w.+-]*)")
_OWN_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+[\w.+-]*)\s*")
_COMM = re.compile(r"\brank (\d+) n[Rr]anks (\d+)")
_NNODES = re.compile(r"\bnNodes (\d+)")
_LOCAL_RANKS = re.compile(r"\blocalRanks (\d+)")
_MNNVL_COMM = re.compile(r"\bMNNVL (\d)\b")
_NAMED_NETWORK = re.compile(r"^(?:NET : )?Using (?:internal )?[Nn]etwork (?!plugin)(.+)")
_NET_USING = re.compile(r"^NET/(?P<name>[^:]+?) ?: ?Using (?P<rest>.*)$")
_NET_23_DEVICE = re.compile(r"^NET/(?P<name>\w+) ?: \[\d+\] ?(?P<device>\S+)")
_NET_ERROR = re.compile(r"^NET/(?P<name>IB\w*|Socket)\b")  # a WARN of the network itself: it was in use
_DEVICE = re.compile(r"\[\d+\]\s*([^\s;<\[]+)")
_CHANNEL = re.compile(r"^(?:Ring|Channel) \d+(?:/\d+)? : (?P<path>[^v]*(?:v(?!ia )[^v]*)*)via (?P<via>.+)")
_NET_VIA = re.compile(r"^(?:NET|COLLNET)/(?P<name>.+?)/(?P<dev>\d+)(?:\(\d+\))?(?P<flags>(?:/[\w-]+)*)(?P<more>.*)$")
_PATH_RANK = re.compile(r"(?<![\w\[])(\d+)(?:\[[0-9a-fA-F]+\])?")
_GDR_SUMMARY = re.compile(r"\bGDR ([01])\b")
_GDR_HCA = re.compile(r"GPU Direct RDMA (?:\(DMABUF\) )?([Ee]nabled|[Dd]isabled) for")
_P2P_PLUGIN = re.compile(r"^P2P plugin (?:name )?(\S+)")
_OFI_PROVIDER = re.compile(r"Selected [Pp]rovider is (?P<provider>[\w;]+)")
_OFI_VERSION = re.compile(r"(?:Using|Initializing) (aws-ofi-[rn]ccl \S+)")
_SOCKET_PROVIDERS = ("tcp", "sockets", "udp", "shm")
_TCP_PLUGINS = ("tcpx", "fastrak", "tcpxo")


@dataclass(frozen=True)
class NcclRecord:
    """One record: who wrote it (``host``/``pid``/``dev`` as its header says, ``tag`` the launcher's) and what.
    ``level`` is INFO, WARN or VERSION (a bare ``NCCL version`` line, without a header)."""

    level: str
    message: str
    host: str | None = None
    pid: str | None = None
    dev: str | None = None
    tag: str | None = None
    version: str | None = None
    node: str | None = None  # mlenv's tag: node-1 ...
    rank: int | None = None  # ... and the global rank


def nccl_record(text: str) -> NcclRecord | None:
    """The record of a line in NCCL's own shape, after at most one launcher tag; None for anything else (text that
    merely contains NCCL's words, a header cut or moved, two records on a line)."""
    tag = LAUNCHER_TAG.match(text)
    rest = text[tag.end():] if tag else text
    if (own := _OWN.fullmatch(rest.strip())) and not _MARKER.search(own["message"]):  # not two records joined
        message = own["message"][:_MESSAGE_CHARS].strip()
        version = _VERSION.match(message)
        return NcclRecord(own["level"], message, own["host"], own["pid"], own["dev"], _tag(tag),
                      version[1] if version else None, *_mlenv(text))
    if version := _OWN_VERSION.fullmatch(rest.strip()):
        return NcclRecord("VERSION", rest.strip(), None, None, None, _tag(tag), version[1], *_mlenv(text))
    return None


def records(text: str) -> list[NcclRecord]:
    """Every record of a line as logs are pasted: each ``NCCL INFO|WARN`` (NCCL 2.0-2.2: a bare ``INFO|WARN``
    after a header) with the header found before it."""
    if "NCCL INFO" not in text and "NCCL WARN" not in text and ("INFO " in text or "WARN " in text):
        text = _BARE_LEVEL.sub(r"\g<head>NCCL \g<level> ", text)
    if "NCCL" not in text:
        return []
    launcher = LAUNCHER_TAG.match(text)
    version = _VERSION.search(text) if "CCL version" in text else None
    markers = list(_MARKER.finditer(text))
    headers, previous = [], 0
    for marker in markers:
        headers.append(_header(text, max(previous, marker.start() - _HEADER_CHARS), marker.start()))
        previous = marker.end()
    found = []
    for index, marker in enumerate(markers):
        host, pid, dev, _ = headers[index]
        end = headers[index + 1][3] if index + 1 < len(markers) else len(text)
        message = text[marker.end():min(end, marker.end() + _MESSAGE_CHARS)].strip()
        found.append(NcclRecord(marker[1], message, host, pid, dev, _tag(launcher), version[1] if version else None,
                            *_mlenv(text)))
    if version and not found:
        found.append(NcclRecord("VERSION", text.strip()[:_MESSAGE_CHARS], None, None, None, _tag(launcher), version[1],
                            *_mlenv(text)))
    return found


def _tag(match: re.Match[str] | None) -> str | None:
    return f"[{match['tag'] or match['label']}]" if match and (match["tag"] or match["label"]) else None


def _mlenv(text: str) -> tuple[str | None, int | None]:
    tag = _MLENV_TAG.match(text)
    return (f"node-{tag['node']}", int(tag["rank"])) if tag else (None, None)


def _header(text: str, start: int, marker: int) -> tuple[str | None, str | None, str | None, int]:
    """(host, pid, cudaDev, where the header begins) of the record whose ``NCCL INFO`` is at ``marker``,
    read right to left over the tokens of ``text[start:marker]``."""
    tokens = _TIMESTAMP.sub(" ", text[start:marker]).split()
    host = pid = dev = None
    taken = 0
    if tokens and tokens[-1].startswith("(") and tokens[-1].endswith(")"):  # 2.2x: "file.cc:12 (function)"
        taken += 1
    if len(tokens) > taken and _SOURCE_LINE.fullmatch(tokens[-1 - taken]) and tokens[-1 - taken].count(":") == 1:
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


def is_socket_network(name: str, provider: str | None = None) -> bool:
    """True for NCCL's socket transport, TCP-based plugins (GPUDirect-TCPX) and OFI over a TCP provider."""
    lowered = name.lower()
    if lowered.startswith("socket") or any(word in lowered for word in _TCP_PLUGINS):
        return True
    return bool(provider) and str(provider).split(";")[0].lower() in _SOCKET_PROVIDERS


def net_name(via: str) -> str | None:
    """``IB`` for a channel ``via NET/IB/0/GDRDMA``; None for an intra-node one (P2P, SHM)."""
    match = _NET_VIA.match(via)
    return match["name"] if match else None


@dataclass
class Evidence:
    """What the NCCL records of one process (or, merged, of a node) say about the transport."""

    nccl_version: str | None = None
    named: str | None = None  # "Using network X"
    inits: list[str] = field(default_factory=list)  # NET/X : Using [...] (not sideband)
    bootstrap_format: bool = False  # 2.5+ names its bootstrap socket "Bootstrap : Using"
    ib_missing: bool = False  # "NET/IB : No device found": NCCL goes on to sockets
    socket_data: bool = False  # a "NET/Socket : Using" line that is not NCCL 2.4's bootstrap one
    net_devices: dict[str, list[str]] = field(default_factory=dict)  # network -> devices it reported
    failed: list[str] = field(default_factory=list)  # networks whose own WARNs say they failed in use
    provider: str | None = None  # libfabric provider (OFI plugin)
    ofi: str | None = None  # aws-ofi-nccl version
    channels: Counter[str] = field(default_factory=Counter)  # "NET/IB/0/GDRDMA" -> count
    net_gdr: list[bool] = field(default_factory=list)  # per receive-side (or undirected) NET channel: GDRDMA?
    send_gdr: list[bool] = field(default_factory=list)
    gdr_summary: bool | None = None  # "Connected all rings ... GDR 1"
    gdr_hca: bool | None = None  # "GPU Direct RDMA Enabled|Disabled for HCA"
    nnodes: int | None = None
    top_rank: int = -1  # the highest rank number any record of it names
    single_node_comm: bool = False  # a communicator with nNodes 1 / nRanks == localRanks
    mnnvl: bool = False
    rank: int | None = None
    nranks: int | None = None
    comm_ranks: set[int] = field(default_factory=set)  # ranks of its largest communicator (several: one process,
    # several GPUs)
    warnings: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    hosts: set[str] = field(default_factory=set)

    def network(self) -> str | None:
        """The data network: the one NCCL named, else the channels', else the last non-socket one set up, else
        the one whose errors show it was used."""
        if self.named:
            return self.named
        net = [net_name(via) for via in self.channels if net_name(via)]
        if net:
            return str(net[0])
        rdma = [name for name in self.inits if not is_socket_network(name)]
        if rdma:
            return rdma[-1]
        sockets = [name for name in self.inits if is_socket_network(name)]
        if sockets and self.socket_data:
            return sockets[-1]
        if self.ib_missing:
            return "Socket"
        return self.failed[0] if self.failed else None

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
        return sum(n for via, n in self.channels.items() if net_name(via))

    def gdr(self) -> bool | None:
        """True when every receiving NET channel (else every sending one) uses GPUDirect RDMA; None: not shown."""
        if self.gdr_summary is not None:
            return self.gdr_summary
        sides = self.net_gdr or self.send_gdr
        if sides:
            return all(sides)
        return self.gdr_hca if self.network() else None

    def merge(self, other: Evidence) -> None:
        self.nccl_version = self.nccl_version or other.nccl_version
        self.named = self.named or other.named
        self.inits += other.inits
        self.failed += [name for name in other.failed if name not in self.failed]
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
        if other.gdr_hca is not None:
            self.gdr_hca = bool(self.gdr_hca is not False and other.gdr_hca)
        self.nnodes = max(self.nnodes or 0, other.nnodes or 0) or None
        self.top_rank = max(self.top_rank, other.top_rank)
        self.bootstrap_format |= other.bootstrap_format
        self.ib_missing |= other.ib_missing
        self.socket_data |= other.socket_data
        self.single_node_comm |= other.single_node_comm
        self.mnnvl |= other.mnnvl
        self.evidence += other.evidence[: MAX_KEPT - len(self.evidence)]
        self.warnings += other.warnings[: MAX_KEPT - len(self.warnings)]
        self.hosts |= other.hosts

    def read(self, record: NcclRecord, where: str) -> bool:
        """Fold one record in; True when it bears on the transport (``where`` is then kept as evidence)."""
        self.nccl_version = self.nccl_version or record.version
        if record.host:
            self.hosts.add(record.host)
        if _read_message(self, record.level, record.message):
            if where and len(self.evidence) < MAX_KEPT and where not in self.evidence:
                self.evidence.append(where)
            return True
        return False


def _read_message(ev: Evidence, level: str, message: str) -> bool:
    if level == "WARN":
        if len(ev.warnings) < MAX_KEPT:
            ev.warnings.append(message[:300])
        if (failed := _NET_ERROR.match(message)) and failed["name"] not in ev.failed:
            ev.failed.append(failed["name"])
        return bool(failed)
    if channel := _CHANNEL.match(message):
        return _read_channel(ev, channel["via"].strip()[:200], channel["path"])
    if named := _NAMED_NETWORK.match(message):
        ev.named = named[1].strip().rstrip(".")
        return True
    if "for sideband communication" in message:
        return False
    if message.startswith("Bootstrap"):
        ev.bootstrap_format = True
        return False
    if message.startswith("NET/IB") and "No device found" in message:
        ev.ib_missing = True
        return True
    if net := _NET_USING.match(message):
        return _read_net_using(ev, net["name"].strip(), net["rest"], message)
    if device := _NET_23_DEVICE.match(message):
        found = ev.net_devices.setdefault(device["name"], [])
        if device["device"] not in found:
            found.append(device["device"])
        if device["name"] not in ev.inits:
            ev.inits.append(device["name"])
        return True
    if provider := _OFI_PROVIDER.search(message):
        ev.provider = provider["provider"]
        return True
    if version := _OFI_VERSION.search(message):
        ev.ofi = version[1]
        return False
    if gdr := _GDR_HCA.search(message):
        ev.gdr_hca = gdr[1].lower() == "enabled" and ev.gdr_hca is not False
        return True
    if message.startswith("Connected all") and (summary := _GDR_SUMMARY.search(message)):
        ev.gdr_summary = summary[1] == "1"
        return True
    if comm := _COMM.search(message):
        return _read_comm(ev, message, comm)
    if plugin := _P2P_PLUGIN.match(message):
        ev.inits.append(plugin[1])
        return True
    return False


def _read_net_using(ev: Evidence, name: str, rest: str, message: str) -> bool:
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
        return True
    return False


def _read_comm(ev: Evidence, message: str, comm: re.Match[str]) -> bool:
    """Fold a communicator's line in; True when it says how many nodes (``nNodes``, ``MNNVL``, or
    ``ncclCommInitAll``: one process made every rank, so one node)."""
    rank, nranks = int(comm[1]), int(comm[2])
    init_all = message.startswith("ncclCommInitAll ")
    ev.top_rank = max(ev.top_rank, nranks - 1)
    if ev.nranks is None or nranks > ev.nranks:
        ev.rank = ev.rank if ev.rank is not None and ev.nranks == nranks else rank
        ev.nranks, ev.comm_ranks = nranks, set()
    if nranks == ev.nranks:
        ev.comm_ranks.add(rank)
    nnodes = _NNODES.search(message)
    local = _LOCAL_RANKS.search(message)
    if nnodes:
        ev.nnodes = max(ev.nnodes or 0, int(nnodes[1]))
        ev.single_node_comm |= nnodes[1] == "1"
    elif local and int(local[1]) == nranks:
        ev.single_node_comm = True
    elif init_all:
        ev.nnodes, ev.single_node_comm = max(ev.nnodes or 0, 1), True
    mnnvl = _MNNVL_COMM.search(message)
    ev.mnnvl |= bool(mnnvl and mnnvl[1] == "1")
    return bool(nnodes or mnnvl or init_all)


def _read_channel(ev: Evidence, via: str, path: str) -> bool:
    ev.top_rank = max([ev.top_rank, *(int(r) for r in _PATH_RANK.findall(path))])
    net = _NET_VIA.match(via)
    if net is None:
        ev.channels[via] += 1
        return True
    flags = net["flags"]
    ev.channels[f"NET/{net['name']}/{net['dev']}{flags}"] += 1
    summary = _GDR_SUMMARY.search(net["more"])
    gdr = "GDRDMA" in flags or (summary is not None and summary[1] == "1")
    (ev.send_gdr if "[send]" in path else ev.net_gdr).append(gdr)
    del ev.net_gdr[:-256], ev.send_gdr[:-256]  # bounded: the latest channels tell as much
    return True


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
