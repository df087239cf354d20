"""``mlenv doctor``: every preflight check of the cluster's backend; with a live deployment recorded, also what
each node sees (the runtime's ``doctor`` through the backend's exec), whether the nodes agree with each other (HCA
count, link layer and rate, GID type, NCCL/torch/driver versions, GPUs: the differences behind most multi-node
hangs) and whether their clocks do. Each check has its evidence and its fix; none stops the others; exit 1 on any
FAIL."""

from __future__ import annotations

import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlenv import state
from mlenv.core.capabilities import Check, Handle, Node, NodeAccess
from mlenv.errors import MlenvError, OperationError, UsageError
from mlenv.ops.sync import sync
from mlenv.ops.target import backend_of
from mlenv.parallel import run_parallel
from mlenv.plan import JobPlan
from mlenv.runtime.doctor import KIND, TORCH_FIX_VARIABLE
from mlenv.runtime.records.jsonvalue import JsonObject
from mlenv.ui import info, judged, print_json, spinner, table

RENDEZVOUS_SECONDS = 10
"""How long node 0 listens on the rendezvous port while the other nodes connect."""
CLOCK_SKEW_SECONDS = 1.0

COMPARED: tuple[tuple[str, str, bool, str], ...] = (
    ("HCA count", "hca_count", True,
     "every node must see the same RDMA devices, or NCCL hangs: check the odd node's device-plugin allocation "
     "(network.rdma.resources, network.rdma.networks) or leave it out of nodes.gpu_nodes"),
    ("link layer", "link_layers", True,
     "mixed InfiniBand and Ethernet (RoCE) ports cannot talk to each other: pin nodes of one fabric in "
     "nodes.gpu_nodes, or name the devices in network.rdma.devices"),
    ("link rate", "rates_gbps", True,
     "the odd node's ports came up at another speed: check its cables and switch ports (ibstat), or leave it out "
     "of nodes.gpu_nodes"),
    ("GID type", "gid_type", True,
     "give the odd node's RoCE interfaces an IPv4 address like the others', or set network.rdma.gid_index"),
    ("NCCL version", "nccl", False, "run the same image on every node (image: in the cluster file)"),
    ("torch version", "torch", False, "run the same image on every node (image: in the cluster file)"),
    ("CUDA driver", "driver", False, "the driver comes with the host: upgrade the odd node's, or leave it out of "
                                     "nodes.gpu_nodes"),
    ("GPU count", "gpus", False, "the odd node's device plugin offers fewer GPUs: oc/kubectl describe node shows "
                                 "its nvidia.com/gpu; lower gpus.per_node or leave the node out"),
)
"""(check, fact, compared in RDMA mode only, fix): what every node must agree on."""


@dataclass(frozen=True)
class NodeReport:
    """What one node's runtime doctor answered (None: nothing usable), and its clock's offset from ours."""

    node: Node
    report: Mapping[str, Any] | None
    offset: float | None = None
    output: Sequence[str] = field(default_factory=list)

    @property
    def facts(self) -> Mapping[str, Any]:
        """The node's facts (empty without a report)."""
        return (self.report or {}).get("facts") or {}


def ship_runtime(backend: NodeAccess, handle: Handle, extra: Mapping[str, Path] | None = None) -> list[str]:
    """Copy the runtime, and ``extra`` (path in the workspace -> local file), to every node the way ``mlenv sync``
    does, so that nothing needs a sync first; the copy's table goes to stderr. The errors, one per failed node."""
    info(f"copying mlenv's runtime{''.join(f' and {name}' for name in extra or {})} to the nodes, as mlenv sync does")
    with tempfile.TemporaryDirectory(prefix="mlenv-ship-") as staging:
        for relative, source in (extra or {}).items():
            destination = Path(staging, relative)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)
        with contextlib.redirect_stdout(sys.stderr):
            report = sync(backend, handle, source=Path(staging))
    return [f"{row.pod}: {row.result}" for row in report.pods if not row.ok]


def ask_nodes(backend: NodeAccess, handle: Handle, nodes: Sequence[Node],
              args: Sequence[str]) -> dict[int, list[tuple[float, str]]]:
    """The lines (with the time each arrived) of the runtime with ``args`` on every node at once, in the software
    a launch there gets (``runtime_as_launched``); a missing torch is blamed on the field the backend takes its
    software from (``torch_fix``)."""
    fix = backend.torch_fix
    env = {TORCH_FIX_VARIABLE: fix} if fix else {}
    commands = {n.ordinal: backend.runtime_as_launched(handle, n, args, env) for n in nodes}
    lines: dict[int, list[tuple[float, str]]] = {n.ordinal: [] for n in nodes}
    run_parallel(commands, echo=False, on_line=lambda node, line: lines[node].append((time.time(), line)))
    return lines


