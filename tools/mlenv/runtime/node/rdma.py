"""RDMA devices as sysfs shows them: HCAs, ports, link layers and GID tables."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .readfs import read_int, read_text

IPV4_MAPPED_PREFIX = "0000:0000:0000:0000:0000:ffff:"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
ROCE_V2 = "RoCE v2"
_PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")


@dataclass(frozen=True)
class Gid:
    """One populated entry of a port's GID table."""

    index: int
    value: str
    type: str | None  # "RoCE v2", "IB/RoCE v1"; None when the type file is unreadable
    path: Path

    @property
    def type_path(self) -> Path:
        return _type_path(self.path)

    @property
    def is_ipv4_roce_v2(self) -> bool:
        """True for the entry NCCL needs on RoCE: RoCE v2 over an IPv4-mapped address."""
        return self.type == ROCE_V2 and self.value.startswith(IPV4_MAPPED_PREFIX)


@dataclass(frozen=True)
class Port:
    """One port of an HCA."""

    hca: str
    number: int
    state: str  # ACTIVE, DOWN, INIT, ...
    link_layer: str  # Ethernet (RoCE) or InfiniBand
    gids: tuple[Gid, ...]

    @property
    def name(self) -> str:
        """``mlx5_6:1``, as NCCL writes it."""
        return f"{self.hca}:{self.number}"

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def is_roce(self) -> bool:
        return self.link_layer == "Ethernet"

    def ipv4_roce_v2_indices(self) -> list[int]:
        """GID indices usable by NCCL over RoCE v2 with IPv4."""
        return [gid.index for gid in self.gids if gid.is_ipv4_roce_v2]


@dataclass(frozen=True)
class Hca:
    """An RDMA device under ``<sysfs>/class/infiniband``."""

    name: str
    pci_address: str | None
    numa_node: int | None
    ports: tuple[Port, ...]
    path: Path

    @property
    def active_ports(self) -> list[Port]:
        return [port for port in self.ports if port.active]


def natural_key(name: str) -> tuple[object, ...]:
    """Sort key that puts ``mlx5_2`` before ``mlx5_10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def scan_hcas(sysfs_root: str | Path) -> list[Hca]:
    """Every RDMA device under ``<sysfs_root>/class/infiniband``, in natural name order."""
    base = Path(sysfs_root, "class", "infiniband")
    if not base.is_dir():
        return []
    devices = sorted(base.iterdir(), key=lambda p: natural_key(p.name))
    return [_read_hca(path) for path in devices]


def _read_hca(path: Path) -> Hca:
    ports_dir = path / "ports"
    port_dirs = sorted(ports_dir.iterdir(), key=lambda p: natural_key(p.name)) if ports_dir.is_dir() else []
    return Hca(
        name=path.name,
        pci_address=_pci_address(path / "device"),
        numa_node=read_int(path / "device" / "numa_node"),
        ports=tuple(_read_port(path.name, p) for p in port_dirs if p.name.isdigit()),
        path=path,
    )


def _pci_address(device: Path) -> str | None:
    """PCI address from the device's uevent, else from where the ``device`` link points."""
    for line in (read_text(device / "uevent") or "").splitlines():
        key, _, value = line.partition("=")
        if key == "PCI_SLOT_NAME":
            return value.lower()
    target = device.resolve().name
    return target.lower() if _PCI_ADDRESS.fullmatch(target) else None


def _read_port(hca: str, path: Path) -> Port:
    state = read_text(path / "state") or "UNKNOWN"  # "4: ACTIVE"
    return Port(
        hca=hca,
        number=int(path.name),
        state=state.partition(":")[2].strip() or state,
        link_layer=read_text(path / "link_layer") or "unknown",
        gids=tuple(_read_gids(path)),
    )


def _read_gids(port: Path) -> Iterable[Gid]:
    gids_dir = port / "gids"
    if not gids_dir.is_dir():
        return
    for entry in sorted(gids_dir.iterdir(), key=lambda p: natural_key(p.name)):
        value = read_text(entry)
        if not entry.name.isdigit() or not value or value == ZERO_GID:
            continue
        yield Gid(int(entry.name), value, read_text(_type_path(entry)) or None, entry)


def _type_path(gid_path: Path) -> Path:
    """``ports/N/gid_attrs/types/<i>``, the type of ``ports/N/gids/<i>``."""
    return gid_path.parent.parent / "gid_attrs" / "types" / gid_path.name


def allocated_pci_addresses(environ: Mapping[str, str]) -> dict[str, set[str]]:
    """PCI addresses the device plugins gave this pod, by ``PCIDEVICE_*`` variable.

    The SR-IOV device plugin sets ``PCIDEVICE_<RESOURCE>=addr,addr`` and, with the device-info
    spec, ``PCIDEVICE_<RESOURCE>_INFO={"addr": {...}}``.
    """
    found: dict[str, set[str]] = {}
    for name, value in environ.items():
        if not name.startswith("PCIDEVICE_"):
            continue
        candidates: Iterable[str] = value.split(",")
        if name.endswith("_INFO"):
            try:
                info = json.loads(value)
            except ValueError:
                continue
            candidates = info.keys() if isinstance(info, dict) else ()
        addresses = {c.strip().lower() for c in candidates if _PCI_ADDRESS.fullmatch(c.strip())}
        if addresses:
            found[name] = addresses
    return found


def match_nccl_hca_filter(spec: str, names: Iterable[str]) -> list[str]:
    """Names that NCCL would pick for ``NCCL_IB_HCA=spec`` (``^`` excludes, ``=`` matches exactly)."""
    exclude = spec.startswith("^")
    spec = spec.removeprefix("^")
    exact = spec.startswith("=")
    wanted = [item.split(":")[0] for item in spec.removeprefix("=").split(",") if item]

    def listed(name: str) -> bool:
        return any(name == w if exact else name.startswith(w) for w in wanted)

    return [name for name in names if listed(name) != exclude]
