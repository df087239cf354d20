"""NCCL and Gloo settings from the machine itself: RDMA devices, RoCE GID index, socket interface.

Variables already in the environment (the cluster file's ``nccl`` section) always win; detection
fills the rest and explains every decision with the file and value behind it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from ipaddress import IPv4Address
from pathlib import Path

from ..node.host import (
    PEER_MEMORY_PATHS,
    SHM_MOUNT,
    dmabuf_support,
    gpu_devices,
    gpu_numa_nodes,
    memlock_limit,
    peer_memory,
    shm_size,
)
from ..node.netroute import LOOPBACK_INTERFACE, read_routes, resolve_ipv4, route_to
from ..node.pcitopo import PciDevice, nearest, pci_device
from ..node.rdma import Hca, Port, allocated_pci_addresses, match_nccl_hca_filter, scan_hcas

MIN_SHM_BYTES = 1 << 30
AUTO = "auto"
"""A value that asks for detection (the cluster file's ``gdr_level: auto``); never passed on to NCCL."""


class Concern(Enum):
    """What a warning is about: the host limits (MEMLOCK, SHM) have checks of their own in the node doctor."""

    SETTINGS = "settings"
    MEMLOCK = "memlock"
    SHM = "shm"


@dataclass(frozen=True)
class NcclWarning:
    """One warning and what it is about."""

    text: str
    concern: Concern = Concern.SETTINGS


@dataclass
class NcclEnv:
    """Variables to set, ``auto`` ones to remove, warnings about what will break or slow training, and the
    reasoning."""

    env: dict[str, str] = field(default_factory=dict)
    unset: list[str] = field(default_factory=list)
    warned: list[NcclWarning] = field(default_factory=list)
    explain: list[str] = field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        """The warnings' text, in the order they were made."""
        return [warning.text for warning in self.warned]

    def to_dict(self) -> dict[str, object]:
        """The JSON shape of ``nccl-env --json``."""
        return {"env": self.env, "unset": self.unset, "warnings": self.warnings}


class _Decisions:
    """Collects decisions; a variable already in the environment is kept and only noted, unless it says ``auto``."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.result = NcclEnv()

    def set(self, name: str, value: str, evidence: str) -> None:
        if name in self.environ and not _is_auto(self.environ[name]):
            self.note(f"{name}={self.environ[name]}: kept from the environment (detection says {value})")
        else:
            self.result.env[name] = value
            self.note(f"{name}={value}: {evidence}")

    def warn(self, message: str, concern: Concern = Concern.SETTINGS) -> None:
        self.result.warned.append(NcclWarning(message, concern))
        self.note(f"warning: {message}")

    def note(self, message: str) -> None:
        self.result.explain.append(message)


def detect_nccl_env(
    environ: Mapping[str, str],
    *,
    sysfs_root: str | Path = "/sys",
    proc_root: str | Path = "/proc",
    master_addr: str | None = None,
) -> NcclEnv:
    """Decide the NCCL/Gloo variables for this node; ``master_addr`` picks the socket interface."""
    decisions = _Decisions(environ)
    hcas = _select_hcas(decisions, sysfs_root)
    if hcas:
        _gid_index(decisions, [p for h in hcas for p in h.active_ports])
        _gpudirect(decisions, hcas, sysfs_root, proc_root)
        _rdma_host_warnings(decisions, hcas, sysfs_root, proc_root)
    _socket_interface(decisions, proc_root, master_addr)
    _shm_warning(decisions, proc_root)
    _unresolved_auto(decisions)
    return decisions.result


def _is_auto(value: str) -> bool:
    return value.strip().lower() == AUTO


def _select_hcas(d: _Decisions, sysfs_root: str | Path) -> list[Hca]:
    """RDMA devices NCCL should use; sets NCCL_IB_HCA, or NCCL_IB_DISABLE when there are none. Whether the mode
    allows RDMA at all is the env contract's NCCL_IB_DISABLE (``mlenv.plan.nccl_env``: 1 in tcp mode), kept here."""
    if d.environ.get("NCCL_IB_DISABLE", "0").strip() not in ("", "0"):
        d.note(f"NCCL_IB_DISABLE={d.environ['NCCL_IB_DISABLE']}: kept from the environment, no RDMA")
        return []
    mode = d.environ.get("MLENV_NETWORK_MODE", "")
    candidates = _allocated(d, scan_hcas(sysfs_root))
    spec = d.environ.get("NCCL_IB_HCA", "").strip()
    if spec:
        return _configured_hcas(d, spec, candidates)
    _warn_down_ports(d, candidates)
    active = [h for h in candidates if h.active_ports]
    if not active:
        d.set("NCCL_IB_DISABLE", "1", f"no ACTIVE RDMA port under {Path(sysfs_root, 'class', 'infiniband')}")
        if mode == "rdma":
            d.warn("the cluster file asks for RDMA but no RDMA port is ACTIVE here: NCCL will use sockets")
        return []
    return _choose_hcas(d, active)


def _configured_hcas(d: _Decisions, spec: str, candidates: list[Hca]) -> list[Hca]:
    """The ACTIVE devices that the environment's NCCL_IB_HCA selects."""
    wanted = set(match_nccl_hca_filter(spec, [h.name for h in candidates]))
    _warn_down_ports(d, [h for h in candidates if h.name in wanted])
    chosen = [h for h in candidates if h.name in wanted and h.active_ports]
    if not chosen:
        available = ", ".join(h.name for h in candidates if h.active_ports) or "none"
        d.warn(f"NCCL_IB_HCA={spec} matches no ACTIVE RDMA device here (ACTIVE: {available})")
    selected = ", ".join(h.name for h in chosen) or "nothing"
    d.note(f"NCCL_IB_HCA={spec}: kept from the environment, selects {selected}")
    return chosen


def _warn_down_ports(d: _Decisions, hcas: list[Hca]) -> None:
    down = [f"{p.name} {p.state}" for h in hcas for p in h.ports if not p.active]
    if down:
        d.warn(f"RDMA ports not ACTIVE, NCCL cannot use them: {', '.join(down)}")


def _choose_hcas(d: _Decisions, active: list[Hca]) -> list[Hca]:
    """Every ACTIVE HCA, but only the InfiniBand ones when there are (Ethernet ones serve storage)."""
    infiniband = [h for h in active if any(p.link_layer == "InfiniBand" for p in h.active_ports)]
    if infiniband and len(infiniband) < len(active):
        left_out = ", ".join(h.name for h in active if h not in infiniband)
        d.note(f"InfiniBand HCAs present: leaving out the Ethernet ones ({left_out})")
        active = infiniband
    ports = ", ".join(p.name for h in active for p in h.active_ports)
    evidence = f"ACTIVE in {active[0].path.parent}/*/ports/*/state: {ports}"
    d.set("NCCL_IB_HCA", "=" + ",".join(h.name for h in active), evidence)
    return active


def _allocated(d: _Decisions, hcas: list[Hca]) -> list[Hca]:
    """On SR-IOV pods, the devices the device plugin allocated (``PCIDEVICE_*``); else all."""
    allocation = allocated_pci_addresses(d.environ)
    if not allocation:
        return hcas
    addresses = set().union(*allocation.values())
    mine = [h for h in hcas if h.pci_address in addresses]
    variables = ", ".join(sorted(allocation))
    if not mine:
        d.note(f"{variables}: no RDMA device has these PCI addresses; considering every RDMA device")
        return hcas
    devices = ", ".join(f"{h.name} ({h.pci_address})" for h in mine)
    d.note(f"{variables}: the device plugin allocated {devices}")
    return mine


def _gid_index(d: _Decisions, active_ports: list[Port]) -> None:
    """NCCL_IB_GID_INDEX: the IPv4 RoCE v2 entry, identical on every selected RoCE port."""
    for port in active_ports:
        if not port.is_roce:
            d.note(f"{port.name} is {port.link_layer}: no GID index needed")
    ports = [p for p in active_ports if p.is_roce]
    if not ports:
        return
    usable = {p.name: p.ipv4_roce_v2_indices() for p in ports}
    listing = "; ".join(f"{name}: {', '.join(map(str, idx)) or 'none'}" for name, idx in usable.items())
    configured = d.environ.get("NCCL_IB_GID_INDEX", "").strip()
    if configured:
        wrong = [name for name, idx in usable.items() if configured not in map(str, idx)]
        if wrong:
            d.warn(f"NCCL_IB_GID_INDEX={configured} is not an IPv4 RoCE v2 GID on {', '.join(wrong)} "
                   f"(IPv4 RoCE v2 indices: {listing}): NCCL may fail to connect")
    missing = [name for name, idx in usable.items() if not idx]
    if missing:
        d.warn(f"no IPv4 RoCE v2 GID on {', '.join(missing)} (does the port have an IPv4 address?): "
               "NCCL_IB_GID_INDEX left to NCCL")
        return
    common = set.intersection(*(set(idx) for idx in usable.values()))
    if not common:
        d.warn(f"the HCAs disagree on the IPv4 RoCE v2 GID index ({listing}): NCCL_IB_GID_INDEX left to NCCL")
        return
    index = min(common)
    gid = next(g for g in ports[0].gids if g.index == index)
    same = f"; the same index on {', '.join(usable)}" if len(ports) > 1 else ""
    d.set("NCCL_IB_GID_INDEX", str(index), f"{gid.path} = {gid.value}, {gid.type_path} = {gid.type}{same}")


def _gpudirect(d: _Decisions, hcas: list[Hca], sysfs_root: str | Path, proc_root: str | Path) -> None:
    """GPUDirect RDMA (peer memory, else DMA-BUF) and NCCL_NET_GDR_LEVEL from the GPUs' distance to the HCAs."""
    gpus = gpu_devices(sysfs_root, proc_root)
    if not gpus:
        d.note(f"no GPU under {Path(sysfs_root, 'bus/pci/drivers/nvidia')}: GPUDirect RDMA not considered")
        return
    support = _gdr_support(d, sysfs_root, proc_root)
    if support is not None:
        _gdr_level(d, gpus, hcas, sysfs_root, support)


def _gdr_support(d: _Decisions, sysfs_root: str | Path, proc_root: str | Path) -> str | None:
    """How GPU memory reaches the NIC: peer memory, else DMA-BUF (sets NCCL_DMABUF_ENABLE); None: it cannot."""
    peer = peer_memory(sysfs_root)
    if peer is not None:
        return f"{peer} exists (GPUDirect peer memory)"
    searched = ", ".join(str(Path(sysfs_root, p)) for p in PEER_MEMORY_PATHS)
    dmabuf, reason = dmabuf_support(sysfs_root, proc_root)
    if dmabuf:
        d.set("NCCL_DMABUF_ENABLE", "1", f"no GPUDirect peer memory ({searched} missing); {reason}: GDR via DMA-BUF")
        return f"DMA-BUF ({reason})"
    d.warn(f"no GPUDirect RDMA: no peer memory module ({searched} missing) and no DMA-BUF ({reason}); "
           "NCCL will stage GPU buffers in host memory, NCCL_NET_GDR_LEVEL not set")
    return None


def _gdr_level(d: _Decisions, gpus: list[PciDevice], hcas: list[Hca], sysfs_root: str | Path, support: str) -> None:
    """NCCL_NET_GDR_LEVEL: the smallest level that lets every GPU use GDR with its nearest HCA."""
    devices = [pci_device(f"{h.name} ({h.pci_address or 'no PCI address'})", h.path / "device", sysfs_root)
               for h in hcas]
    pairs = [nearest(gpu, devices, sysfs_root) for gpu in gpus]
    for pair in pairs:
        d.note(pair.describe())
    farthest = max(pairs, key=lambda pair: pair.rank)
    d.set("NCCL_NET_GDR_LEVEL", farthest.level, f"{support}; {farthest.level} covers every GPU's nearest HCA "
          f"(farthest: GPU {farthest.gpu.name} -> {farthest.hca.name})")


def _rdma_host_warnings(
    d: _Decisions, hcas: list[Hca], sysfs_root: str | Path, proc_root: str | Path
) -> None:
    """Locked-memory limit and NUMA placement, which make RDMA fail or crawl."""
    limit = memlock_limit(proc_root)
    if limit is not None and limit.value != "unlimited":
        d.warn(f"RLIMIT_MEMLOCK is {limit.value} bytes, not unlimited ({limit.path}): RDMA memory "
               "registration will fail; give the container IPC_LOCK and an unlimited memlock limit", Concern.MEMLOCK)
    gpu_nodes = sorted(set(gpu_numa_nodes(sysfs_root).values()))
    for hca in hcas:
        if gpu_nodes and hca.numa_node is not None and hca.numa_node >= 0 and hca.numa_node not in gpu_nodes:
            d.warn(f"{hca.name} is on NUMA node {hca.numa_node} but the GPUs are on {gpu_nodes} "
                   f"({hca.path / 'device' / 'numa_node'}): its traffic crosses the CPU interconnect")


def _socket_interface(d: _Decisions, proc_root: str | Path, master_addr: str | None) -> None:
    """NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME: the one interface that routes to the master."""
    gloo = d.environ.get("GLOO_SOCKET_IFNAME", "")
    if gloo.startswith("^") or "," in gloo:
        d.warn(f"GLOO_SOCKET_IFNAME={gloo} is a pattern or a list; Gloo needs one interface name")
    address, target = _resolve_master(d, master_addr)
    if address is not None and address.is_loopback:
        interface, evidence = LOOPBACK_INTERFACE, f"{target} is a loopback address"
    else:
        routes_file = Path(proc_root, "net", "route")
        route = route_to(address, read_routes(proc_root))
        if route is None:
            d.warn(f"no route to {target} in {routes_file}: NCCL and Gloo will pick an interface themselves")
            return
        interface, evidence = route.interface, f"{routes_file}: {route.describe()} reaches {target}"
    for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        d.set(name, interface, evidence)


def _resolve_master(d: _Decisions, master_addr: str | None) -> tuple[IPv4Address | None, str]:
    """The master's IPv4 address (None: use the default route) and how to name it in messages."""
    address = resolve_ipv4(master_addr) if master_addr else None
    if address is None:
        if master_addr:
            d.warn(f"cannot resolve the master address {master_addr}: using the default route's interface")
        return None, "the default route"
    shown = master_addr if str(address) == master_addr else f"{master_addr} ({address})"
    return address, f"master {shown}"


def _shm_warning(d: _Decisions, proc_root: str | Path) -> None:
    found = shm_size(proc_root)
    if found is not None and found[1] < MIN_SHM_BYTES:
        evidence, size = found
        d.warn(f"{SHM_MOUNT} is only {size >> 20} MiB ({evidence.path}: {evidence.value}): NCCL and data "
               f"loader workers need more; mount a memory-backed volume of at least 1 GiB on {SHM_MOUNT}", Concern.SHM)


def _unresolved_auto(d: _Decisions) -> None:
    """``auto`` values that detection did not replace are removed, so that NCCL never reads ``auto``."""
    for name, value in d.environ.items():
        if name.startswith("NCCL_") and _is_auto(value) and name not in d.result.env:
            d.result.unset.append(name)
            d.note(f"{name}={value}: nothing detected, removed so that NCCL uses its own default")
