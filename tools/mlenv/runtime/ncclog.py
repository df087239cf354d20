"""Read ``NCCL_DEBUG=INFO`` output and tell which transport NCCL really used.

Lines look like ``[prefix]host:pid:tid [cudaDev] NCCL INFO message`` (``file.cc:123 NCCL WARN`` for
warnings), interleaved across ranks. Each process is one rank; its communicator line gives the number.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

RDMA_GDR = "RDMA+GDR"
RDMA = "RDMA (no GDR)"
SOCKETS = "SOCKETS"
UNKNOWN = "UNKNOWN"
# The verdicts that contradict what the cluster file asked for.
CONTRADICTS = {"rdma": {SOCKETS}, "sockets": {RDMA_GDR, RDMA}}

_LINE = re.compile(
    r"(?P<host>[A-Za-z0-9][\w.-]*):(?P<pid>\d+):\d+ \[\d+\] "  # host:pid:tid [cudaDev]
    r"(?:\S+:\d+ )?NCCL (?P<level>INFO|WARN) (?P<msg>.*)"  # optional source file:line of a WARN
)
_VERSION = re.compile(r"NCCL version (\S+)")
_COMM_RANK = re.compile(r"\brank (\d+) n[Rr]anks (\d+)")
_NET_USING = re.compile(r"NET/(IB|Socket) ?: Using (.*)")
_USING_NETWORK = re.compile(r"Using network (\S+)")
_CHANNEL = re.compile(r"Channel \d+(?:/\d+)? : .* via (\S+)")
_DEVICE = re.compile(r"\[\d+\]([^\s;<]+)")


@dataclass
class RankReport:
    """What one process's NCCL lines say."""

    process: str  # host:pid
    rank: int | None = None
    nranks: int | None = None
    nccl_version: str | None = None
    network: str | None = None  # IB, Socket, or a plugin's name
    devices: list[str] = field(default_factory=list)  # mlx5_6:1/RoCE, eth0:10.0.0.5
    channels: Counter[str] = field(default_factory=Counter)  # "NET/IB/0/GDRDMA" -> count
    warnings: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return verdict({self.network} if self.network else set(), self.channels)

    def to_dict(self) -> dict[str, object]:
        return {
            "process": self.process,
            "rank": self.rank,
            "nranks": self.nranks,
            "nccl_version": self.nccl_version,
            "network": self.network,
            "devices": self.devices,
            "gdr": any("GDRDMA" in via for via in _net_ib(self.channels)),
            "net_channels": sum(n for via, n in self.channels.items() if via.startswith("NET/")),
            "p2p": any(via.startswith("P2P") for via in self.channels),
            "shm": any(via.startswith("SHM") for via in self.channels),
            "transports": dict(self.channels),
            "warnings": self.warnings,
            "verdict": self.verdict,
        }

    def summary(self) -> str:
        """One human line."""
        rank = "?" if self.rank is None else str(self.rank)
        parts = [f"rank {rank} ({self.process}): {self.verdict}"]
        if self.network:
            parts.append(f"network {self.network} [{', '.join(self.devices)}]")
        net = {via: n for via, n in self.channels.items() if via.startswith("NET/")}
        if net:
            gdr = sum(n for via, n in net.items() if "GDRDMA" in via)
            parts.append(f"{sum(net.values())} net channels ({gdr} GDRDMA)")
        local = sorted({via.split("/")[0] for via in self.channels} - {"NET"})
        if local:
            parts.append(f"intra-node {', '.join(local)}")
        if self.nccl_version:
            parts.append(f"NCCL {self.nccl_version}")
        return "; ".join(parts)


@dataclass
class LogReport:
    """All ranks found in the logs and the overall verdict."""

    ranks: list[RankReport]

    @property
    def verdict(self) -> str:
        networks = {r.network for r in self.ranks if r.network}
        return verdict(networks, sum((r.channels for r in self.ranks), Counter()))

    def to_dict(self) -> dict[str, object]:
        """The JSON shape of ``nccl-log-check --json``."""
        return {"verdict": self.verdict, "ranks": [r.to_dict() for r in self.ranks]}


def verdict(networks: set[str], channels: Counter[str]) -> str:
    """SOCKETS if any socket traffic; RDMA+GDR only when every NET/IB channel is GDRDMA."""
    if "Socket" in networks or any(via.startswith("NET/Socket") for via in channels):
        return SOCKETS
    ib_channels = _net_ib(channels)
    if "IB" in networks or ib_channels:
        return RDMA_GDR if ib_channels and all("GDRDMA" in via for via in ib_channels) else RDMA
    return UNKNOWN


def _net_ib(channels: Counter[str]) -> list[str]:
    return [via for via in channels if via.startswith("NET/IB")]


def parse_nccl_log(lines: Iterable[str]) -> LogReport:
    """Group NCCL lines by process and read each one's network, channels and warnings."""
    ranks: dict[str, RankReport] = {}
    for line in lines:
        match = _LINE.search(line)
        if match is None:
            continue
        process = f"{match['host']}:{match['pid']}"
        report = ranks.setdefault(process, RankReport(process))
        _read_message(report, match["level"], match["msg"].strip())
    ordered = sorted(ranks.values(), key=lambda r: (r.rank is None, r.rank or 0, r.process))
    return LogReport(ordered)


def _read_message(report: RankReport, level: str, message: str) -> None:
    if level == "WARN":
        report.warnings.append(message)
    elif channel := _CHANNEL.match(message):
        report.channels[channel[1]] += 1
    elif network := _USING_NETWORK.match(message):
        report.network = network[1]
    elif net := _NET_USING.match(message):
        report.network = report.network or net[1]
        report.devices = _DEVICE.findall(net[2])
    elif version := _VERSION.match(message):
        report.nccl_version = version[1]
    elif (comm := _COMM_RANK.search(message)) and report.rank is None:
        report.rank, report.nranks = int(comm[1]), int(comm[2])


def contradicts(found: str, expect: str) -> bool:
    """True when verdict ``found`` shows the opposite of what ``expect`` (rdma or sockets) asked for."""
    return found in CONTRADICTS[expect]