def answer(lines: Sequence[tuple[float, str]], kind: str) -> tuple[JsonObject, float, str] | None:
    """The last JSON line of ``kind`` among a node's ``lines``: (it read, when it arrived, the line), or None."""
    for arrived, line in reversed(lines):
        if not line.startswith("{"):
            continue
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and found.get("kind") == kind:
            return found, arrived, line
    return None


def node_reports(backend: NodeAccess, handle: Handle, nodes: Sequence[Node],
                 rendezvous: float | None = None) -> dict[int, NodeReport]:
    """The runtime's ``doctor --json`` on every node at once (with ``rendezvous``: node 0 listens that long)."""
    said = ask_nodes(backend, handle, nodes, ["doctor", "--json", *(["--rendezvous", str(rendezvous)]
                                                                    if rendezvous else [])])
    return {n.ordinal: _read_report(n, said[n.ordinal]) for n in nodes}


def _read_report(node: Node, lines: Sequence[tuple[float, str]]) -> NodeReport:
    found = answer(lines, KIND)
    if found is None:
        return NodeReport(node, None, None, [text for _, text in lines])
    report, arrived, line = found
    clock = report.get("clock")
    offset = clock - arrived if isinstance(clock, (int, float)) else None
    return NodeReport(node, report, offset, [text for _, text in lines if text != line])


def node_checks(reports: Mapping[int, NodeReport], mode: str, gpus_per_node: int) -> list[Check]:
    """Each node's own checks (named ``<node>: <check>``), then the comparisons across nodes and the clocks."""
    checks = []
    for ordinal in sorted(reports):
        found = reports[ordinal]
        name = found.node.name
        if found.report is None:
            said = [line for line in found.output if line.strip()]
            checks.append(Check(f"{name}: runtime doctor", "FAIL", said[-1] if said else "no answer",
                                f"mlenv exec --pod {ordinal} -- python3 -m mlenv.runtime doctor shows the error"))
            continue
        checks += [Check(f"{name}: {c['name']}", c["status"], c["evidence"], c.get("fix"))
                   for c in found.report.get("checks", [])]
        if gpus_per_node:
            seen = int(found.facts.get("gpus") or 0)
            checks.append(Check(f"{name}: GPUs", "PASS" if seen >= gpus_per_node else "FAIL",
                                f"{seen} GPUs visible, gpus.per_node is {gpus_per_node}", None
                                if seen >= gpus_per_node else "the pod got fewer GPUs than asked: check the node's "
                                                              "device plugin (nvidia.com/gpu allocatable)"))
    answered = {r.node.name: r for _, r in sorted(reports.items()) if r.report is not None}
    checks += compare_nodes({name: r.facts for name, r in answered.items()}, rdma=mode == "rdma")
    if answered:
        checks.append(nccl_tests_check({name: r.facts for name, r in answered.items()}))
    offsets = {name: r.offset for name, r in answered.items() if r.offset is not None}
    if len(offsets) > 1:
        checks.append(clock_check(offsets))
    return checks


def _text(value: Any) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, (list, tuple)):
        return ", ".join(_text(item) for item in value) or "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def compare_nodes(facts: Mapping[str, Mapping[str, Any]], rdma: bool) -> list[Check]:
    """FAIL naming the odd nodes when what they found differs (the value most nodes share is the norm; on a tie,
    the first node's); the socket interfaces are listed, since each node picks its own."""
    if len(facts) < 2:
        return []
    checks = []
    first = next(iter(facts))
    for check, key, rdma_only, fix in COMPARED:
        if (rdma_only and not rdma) or all(found.get(key) is None for found in facts.values()):
            continue
        values = {name: _text(found.get(key)) for name, found in facts.items()}
        counts = Counter(values.values())
        if len(counts) == 1:
            checks.append(Check(f"same {check}", "PASS", f"all {len(values)} nodes: {values[first]}"))
            continue
        top = max(counts.values())
        norm = values[first] if counts[values[first]] == top else counts.most_common(1)[0][0]
        odd = ", ".join(f"{name} has {value}" for name, value in values.items() if value != norm)
        checks.append(Check(f"same {check}", "FAIL", f"{odd}; the other {counts[norm]} node(s) have {norm}", fix))
    interfaces = {name: _text(found.get("interface")) for name, found in facts.items()}
    listed = ", ".join(f"{name}: {interface}" for name, interface in interfaces.items())
    note = " (different names are fine: each node uses its own)" if len(set(interfaces.values())) > 1 else ""
    checks.append(Check("socket interfaces", "PASS", listed + note))
    return checks


