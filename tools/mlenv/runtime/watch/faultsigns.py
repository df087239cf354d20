"""Node-fault signs, detected on the node: what, in a failure, says that the node itself is at fault rather than the
script. What follows from a sign (the node is left out, and recorded) is the restart policy's (restartpolicy.py).

- ``nccl-net``: a rank of the node printed one of NCCL's own network failures (:data:`NCCL_NET_ERRORS`);
- ``xid``: the kernel logged a GPU Xid event since the node's share started (``/dev/kmsg``);
- ``ecc``: a GPU's uncorrectable ECC count or retired pages grew since then (``nvidia-smi -q -d ECC``);
- ``node-check``: an in-node check refused to start the job (the rdma preflight, preflight.py);
- ``unreachable``: the node's supervisor is gone without an exit status (jobs.py), or ssh cannot reach it (ops);
- ``node-failure``: Slurm lost the node while an attempt ran (:func:`scheduler_lost`, asked by the run's script).

A sign is recorded as ``{"sign", "evidence"}``: in the first failure (``state.json``'s ``first_failure.node_fault``)
when a rank's failure carries it, in ``state.json``'s ``node_fault`` when the node failed without a rank.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from ..node.gpus import Gpu, Xid, boot_time, bus_key, parse_kmsg, read_gpus, read_kmsg
from ..node.nodelist import expand_nodelist
from ..records.states import FaultSign, NodeFault
from .protocol import BaseObserver, JobControl, RankInfo

NCCL_NET_ERRORS = re.compile("|".join([
    # src/transport/net_ib.cc (net_ib/p2p.cc since 2.26): WARN("NET/IB : Got completion from peer %s with error %d,
    # opcode %d, len %d, vendor err %d (%s)..."), later "NET/IB: Got completion from peer %s with status=%s(%d)...";
    # the GIN proxy's "NET/IB/GIN: Got completion from peer ..."
    r"NET/IB(?:/GIN)? ?: Got completion from peer",
    # src/transport/net_ib.cc (net_ib/common.cc since 2.26), ncclIbAsyncThreadMain: WARN("NET/IB : %s:%d Got async
    # event : %s", dev, port, ibv_event_type_str(...)): only the error events ("port error", "local catastrophic
    # error", "CQ error", "... work queue error"), not "port active" or "client reregistration"
    r"NET/IB ?: .*Got async event ?: [^\n]*(?:error|fatal)",
    # src/misc/socket.cc: WARN("Net : Connection closed by remote peer %s"), since 2.19 "socketProgress: Connection
    # closed by remote peer %s"; WARN("Net : Call to recv from %s failed : %s")
    r"Connection closed by remote peer",
    r"Net : Call to recv from \S+ failed",
    # src/transport/net_socket.cc, persistentSocketThread: WARN("NET/Socket : socket progress error")
    r"NET/Socket : socket progress error",
    # src/init.cc ncclGetErrorString(ncclRemoteError), as NCCL and torch's DistBackendError print it
    r"ncclRemoteError",
    r"remote process exited or there was a network error",
]))
"""NCCL's own words for a failed network, one pattern per WARN format (the NCCL source file named above each)."""
EVIDENCE_WIDTH = 300


def nccl_net_error(text: str) -> NodeFault | None:
    """The ``nccl-net`` sign when ``text`` (one output line) is one of NCCL's network failures."""
    if NCCL_NET_ERRORS.search(text) is None:
        return None
    return NodeFault(FaultSign.NCCL_NET, text.strip()[:EVIDENCE_WIDTH])


