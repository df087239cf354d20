"""Host facts that decide NCCL settings and warnings: GPUs, GPUDirect support, memlock, /dev/shm."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .pcitopo import PciDevice, pci_device
from .readfs import read_int, read_text

PEER_MEMORY_PATHS = ("kernel/mm/memory_peers/nv_mem", "module/nvidia_peermem", "module/nv_peer_mem")
NVIDIA_TAINT = "module/nvidia/taint"
DMABUF_MIN_KERNEL = (5, 12)
SHM_MOUNT = "/dev/shm"  # noqa: S108 - read, never written


@dataclass(frozen=True)
class FileFact:
    """A fact and the file it was read from."""

    path: Path
    value: str


def gpu_numa_nodes(sysfs_root: str | Path) -> dict[str, int]:
    """NUMA node of every GPU bound to the nvidia driver, by PCI address (unknown nodes left out)."""
    driver = Path(sysfs_root, "bus", "pci", "drivers", "nvidia")
    if not driver.is_dir():
        return {}
    nodes = {entry.name: read_int(entry / "numa_node") for entry in driver.iterdir() if ":" in entry.name}
    return {address: node for address, node in sorted(nodes.items()) if node is not None and node >= 0}


def gpu_devices(sysfs_root: str | Path, proc_root: str | Path) -> list[PciDevice]:
    """GPUs bound to the nvidia driver; in a container only its own, which the NVIDIA container runtime
    lists under ``<proc>/driver/nvidia/gpus`` (sysfs shows every GPU of the host)."""
    driver = Path(sysfs_root, "bus", "pci", "drivers", "nvidia")
    addresses = sorted(e.name for e in driver.iterdir() if ":" in e.name) if driver.is_dir() else []
    given = Path(proc_root, "driver", "nvidia", "gpus")
    if given.is_dir():
        mine = {entry.name.lower() for entry in given.iterdir()}
        addresses = [address for address in addresses if address in mine]
    return [pci_device(address, driver / address, sysfs_root) for address in addresses]


def visible_gpu_count(environ: Mapping[str, str], proc_root: str | Path) -> int:
    """GPUs this container may use: ``CUDA_VISIBLE_DEVICES`` if set, else the driver's list."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    gpus = Path(proc_root, "driver", "nvidia", "gpus")
    return len(list(gpus.iterdir())) if gpus.is_dir() else 0


def peer_memory(sysfs_root: str | Path) -> Path | None:
    """Where GPUDirect peer memory (nv_peer_mem / nvidia_peermem) shows up, if it does."""
    for relative in PEER_MEMORY_PATHS:
        path = Path(sysfs_root, relative)
        if path.exists():
            return path
    return None


def dmabuf_support(sysfs_root: str | Path, proc_root: str | Path) -> tuple[bool, str]:
    """Whether the NIC can reach GPU memory through DMA-BUF, and why: it takes NVIDIA's open kernel module
    (the proprietary one taints the kernel with ``P`` and exports no DMA-BUF) and Linux 5.12 or later."""
    taint_path = Path(sysfs_root, NVIDIA_TAINT)
    taint = read_text(taint_path)
    if taint is None:
        return False, f"{taint_path} missing: no nvidia kernel module to tell"
    if "P" in taint:
        return False, f"{taint_path} = {taint}: the proprietary nvidia kernel module, which cannot export DMA-BUF"
    release_path = Path(proc_root, "sys", "kernel", "osrelease")
    release = read_text(release_path) or ""
    version = re.match(r"(\d+)\.(\d+)", release)
    if version and (int(version[1]), int(version[2])) < DMABUF_MIN_KERNEL:
        return False, f"{release_path} = {release}: DMA-BUF for RDMA needs Linux 5.12 or later"
    return True, f"{taint_path} = {taint or '(empty)'}: NVIDIA's open kernel module"


def memlock_limit(proc_root: str | Path) -> FileFact | None:
    """Soft RLIMIT_MEMLOCK of this process (``unlimited`` or bytes), from ``<proc>/self/limits``."""
    path = Path(proc_root, "self", "limits")
    for line in (read_text(path) or "").splitlines():
        if line.startswith("Max locked memory"):
            return FileFact(path, line.split()[3])
    return None


def shm_size(proc_root: str | Path) -> tuple[FileFact, int] | None:
    """Size in bytes of the /dev/shm mount when the mount sets one, from ``<proc>/mounts``."""
    path = Path(proc_root, "mounts")
    for line in (read_text(path) or "").splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[1] != SHM_MOUNT:
            continue
        for option in fields[3].split(","):
            size = _parse_size(option.removeprefix("size=")) if option.startswith("size=") else None
            if size is not None:
                return FileFact(path, option), size
    return None


def _parse_size(text: str) -> int | None:
    """tmpfs ``size=`` option in bytes: ``65536k``, ``1g``, ``2147483648``; None for ``50%``."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    number, multiplier = (text[:-1], units[text[-1].lower()]) if text[-1:].lower() in units else (text, 1)
    return int(number) * multiplier if number.isdigit() else None