def nccl_tests_check(facts: Mapping[str, Mapping[str, Any]]) -> Check:
    """Which nodes have NVIDIA's all_reduce_perf (``nccl-test --tool nccl-tests`` needs it on every node): WARN
    naming the nodes without it when only some have it."""
    have = {name: found["nccl_tests"] for name, found in facts.items() if found.get("nccl_tests")}
    if not have:
        return Check("nccl-tests", "PASS", "no node has all_reduce_perf: nccl-test runs mlenv's own benchmark",
                     "network.nccl_tests: PATH in the cluster file where an image has it elsewhere")
    paths = ", ".join(f"{name}: {path}{' (MPI)' if facts[name].get('nccl_tests_mpi') else ''}"
                      for name, path in have.items())
    lacking = [name for name in facts if name not in have]
    if lacking:
        return Check("nccl-tests", "WARN", f"{paths}; not on {', '.join(lacking)}",
                     "run the same image on every node: nccl-test --tool nccl-tests needs it on every node")
    return Check("nccl-tests", "PASS", f"all_reduce_perf on every node ({paths})")


def clock_check(offsets: Mapping[str, float]) -> Check:
    """The nodes' clocks (as offsets from this machine's) must agree within CLOCK_SKEW_SECONDS."""
    spread = max(offsets.values()) - min(offsets.values())
    if spread <= CLOCK_SKEW_SECONDS:
        return Check("clocks", "PASS", f"the {len(offsets)} nodes' clocks agree within {spread:.2f} s")
    middle = statistics.median(offsets.values())
    odd = max(offsets, key=lambda name: abs(offsets[name] - middle))
    return Check("clocks", "FAIL", f"{odd}'s clock is {offsets[odd] - middle:+.1f} s off the others' "
                                   f"(spread {spread:.1f} s, more than {CLOCK_SKEW_SECONDS:g} s)",
                 f"synchronise the clock of {odd}'s host (chrony or NTP)")


def _recorded(cluster_ref: str | None) -> state.Deployment | None:
    """The deployment doctor looks at: the current one, or the one ``cluster_ref`` names, if recorded."""
    if cluster_ref is None:
        return state.current()
    try:
        return state.find(state.load(), cluster_ref)
    except UsageError:
        return None


def deployed_checks(backend: NodeAccess, deployment: state.Deployment, gpus_per_node: int) -> list[Check]:
    """The checks on the nodes of a recorded deployment; one WARN when none is running."""
    handle = deployment.handle
    try:
        nodes = backend.nodes(handle)
    except OperationError as exc:
        return [Check("deployment", "WARN", f"{deployment.name} is recorded but not running: {exc}",
                      f"mlenv deploy {deployment.cluster_file}")]
    try:
        failed = ship_runtime(backend, handle)
        if failed:
            return [Check("runtime copied", "FAIL", "; ".join(failed), "mlenv sync shows the whole error")]
        with spinner(f"checking the {len(nodes)} nodes of {deployment.name} (the runtime's doctor on each)"):
            reports = node_reports(backend, handle, nodes, RENDEZVOUS_SECONDS)
    except MlenvError as exc:
        return [Check("nodes", "FAIL", f"cannot run the runtime's doctor on the nodes: {exc}")]
    return node_checks(reports, handle.mode, gpus_per_node)


def run_doctor(job: JobPlan, cluster_ref: str | None, as_json: bool) -> int:
    """Print every check; 1 when any FAILs. ``cluster_ref``: what the user named (None: the current deployment)."""
    backend = backend_of(job.cluster.backend)
    before = backend.checks.checks(job)
    deployment = _recorded(cluster_ref)
    after = deployed_checks(backend.access, deployment, job.gpus_per_node) if deployment else []
    verdict = next((status for status in ("FAIL", "WARN") if any(c.status == status for c in (*before, *after))),
                   "PASS")
    if as_json:
        print_json({"ok": verdict != "FAIL", "verdict": verdict, "cluster": job.name,
                    "backend": job.cluster.backend, "mode": job.mode,
                    "deployment": deployment.name if deployment else None,
                    "checks": [{**asdict(c), "scope": "cluster"} for c in before]
                    + [{**asdict(c), "scope": "nodes"} for c in after]})
    else:
        columns = ["CHECK", "RESULT", "EVIDENCE", "FIX"]
        table(f"mlenv doctor: {job.name} ({job.cluster.backend}, {job.mode})", columns,
              [[c.name, c.status, c.evidence, c.fix or ""] for c in before])
        if deployment:
            table(f"on the nodes of {deployment.name}", columns,
                  [[c.name, c.status, c.evidence, c.fix or ""] for c in after])
        counts = Counter(c.status for c in (*before, *after))
        judged(verdict, ", ".join(f"{counts[status]} {status}" for status in ("FAIL", "WARN", "PASS")
                                  if counts[status]) + f" of {sum(counts.values())} checks")
    return 1 if verdict == "FAIL" else 0
