"""``python3 -m mlenv.runtime doctor``: what this node sees, each finding a check (PASS/WARN/FAIL, evidence, fix).

RDMA ports with their link layer and rate, the GID index NCCL will use, memlock, /dev/shm, GPUDirect (peer memory
or DMA-BUF), NCCL's own warnings (``nccl-env``), torch/CUDA/NCCL and driver versions, GPUs, whether the master's
name resolves and, with ``rendezvous_seconds``, whether its rendezvous port answers. ``--json`` prints it all on
one line with the facts ``mlenv doctor`` compares across nodes and this node's clock.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from .fabric.nccl import AUTO, MIN_SHM_BYTES, Concern, NcclEnv, detect_nccl_env
from .fabric.nccltestsrun import NCCL_TESTS_VARIABLE, find_tool
from .fabric.rendezvous import PortProbe, connect, serve
from .node.host import SHM_MOUNT, dmabuf_support, memlock_limit, peer_memory, shm_size, visible_gpu_count
from .node.netroute import LOOPBACK_INTERFACE, read_routes, resolve_ipv4, route_to
from .node.rdma import IPV4_MAPPED_PREFIX, Port, match_nccl_hca_filter, natural_key, scan_hcas
from .node.readfs import read_text
from .node.topology import Topology, TopologyError, detect_topology, host_name
from .records.jsonvalue import JsonObject

KIND = "mlenv-node-doctor"
"""Marks the JSON line among whatever else a remote shell prints."""
TORCH_SECONDS = 120.0
_RATE = re.compile(r"([0-9.]+) Gb/sec")
_DRIVER = re.compile(r"Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+)+)")
TORCH_PROBE = """\
import json
try:
    import torch
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
else:
    try:
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:
        nccl = None
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl, "gpus": gpus}))
"""
COVERED = frozenset({Concern.MEMLOCK, Concern.SHM})
"""What the nccl-env warnings are about that the memlock and /dev/shm checks report."""
RDMA_FIX = ("give the pods RDMA devices: network.rdma.networks and network.rdma.resources in the cluster file "
            "(mlenv doctor CLUSTER --mode rdma checks them before deploy)")

TORCH_FIX_VARIABLE = "MLENV_TORCH_FIX"
"""Where the backend that runs this doctor gets its software from, named as the fix when torch is missing (the
cluster file's field that backend really uses); without it, ``image:``."""


@dataclass(frozen=True)
class NodeCheck:
    """One finding on this node."""

    name: str
    status: str
    evidence: str
    fix: str | None = None


@dataclass(frozen=True)
class NodeExamination:
    """Every check and fact of a node: ``doctor --json``'s object (:meth:`to_json`, without the clock)."""

    host: str
    node_rank: int | None
    facts: JsonObject
    checks: tuple[NodeCheck, ...]

    def to_json(self) -> JsonObject:
        """``{"kind", "host", "node_rank", "facts", "checks": [{"name", "status", "evidence", "fix"}]}``."""
        return {"kind": KIND, "host": self.host, "node_rank": self.node_rank, "facts": self.facts,
                "checks": [asdict(check) for check in self.checks]}

    @property
    def failed(self) -> bool:
        """Whether a check failed."""
        return any(check.status == "FAIL" for check in self.checks)


@dataclass(frozen=True)
class LinkPort:
    """An ACTIVE port of a selected HCA, as NCCL will use it."""

    port: Port
    rate_gbps: float | None

    def describe(self) -> str:
        rate = f"{self.rate_gbps:g} Gb/s" if self.rate_gbps is not None else "rate unknown"
        return f"{self.port.name} {self.port.link_layer} {rate}"


def examine(environ: Mapping[str, str], *, sysfs_root: str | Path = "/sys", proc_root: str | Path = "/proc",
            rendezvous_seconds: float | None = None, python: str = sys.executable) -> NodeExamination:
    """Every check and fact of this node."""
    checks: list[NodeCheck] = []
    try:
        topology: Topology | None = detect_topology(environ)
    except TopologyError as err:
        topology = None
        checks.append(NodeCheck("topology", "FAIL", str(err), "set MLENV_NODE_RANK and MLENV_NUM_NODES "
                                                              "(mlenv sets them on every node)"))
    with ThreadPoolExecutor(max_workers=1) as pool:
        probe = _start_probe(pool, topology, rendezvous_seconds)
        versions = _torch_versions(python)
        nccl = detect_nccl_env(environ, sysfs_root=sysfs_root, proc_root=proc_root,
                               master_addr=topology.master_addr if topology else None)
        mode = environ.get("MLENV_NETWORK_MODE", "")
        links = _links(environ, nccl, sysfs_root)
        gid = _gid(environ, nccl, links)
        gpus = versions.gpus or visible_gpu_count(environ, proc_root)
        if mode == "rdma" or (not mode and links):
            checks += _rdma_checks(links, gid, sysfs_root, proc_root, gpus)
        checks += [_shm_check(proc_root), _torch_check(versions, environ), _nccl_check(nccl)]
        interface = None
        if topology is not None:
            master, interface = _master_check(topology, proc_root)
            checks.append(master)
        if probe is not None and topology is not None:
            result = probe.result()
            checks.append(NodeCheck("rendezvous port", "PASS" if result.ok else "FAIL", result.evidence,
                                    None if result.ok else f"let the nodes reach TCP port {topology.master_port} "
                                                           "of node 0 (NetworkPolicy, firewall)"))
    hcas = sorted({link.port.hca for link in links}, key=natural_key)
    layers = sorted({link.port.link_layer for link in links})
    rates = sorted({link.rate_gbps for link in links if link.rate_gbps is not None})
    facts: JsonObject = {
        "mode": mode or None, "hcas": [*hcas], "hca_count": len(hcas),
        "ports": [{"port": link.port.name, "link_layer": link.port.link_layer, "rate_gbps": link.rate_gbps}
                  for link in links],
        "link_layers": [*layers], "rates_gbps": [*rates],
        "link_gbps": sum(link.rate_gbps or 0 for link in links), "gid_type": gid.kind if gid else None,
        "interface": interface, "gpus": gpus,
        "driver": _driver(proc_root), "torch": versions.torch, "cuda": versions.cuda,
        "nccl": versions.nccl, "nccl_env": dict(nccl.env), "warnings": [*nccl.warnings],
        **_nccl_tests(environ),
    }
    return NodeExamination(host_name(environ), topology.node_rank if topology else None, facts, tuple(checks))


def _start_probe(pool: ThreadPoolExecutor, topology: Topology | None,
                 seconds: float | None) -> Future[PortProbe] | None:
    """Node 0 listens on the rendezvous port, every other node connects to it, while the other checks run."""
    if topology is None or seconds is None or topology.num_nodes < 2:
        return None
    if topology.node_rank == 0:
        return pool.submit(serve, topology.master_port, topology.num_nodes - 1, seconds)
    address = resolve_ipv4(topology.master_addr)
    if address is None:
        return pool.submit(PortProbe, False, f"{topology.master_addr} does not resolve: nothing to connect to")
    return pool.submit(connect, str(address), topology.master_port, seconds)


@dataclass(frozen=True)
class TorchVersions:
    """What a child python's torch says (:data:`TORCH_PROBE`): its version, CUDA's and NCCL's and the GPUs it sees,
    or why it cannot be imported (``error``)."""

    torch: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    gpus: int = 0
    error: str | None = None

    @classmethod
    def parse(cls, found: object) -> TorchVersions:
        """The probe's JSON answer; an ``error`` for an answer that is not one."""
        if not isinstance(found, dict):
            return cls(error="unexpected answer")
        if "error" in found:
            return cls(error=str(found["error"]))
        text = {key: None if found.get(key) is None else str(found[key]) for key in ("torch", "cuda", "nccl")}
        gpus = found.get("gpus")
        return cls(text["torch"], text["cuda"], text["nccl"], gpus if isinstance(gpus, int) else 0)


def _torch_versions(python: str) -> TorchVersions:
    """torch, its CUDA and NCCL, and the GPUs it sees, from a child ``python`` (the runtime never imports torch)."""
    try:
        done = subprocess.run([python, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=TORCH_SECONDS,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return TorchVersions(error=f"{python} -c 'import torch': {exc}")
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return TorchVersions(error=(done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1])
    return TorchVersions.parse(found)


def _links(environ: Mapping[str, str], nccl: NcclEnv, sysfs_root: str | Path) -> list[LinkPort]:
    """The ACTIVE ports of the HCAs NCCL will use (none when it will not use RDMA: NCCL_IB_DISABLE, which the env
    contract sets in tcp mode)."""
    disabled = nccl.env.get("NCCL_IB_DISABLE") or environ.get("NCCL_IB_DISABLE", "0")
    if disabled.strip() not in ("", "0"):
        return []
    hcas = scan_hcas(sysfs_root)
    spec = nccl.env.get("NCCL_IB_HCA") or environ.get("NCCL_IB_HCA", "").strip()
    chosen = set(match_nccl_hca_filter(spec, [h.name for h in hcas])) if spec else {h.name for h in hcas}
    return [LinkPort(port, _rate(hca.path / "ports" / str(port.number) / "rate"))
            for hca in hcas if hca.name in chosen for port in hca.active_ports]


def _rate(path: Path) -> float | None:
    """``ports/N/rate`` (``200 Gb/sec (4X HDR)``) in Gb/s."""
    match = _RATE.match(read_text(path) or "")
    return float(match[1]) if match else None


@dataclass(frozen=True)
class GidChoice:
    """The GID index NCCL will use on the RoCE ports ("": NCCL picks one itself), what it is there, as shown, and
    whether it is the IPv4 RoCE v2 entry on every one of them."""

    index: str
    kind: str
    good: bool


def _gid(environ: Mapping[str, str], nccl: NcclEnv, links: list[LinkPort]) -> GidChoice | None:
    """The GID index NCCL will use on the RoCE ports; None without RoCE ports."""
    roce = [link.port for link in links if link.port.is_roce]
    if not roce:
        return None
    index = nccl.env.get("NCCL_IB_GID_INDEX") or environ.get("NCCL_IB_GID_INDEX", "").strip()
    if not index or index.lower() == AUTO:
        return GidChoice("", "none", False)
    entries = [gid for port in roce for gid in port.gids if str(gid.index) == index]
    if len(entries) < len(roce):
        return GidChoice(index, "missing on some ports", False)
    kinds = {f"{gid.type} {'IPv4' if gid.value.startswith(IPV4_MAPPED_PREFIX) else 'IPv6'}" for gid in entries}
    return GidChoice(index, " / ".join(sorted(kinds)), all(gid.is_ipv4_roce_v2 for gid in entries))


def _rdma_checks(links: list[LinkPort], gid: GidChoice | None, sysfs_root: str | Path,
                 proc_root: str | Path, gpus: int) -> list[NodeCheck]:
    base = Path(sysfs_root, "class", "infiniband")
    if not links:
        found = ", ".join(f"{p.name} {p.state}" for h in scan_hcas(sysfs_root) for p in h.ports) or "none"
        return [NodeCheck("RDMA ports", "FAIL", f"no ACTIVE RDMA port NCCL may use under {base} (found: {found})",
                          RDMA_FIX)]
    total = sum(link.rate_gbps or 0 for link in links)
    checks = [NodeCheck("RDMA ports", "PASS", f"{len(links)} ACTIVE ({total:g} Gb/s in all): "
                                              f"{', '.join(link.describe() for link in links)}")]
    if gid is not None:
        ports = ", ".join(link.port.name for link in links if link.port.is_roce)
        evidence = (f"NCCL_IB_GID_INDEX={gid.index}: {gid.kind} on {ports}" if gid.index
                    else f"no IPv4 RoCE v2 GID index common to {ports}: NCCL picks one itself")
        checks.append(NodeCheck("GID index", "PASS" if gid.good else "WARN", evidence, None if gid.good else
                                "give the RoCE interfaces an IPv4 address, or set network.rdma.gid_index "
                                "(python3 -m mlenv.runtime nccl-env --explain lists the GIDs)"))
    limit = memlock_limit(proc_root)
    if limit is None:
        checks.append(NodeCheck("memlock", "WARN", f"no 'Max locked memory' in {Path(proc_root, 'self/limits')}"))
    else:
        unlimited = limit.value == "unlimited"
        checks.append(NodeCheck("memlock", "PASS" if unlimited else "FAIL",
                                f"RLIMIT_MEMLOCK {limit.value}{'' if unlimited else ' bytes'} ({limit.path})",
                                None if unlimited else "security.ipc_lock: true in the cluster file (on OpenShift "
                                                       "with the SCC of mlenv render CLUSTER --admin), or an "
                                                       "unlimited memlock ulimit in the container runtime"))
    if gpus:
        peer = peer_memory(sysfs_root)
        dmabuf, reason = (True, "") if peer else dmabuf_support(sysfs_root, proc_root)
        checks.append(NodeCheck("GPUDirect RDMA", "PASS" if dmabuf else "WARN",
                                f"peer memory: {peer}" if peer else f"DMA-BUF: {reason}" if dmabuf else
                                f"no peer memory module and no DMA-BUF ({reason}): NCCL stages GPU buffers in host "
                                "memory", None if dmabuf else "load nvidia-peermem on the hosts (GPU operator: "
                                                              "driver.rdma.enabled=true)"))
    return checks


def _shm_check(proc_root: str | Path) -> NodeCheck:
    found = shm_size(proc_root)
    if found is None:
        return NodeCheck(SHM_MOUNT, "PASS", f"no size limit on {SHM_MOUNT} in {Path(proc_root, 'mounts')}")
    evidence, size = found
    big = size >= MIN_SHM_BYTES
    return NodeCheck(SHM_MOUNT, "PASS" if big else "WARN", f"{size / (1 << 30):.2f} GiB ({evidence.path}: "
                                                             f"{evidence.value})",
                     None if big else "storage.shm_size in the cluster file (at least 1Gi; 8Gi or more for "
                                      "data loader workers)")


def _nccl_tests(environ: Mapping[str, str]) -> dict[str, str | bool | None]:
    """Where this node has NVIDIA's all_reduce_perf (network.nccl_tests, as MLENV_NCCL_TESTS says), and whether it
    was built with MPI."""
    tool = find_tool("all_reduce_perf", environ.get(NCCL_TESTS_VARIABLE, "auto"), environ)
    return {"nccl_tests": tool.path if tool else None, "nccl_tests_mpi": tool.mpi if tool else None}


def torch_fix(environ: Mapping[str, str]) -> str:
    """What to do about a node without torch: where the backend takes the launches' software from."""
    return environ.get(TORCH_FIX_VARIABLE) or "use an image with PyTorch (image: in the cluster file)"


def _torch_check(versions: TorchVersions, environ: Mapping[str, str]) -> NodeCheck:
    if versions.error is not None:
        return NodeCheck("torch", "WARN", f"torch cannot be imported: {versions.error}", torch_fix(environ))
    return NodeCheck("torch", "PASS", f"torch {versions.torch}, CUDA {versions.cuda or '-'}, "
                                      f"NCCL {versions.nccl or '-'}, {versions.gpus} GPUs visible")


def _nccl_check(nccl: NcclEnv) -> NodeCheck:
    """nccl-env's decisions, or its warnings but those the memlock and /dev/shm checks already report."""
    warnings = [w.text for w in nccl.warned if w.concern not in COVERED]
    if warnings:
        return NodeCheck("NCCL settings", "WARN", "; ".join(warnings),
                         "python3 -m mlenv.runtime nccl-env --explain on the node shows the reasoning")
    chosen = ", ".join(f"{name}={value}" for name, value in sorted(nccl.env.items())) or "nothing to set"
    return NodeCheck("NCCL settings", "PASS", f"nccl-env: {chosen}")


def _master_check(topology: Topology, proc_root: str | Path) -> tuple[NodeCheck, str | None]:
    """Whether the master's name resolves here, and the interface of the route to it (the runtime's pick)."""
    name = topology.master_addr
    address = resolve_ipv4(name)
    if address is None:
        return NodeCheck("master address", "FAIL", f"{name} does not resolve here",
                         "pod 0 must be running and published by the headless Service (publishNotReadyAddresses); "
                         f"check with: getent hosts {name}"), None
    if address.is_loopback:
        return NodeCheck("master address", "PASS", f"{name} is {address} (loopback), rendezvous port "
                                                   f"{topology.master_port}"), LOOPBACK_INTERFACE
    route = route_to(address, read_routes(proc_root))
    if route is None:
        return NodeCheck("master address", "FAIL", f"{name} is {address}, but {Path(proc_root, 'net/route')} has "
                                                   "no route to it", "check the node's network (ip route)"), None
    return NodeCheck("master address", "PASS", f"{name} is {address} (dev {route.interface}), rendezvous port "
                                               f"{topology.master_port}"), route.interface


def _driver(proc_root: str | Path) -> str | None:
    """The NVIDIA kernel driver's version, from ``<proc>/driver/nvidia/version``."""
    match = _DRIVER.search(read_text(Path(proc_root, "driver", "nvidia", "version")) or "")
    return match[1] if match else None


def render(report: NodeExamination) -> str:
    """The checks for a terminal, one per line (and its fix below it)."""
    lines = []
    for check in report.checks:
        lines.append(f"{check.status:<5} {check.name}: {check.evidence}")
        if check.fix:
            lines.append(f"      fix: {check.fix}")
    return "\n".join(lines) + "\n"
