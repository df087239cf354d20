"""Before an rdma-mode job starts: is there a network NCCL can use without falling back to sockets?

A verbs fabric (InfiniBand, RoCE: the file names HCAs through ``NCCL_IB_HCA``, the device plugin allocated some
through ``PCIDEVICE_*``, or sysfs shows RDMA devices) needs an ACTIVE port, else NCCL runs over sockets: the job
is refused with the ports' states as evidence. Fabrics that NCCL reaches through a network plugin (EFA and
Slingshot/CXI through OFI) have no verbs port; there the plugin library must be found (``NCCL_NET_PLUGIN``, else
any ``libnccl-net*.so`` on the library path), and a warning says when it cannot be told.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..node.rdma import Hca, allocated_pci_addresses, match_nccl_hca_filter, scan_hcas

SYSTEM_LIBRARY_DIRS = ("/usr/local/lib", "/usr/lib64", "/usr/lib", "/usr/lib/x86_64-linux-gnu",
                       "/usr/lib/aarch64-linux-gnu", "/opt/amazon/ofi-nccl/lib", "/opt/amazon/ofi-nccl/lib64")
_NCCL_OWN_NETS = ("ib", "socket")


@dataclass
class Preflight:
    """``refusal``: why the job must not start (None: it may); ``warnings`` and ``notes`` for the user."""

    refusal: str | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def library_dirs(environ: Mapping[str, str]) -> list[str]:
    """Where the dynamic loader looks for a plugin: ``LD_LIBRARY_PATH``, then the usual system directories."""
    return [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d] + list(SYSTEM_LIBRARY_DIRS)


def rdma_preflight(environ: Mapping[str, str], *, sysfs_root: str | Path, lib_dirs: Sequence[str]) -> Preflight:
    """What this node has for rdma mode; a ``refusal`` when a verbs fabric has no ACTIVE port."""
    result = Preflight()
    plugin = _plugin_wanted(environ)
    hcas = scan_hcas(sysfs_root)
    if plugin is not None:
        _check_plugin(result, plugin, environ, lib_dirs)
        return result
    declared = _declared_hcas(environ, hcas)
    if declared is None and not hcas:
        found = _plugin_libraries(lib_dirs, None)
        if found:
            result.notes.append(f"no RDMA device in {Path(sysfs_root, 'class', 'infiniband')}; network plugin "
                                f"{found[0]} found: NCCL reaches the fabric through it")
        else:
            result.warnings.append(f"cannot tell which RDMA fabric NCCL will use: no RDMA device in "
                                   f"{Path(sysfs_root, 'class', 'infiniband')} and no libnccl-net*.so in "
                                   f"{':'.join(lib_dirs)}; NCCL will likely use sockets")
        return result
    candidates = declared if declared is not None else hcas
    if any(h.active_ports for h in candidates):
        active = ", ".join(p.name for h in candidates for p in h.active_ports)
        result.notes.append(f"RDMA ports ACTIVE: {active}")
        return result
    result.refusal = _no_active_port(candidates, hcas, sysfs_root, environ)
    return result


def _plugin_wanted(environ: Mapping[str, str]) -> str | None:
    """The plugin the environment asks NCCL for: ``NCCL_NET_PLUGIN``, or ``NCCL_NET`` naming a plugin's network
    (not NCCL's own IB or Socket); "" when only the network is named."""
    plugin = environ.get("NCCL_NET_PLUGIN", "").strip()
    if plugin and plugin.lower() != "none":
        return plugin
    net = environ.get("NCCL_NET", "").strip()
    if net and net.lower() not in _NCCL_OWN_NETS:
        return ""
    return None


def _check_plugin(result: Preflight, plugin: str, environ: Mapping[str, str], lib_dirs: Sequence[str]) -> None:
    found = _plugin_libraries(lib_dirs, plugin or None)
    wanted = f"NCCL_NET_PLUGIN={plugin}" if plugin else f"NCCL_NET={environ.get('NCCL_NET', '')}"
    if found:
        result.notes.append(f"{wanted}: network plugin {found[0]}")
    else:
        names = ", ".join(_plugin_names(plugin or None))
        result.warnings.append(f"{wanted}: cannot find {names} in {':'.join(lib_dirs)} (nor is it a path); if NCCL "
                               "cannot load it, it falls back to sockets")


def _plugin_names(plugin: str | None) -> list[str]:
    """The library names NCCL tries for ``NCCL_NET_PLUGIN`` (any ``libnccl-net*.so`` when None)."""
    if plugin is None:
        return ["libnccl-net*.so"]
    if ".so" in plugin:
        return [plugin]
    return [f"libnccl-net-{plugin}.so", f"libnccl-net_{plugin}.so", "libnccl-net.so"]


def _plugin_libraries(lib_dirs: Sequence[str], plugin: str | None) -> list[str]:
    """Plugin libraries present: ``plugin`` as NCCL resolves it (a path, or a name in ``lib_dirs``)."""
    if plugin and os.sep in plugin:
        return [plugin] if Path(plugin).is_file() else []
    found = []
    for directory in lib_dirs:
        base = Path(directory)
        if not base.is_dir():
            continue
        if plugin is None:
            found += [str(p) for p in sorted(base.glob("libnccl-net*.so*")) if p.is_file()]
        else:
            found += [str(base / n) for n in _plugin_names(plugin) if (base / n).is_file()]
    return found


def _declared_hcas(environ: Mapping[str, str], hcas: list[Hca]) -> list[Hca] | None:
    """The HCAs the cluster file or the device plugin named for this node; None when neither did."""
    spec = environ.get("NCCL_IB_HCA", "").strip()
    if spec:
        wanted = set(match_nccl_hca_filter(spec, [h.name for h in hcas]))
        return [h for h in hcas if h.name in wanted]
    allocation = allocated_pci_addresses(environ)
    if allocation:
        addresses = set().union(*allocation.values())
        return [h for h in hcas if h.pci_address in addresses]
    return None


def _no_active_port(candidates: list[Hca], hcas: list[Hca], sysfs_root: str | Path,
                    environ: Mapping[str, str]) -> str:
    base = Path(sysfs_root, "class", "infiniband")
    if not candidates:
        named = environ.get("NCCL_IB_HCA") or ", ".join(sorted(allocated_pci_addresses(environ)))
        present = ", ".join(h.name for h in hcas) or "none"
        return f"rdma mode, but no RDMA device here matches {named} (present in {base}: {present})"
    ports = "; ".join(f"{base / h.name / 'ports' / str(p.number) / 'state'}: {p.state}"
                      for h in candidates for p in h.ports) or f"{', '.join(h.name for h in candidates)}: no ports"
    return f"rdma mode, but no RDMA port is ACTIVE on this node, so NCCL would fall back to sockets ({ports})"