def gpu_fault(before: list[Gpu], after: list[Gpu], xids: list[Xid]) -> NodeFault | None:
    """The ``xid`` sign for the first Xid event, else the ``ecc`` sign for the first GPU whose uncorrectable ECC
    count or retired pages grew (or got a page retirement pending) between ``before`` and ``after``."""
    if xids:
        event = xids[0]
        index = {bus_key(gpu.bus_id): gpu.index for gpu in after or before}.get(bus_key(event.bus_id), "?")
        return NodeFault(FaultSign.XID,
                         f"Xid {event.code} on GPU {index} ({event.bus_id}): {event.message}"[:EVIDENCE_WIDTH])
    earlier = {gpu.uuid: gpu.ecc for gpu in before}
    for gpu in after:
        was, now = earlier.get(gpu.uuid), gpu.ecc
        if was is None:
            continue
        figures = (("volatile uncorrectable ECC errors", was.volatile_uncorrectable, now.volatile_uncorrectable),
                   ("retired pages", was.retired_pages, now.retired_pages))
        grew = [f"{name} {old} -> {new}" for name, old, new in figures
                if old is not None and new is not None and new > old]
        if now.retirement_pending and not was.retirement_pending:
            grew.append("a page retirement pending")
        if grew:
            return NodeFault(FaultSign.ECC, f"GPU {gpu.index} ({gpu.bus_id}): {', '.join(grew)}")
    return None


LOST_STATES = frozenset({"down", "drain", "drained", "draining", "fail", "failing"})
"""Slurm node states (sinfo's %T, its flag characters stripped) of a node lost to the job: down (a node failure, an
administrator's ``state=down``), failed or drained; a node not responding (``*``) counts too."""
STATE_FLAGS = "*~#%!$@^-+"
"""The characters sinfo appends to a node's state (``*`` not responding, ``~`` powered off, ...)."""


def scheduler_lost(hosts: Sequence[str], job_nodes: str, node_states: str) -> dict[int, NodeFault]:
    """The ``node-failure`` sign of each node of an attempt on ``hosts`` (in node order) that Slurm lost while the
    attempt ran: taken out of the job, which goes on without it (``job_nodes``: the job's nodes now, squeue's %N of the
    running job; empty or ``(null)``, where the job is not running, says nothing), or down, failed, drained or not
    responding (``node_states``: ``sinfo -h -N -o '%N|%T|%E'`` lines of the hosts)."""
    try:
        held = set(expand_nodelist(job_nodes)) if job_nodes.strip() not in ("", "(null)") else None
    except ValueError:
        held = None
    states: dict[str, tuple[str, str]] = {}
    for line in node_states.splitlines():
        name, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        states.setdefault(name.strip(), (state.strip().lower(), reason.strip()))
    found: dict[int, NodeFault] = {}
    for node, host in enumerate(hosts):
        state, reason = states.get(host, ("", ""))
        said = []
        if held is not None and host not in held:
            said.append(f"Slurm took {host} out of the job")
        if state.rstrip(STATE_FLAGS) in LOST_STATES or state.endswith("*"):
            said.append(f"Slurm says it is {state}" + (f" ({reason})" if reason and reason != "none" else ""))
        if said:
            found[node] = NodeFault(FaultSign.NODE_FAILURE, "; ".join(said)[:EVIDENCE_WIDTH])
    return found


class NodeFaultWatch(BaseObserver):
    """Notes this node's signs while the job runs: the first NCCL network error a rank printed, and the GPUs' ECC
    figures at the start, compared (with the Xid events since the start) when a rank fails."""

    def __init__(self, nvidia_smi: str = "nvidia-smi", kmsg: Path = Path("/dev/kmsg"),
                 proc_root: Path = Path("/proc")) -> None:
        self.nvidia_smi = shutil.which(nvidia_smi)  # None on a node without NVIDIA GPUs: no GPU signs to read
        self.kmsg = kmsg
        self.proc_root = proc_root
        self.since = time.time()
        self.gpus: list[Gpu] = []
        self.nccl: NodeFault | None = None

    def started(self, control: JobControl) -> None:
        super().started(control)
        self.since = time.time()
        self.gpus = self._read_gpus()

    def line(self, rank: RankInfo | None, text: str) -> None:
        if self.nccl is None:
            self.nccl = nccl_net_error(text)

    def node_fault(self) -> NodeFault | None:
        return self.nccl or gpu_fault(self.gpus, self._read_gpus(), self._xids())

    def _read_gpus(self) -> list[Gpu]:
        if self.nvidia_smi is None:
            return []
        try:
            return read_gpus(self.nvidia_smi)
        except OSError:
            return []

    def _xids(self) -> list[Xid]:
        booted = boot_time(self.proc_root)
        try:
            return parse_kmsg(read_kmsg(self.kmsg), booted, self.since) if booted is not None else []
        except OSError:  # no kernel log here (a container without it, no permission)
            return []
