"""How far a GPU is from an RDMA device, in the path types of ``NCCL_NET_GDR_LEVEL``.

sysfs places every PCI device in the tree it hangs in: ``<sysfs>/bus/pci/drivers/nvidia/<bdf>`` and
``<sysfs>/class/infiniband/<hca>/device`` are links into ``<sysfs>/devices/pci<domain>:<bus>/<root port>/.../<bdf>``
(in Hyper-V guests the root complex ``pci<domain>:<bus>`` sits deeper, below the VMBus device). The deepest
directory two devices share tells how far traffic between them travels:

- PIX: both hang off the same PCIe switch (or the same bridge);
- PXB: different switches below the same root port;
- PHB: different root ports or root complexes on the same NUMA node, through the CPU's host bridge;
- SYS: different NUMA nodes, across the CPU interconnect (QPI/UPI/xGMI).

NCCL uses GPUDirect RDMA between a GPU and a NIC when their distance is at most ``NCCL_NET_GDR_LEVEL``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .readfs import read_int

LEVELS = ("PIX", "PXB", "PHB", "SYS")
"""NCCL's path types from near to far (its ``LOC``, never use GDR, is no distance)."""
_ROOT_COMPLEX = re.compile(r"pci[0-9a-f]{4,}:[0-9a-f]{2}")  # Intel VMD domains have five digits
_BDF = re.compile(r"[0-9a-f]{4,}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


@dataclass(frozen=True)
class PciDevice:
    """A device and its place in the PCI tree."""

    name: str  # "0000:18:00.0" for a GPU, "mlx5_0 (0000:19:00.0)" for an HCA
    link: Path  # the sysfs entry it was found under
    tree: tuple[str, ...] | None  # its path below <sysfs>/devices: (..., "pci0000:15", "0000:15:01.0", ..., bdf)
    numa_node: int | None  # None when sysfs does not say (-1 or missing)
    root: int = 0  # where the root complex is in ``tree``

    @property
    def root_complex(self) -> tuple[str, ...]:
        """The path of its root complex (host bridge); empty when not in the PCI tree."""
        return self.tree[: self.root + 1] if self.tree else ()


@dataclass(frozen=True)
class Distance:
    """Where the paths of a GPU and an HCA meet, and what NCCL calls that distance."""

    gpu: PciDevice
    hca: PciDevice
    level: str
    ancestor: Path | None  # the deepest directory they share; None when a PCI path is unknown
    reason: str

    @property
    def rank(self) -> int:
        return LEVELS.index(self.level)

    def describe(self) -> str:
        where = f"common ancestor {self.ancestor}" if self.ancestor else "no common ancestor known"
        return f"GPU {self.gpu.name} -> {self.hca.name}: {self.level}, {where} ({self.reason})"


def pci_device(name: str, link: Path, sysfs_root: str | Path) -> PciDevice:
    """The device behind ``link``, placed in ``<sysfs_root>/devices``."""
    target = link.resolve()
    try:
        parts = target.relative_to(Path(sysfs_root, "devices").resolve()).parts
    except ValueError:
        parts = ()
    root = max((i for i, part in enumerate(parts) if _ROOT_COMPLEX.fullmatch(part)), default=len(parts))
    in_tree = len(parts) - root >= 2 and all(map(_BDF.fullmatch, parts[root + 1:]))
    node = read_int(target / "numa_node")
    numa_node = node if node is not None and node >= 0 else None
    return PciDevice(name, link, parts if in_tree else None, numa_node, root)


def distance(gpu: PciDevice, hca: PciDevice, sysfs_root: str | Path) -> Distance:
    """How far apart ``gpu`` and ``hca`` are, from their PCI paths, else from their NUMA nodes."""
    devices = Path(sysfs_root, "devices")
    if gpu.tree is None or hca.tree is None:
        unknown = gpu if gpu.tree is None else hca
        return _by_numa(gpu, hca, None, f"{unknown.link} is not a link into {devices}")
    common = _common_prefix(gpu.tree, hca.tree)
    ancestor = devices.joinpath(*common)
    if gpu.root_complex != hca.root_complex:
        names = f"{gpu.root_complex[-1]} and {hca.root_complex[-1]}"
        return _by_numa(gpu, hca, ancestor, f"different root complexes {names}")
    if common == gpu.root_complex:
        return Distance(gpu, hca, "PHB", ancestor, f"different root ports of {common[-1]}, through its host bridge")
    if gpu.tree[:-1] == hca.tree[:-1] or gpu.tree[:-2] == hca.tree[:-2]:
        return Distance(gpu, hca, "PIX", ancestor, "same PCIe switch")
    return Distance(gpu, hca, "PXB", ancestor, f"different PCIe switches below root port {common[gpu.root + 1]}")


def nearest(gpu: PciDevice, hcas: Sequence[PciDevice], sysfs_root: str | Path) -> Distance:
    """The HCA closest to ``gpu`` (the first of equals), which NCCL would pair it with."""
    return min((distance(gpu, hca, sysfs_root) for hca in hcas), key=lambda d: d.rank)


def _by_numa(gpu: PciDevice, hca: PciDevice, ancestor: Path | None, where: str) -> Distance:
    """Devices in different root complexes (or of unknown place): their NUMA nodes decide PHB or SYS."""
    if gpu.numa_node is None or hca.numa_node is None:
        return Distance(gpu, hca, "SYS", ancestor, f"{where}; NUMA node unknown")
    if gpu.numa_node == hca.numa_node:
        return Distance(gpu, hca, "PHB", ancestor, f"{where}, both on NUMA node {gpu.numa_node}")
    return Distance(gpu, hca, "SYS", ancestor, f"{where}, NUMA nodes {gpu.numa_node} and {hca.numa_node}")


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    length = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return a[:length]
