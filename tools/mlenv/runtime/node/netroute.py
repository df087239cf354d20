"""Which interface reaches an address, from ``<proc>/net/route`` (IPv4 main routing table)."""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from .readfs import read_text

RTF_UP = 0x1
LOOPBACK_INTERFACE = "lo"


@dataclass(frozen=True)
class Route:
    """One line of ``/proc/net/route``."""

    interface: str
    network: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address | None
    metric: int

    def describe(self) -> str:
        via = f" via {self.gateway}" if self.gateway else ""
        return f"{self.network}{via} dev {self.interface} metric {self.metric}"


def read_routes(proc_root: str | Path) -> list[Route]:
    """Usable (RTF_UP) routes of ``<proc_root>/net/route``."""
    routes = []
    for line in (read_text(Path(proc_root, "net", "route")) or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8 or not int(fields[3], 16) & RTF_UP:
            continue
        destination, gateway, mask = (_hex_address(fields[i]) for i in (1, 2, 7))
        network = ipaddress.IPv4Network(f"{destination}/{mask}", strict=False)
        routes.append(Route(fields[0], network, None if int(gateway) == 0 else gateway, int(fields[6])))
    return routes


def _hex_address(text: str) -> ipaddress.IPv4Address:
    """The kernel prints addresses as hex in host byte order."""
    return ipaddress.IPv4Address(socket.inet_ntoa(struct.pack("=I", int(text, 16))))


def route_to(address: ipaddress.IPv4Address | None, routes: list[Route]) -> Route | None:
    """The route the kernel would pick: longest prefix, then lowest metric; None address = default route."""
    if address is None:
        matching = [r for r in routes if r.network.prefixlen == 0]
    else:
        matching = [r for r in routes if address in r.network]
    return max(matching, key=lambda r: (r.network.prefixlen, -r.metric), default=None)


def resolve_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """IPv4 address of a host name or literal, or None when it does not resolve (yet)."""
    try:
        return ipaddress.IPv4Address(host)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    return ipaddress.IPv4Address(infos[0][4][0]) if infos else None
