"""``mlenv nccl-test``: the fabric gate. Ships the all-reduce benchmark (workspace/allreduce_bench.py) with the
runtime to every node, the way sync copies files, so it needs no sync first; runs it on every node and GPU through
the launch workflow with NCCL_DEBUG=INFO; prints message size -> algbw/busbw, the transport NCCL used for every
rank (from its own log), and PASS or FAIL: at least 80 % of the expected bus bandwidth at the largest size, the
expectation from --expect, network.expected_busbw, or in RDMA mode the link rate x HCAs the nodes read in sysfs.
A file that asks for RDMA and a log that shows sockets FAILs whatever the number. Results go to runs/<run id>/ as
nccl-test.json and busbw.png."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import mlenv
from mlenv.config.discover import project_root
from mlenv.config.quantity import QuantityError
from mlenv.config.quantity import parse_bandwidth as parse
from mlenv.core.capabilities import LaunchSpec
from mlenv.errors import OperationError, UsageError
from mlenv.ops.doctor import node_reports, ship_runtime
from mlenv.ops.launch import LaunchResult, launch, run_id
from mlenv.ops.plot import terminal_plot, write_png
from mlenv.ops.target import Target, file_cluster
from mlenv.runtime.fabric.ncclog import INTRA_NODE, SOCKETS, UNKNOWN, LogReport, contradicts, parse_nccl_log
from mlenv.runtime.fabric.sizes import parse_sizes
from mlenv.ui import error, judged, print_json, say, table

PEAK = re.compile(r"peak_busbw_gbps=([\d.]+) size_bytes=(\d+)")
RESULT = re.compile(r"^(?:\[node-\d+ r0\] )?allreduce +(\d+) +([\d.]+) +([\d.]+) +([\d.]+) *$", re.MULTILINE)
"""A result line of the benchmark's rank 0, as the runtime tagged it ([node-N r0])."""
"""A line of the benchmark's table: size_bytes time_us algbw_GBps busbw_GBps."""
PASS_RATIO = 0.8
NO_GATE = "NO GATE"
"""The verdict when nothing was compared: no bandwidth expected and no transport to prove (neither PASS nor FAIL)."""
"""PASS from this share of the expected bus bandwidth at the largest size."""
BENCH = "allreduce_bench.py"
"""Shipped to the top of every node's workspace, as ``mlenv sync`` puts workspace/allreduce_bench.py there."""
NO_NCCL = "gloo over TCP sockets (no NCCL in use)"


@dataclass(frozen=True)
class SizeResult:
    """One message size of the benchmark (the slowest rank's time)."""

    size_bytes: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float


@dataclass(frozen=True)
class ExpectedBandwidth:
    """The bus bandwidth to reach, in GB/s, and where it comes from."""

    gbps: float
    source: str


@dataclass(frozen=True)
class BandwidthVerdict:
    """PASS or FAIL, and why."""

    status: str
    reasons: tuple[str, ...]


def find_in_logs(pattern: re.Pattern[str], result: LaunchResult) -> re.Match[str] | None:
    """The last match of ``pattern`` in the first node log that has one (global rank 0 may be on any node)."""
    for ordinal in sorted(result.outcome.node_exit_codes):
        matches = list(pattern.finditer(_read(result.log(ordinal))))
        if matches:
            return matches[-1]
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def nccl_report(logs: Sequence[Path]) -> LogReport:
    """What NCCL's INFO lines in the node logs say, rank by rank (the runtime's nccl-log-check)."""
    return parse_nccl_log(line for path in logs for line in _read(path).splitlines())


def transport(logs: Sequence[Path], expect: str | None = None) -> tuple[str, bool]:
    """(what carried the collectives, whether that matches ``expect``)."""
    report = nccl_report(logs)
    if not report.ranks:
        return NO_NCCL, expect is None
    return f"NCCL {report.verdict}", not (expect and contradicts(report.verdict, expect))


def read_results(logs: Sequence[Path]) -> list[SizeResult]:
    """The benchmark's lines of global rank 0, from the first node log that has them, by size."""
    for path in logs:
        found = {int(m[1]): SizeResult(int(m[1]), float(m[2]), float(m[3]), float(m[4]))
                 for m in RESULT.finditer(_read(path))}
        if found:
            return [found[size] for size in sorted(found)]
    return []


def parse_bandwidth(text: str) -> float:
    """``180GB/s`` or ``1440Gb/s`` (the unit required, as for network.expected_busbw) in GB/s; UsageError."""
    try:
        return parse(text.strip())
    except QuantityError as exc:
        raise UsageError(f"--expect: {exc}") from None


def expected_from_links(facts: Mapping[str, Mapping[str, Any]]) -> ExpectedBandwidth | None:
    """The bus bandwidth the slowest node's RDMA links allow: the rates of its ACTIVE ports (sysfs
    ``ports/*/rate``, Gb/s) summed over its HCAs, / 8; None when a node has no RDMA link."""
    links = [(name, float(found.get("link_gbps") or 0), int(found.get("hca_count") or 0))
             for name, found in facts.items()]
    if not links or any(gbps <= 0 for _, gbps, _ in links):
        return None
    name, gbps, hcas = min(links, key=lambda link: link[1])
    return ExpectedBandwidth(gbps / 8, f"link rate in sysfs: {hcas} HCAs, {gbps:g} Gb/s on {name}")


def evaluate(results: Sequence[SizeResult], report: LogReport, mode: str,
             expected: ExpectedBandwidth | None) -> BandwidthVerdict:
    """PASS at >= 80 % of ``expected`` at the largest size; RDMA asked and sockets seen FAILs whatever the number,
    and so does RDMA asked and no NCCL log to prove it; NO GATE when nothing was compared (no expected bandwidth,
    no transport to prove)."""
    reasons, failed, compared = [], False, expected is not None
    if mode == "rdma":
        if contradicts(report.verdict, "rdma"):
            socket_ranks = [str(r.rank) for r in report.ranks if r.verdict == SOCKETS]
            failed = True
            reasons.append(f"the cluster file asks for RDMA but NCCL used sockets (ranks {', '.join(socket_ranks)}): "
                           "a FAIL whatever the bandwidth")
        elif not report.ranks:
            failed = True
            reasons.append("the cluster file asks for RDMA but the logs have no NCCL INFO lines to prove it")
        elif report.verdict == UNKNOWN:
            failed = True
            reasons.append(f"the cluster file asks for RDMA but NCCL's log cannot prove it: {report.reason}")
        elif report.verdict == INTRA_NODE:
            reasons.append("a single node: NCCL used no network, so there is no transport to prove")
        else:
            compared = True
            reasons.append(f"NCCL used {report.verdict}, as the cluster file asks")
    if not results:
        return BandwidthVerdict("FAIL", (*reasons, "the benchmark printed no result"))
    largest = results[-1]
    enough, reason = gate_bandwidth(largest.busbw_gbps, largest.size_bytes, expected)
    reasons.append(reason)
    return BandwidthVerdict("FAIL" if failed or not enough else "PASS" if compared else NO_GATE, tuple(reasons))


def gate_bandwidth(busbw_gbps: float, size_bytes: int, expected: ExpectedBandwidth | None) -> tuple[bool, str]:
    """(whether ``busbw_gbps`` at the largest size is at least 80 % of ``expected``, why); no expectation passes,
    saying the bandwidth was not gated."""
    if expected is None:
        return True, ("no expected bandwidth (network.expected_busbw in the cluster file, or --expect 180GB/s): "
                      "bandwidth not gated")
    ratio = busbw_gbps / expected.gbps
    return ratio >= PASS_RATIO, (f"{busbw_gbps:.2f} GB/s at {size_bytes} bytes is {ratio:.0%} of the expected "
                                 f"{expected.gbps:.2f} GB/s ({expected.source}); PASS needs {PASS_RATIO:.0%}")


def bench_source() -> Path:
    """The benchmark to ship: the project's workspace/allreduce_bench.py, else the one of mlenv's checkout."""
    for root in (project_root(), Path(mlenv.__file__).resolve().parents[2]):
        if (root / "workspace" / BENCH).is_file():
            return root / "workspace" / BENCH
    raise UsageError(f"no workspace/{BENCH} in {project_root()} to run")


def _file_expectation(target: Target) -> ExpectedBandwidth | None:
    """network.expected_busbw of the deployment's cluster file, if it still loads."""
    cluster = file_cluster(target, "network.expected_busbw")
    gbps = cluster.expected_busbw_gbytes if cluster else None
    return ExpectedBandwidth(gbps, "network.expected_busbw") if gbps else None


def _link_facts(target: Target) -> dict[str, Mapping[str, Any]]:
    """What each node's runtime doctor found of its RDMA links."""
    nodes = target.backend.access.nodes(target.handle)
    reports = node_reports(target.backend.access, target.handle, nodes)
    return {r.node.name: r.facts for r in reports.values()}


@dataclass(frozen=True)
class NcclTestSummary:
    """One nccl-test: the bus bandwidth at each size, the transport each rank's NCCL lines said, the bandwidth
    expected and the verdict; its files are in ``run_dir``."""

    cluster: str
    run_id: str
    mode: str
    nodes: int
    exit_code: int
    run_dir: Path
    sizes: list[SizeResult]
    transport: LogReport
    expected: ExpectedBandwidth | None
    verdict: BandwidthVerdict

    @property
    def transport_verdict(self) -> str:
        """What NCCL's lines said of the transport (``NO_NCCL``: nothing)."""
        return self.transport.verdict if self.transport.ranks else NO_NCCL

    def to_json(self) -> dict[str, object]:
        """``nccl-test --json`` and nccl-test.json (docs/json.md)."""
        keys = ("rank", "process", "verdict", "network", "devices", "gdr", "nccl_version")
        ranks = [{key: value for key, value in rank.to_dict().items() if key in keys}
                 for rank in self.transport.ranks]
        return {
            "cluster": self.cluster, "run_id": self.run_id, "mode": self.mode, "nodes": self.nodes,
            "exit_code": self.exit_code, "sizes": [asdict(r) for r in self.sizes],
            "transport": {"verdict": self.transport_verdict, "ranks": ranks},
            "expected_busbw_gbps": self.expected.gbps if self.expected else None,
            "expected_source": self.expected.source if self.expected else None,
            "ok": self.verdict.status != "FAIL", "verdict": self.verdict.status, "reasons": list(self.verdict.reasons),
            "files": {"json": str(self.run_dir / "nccl-test.json"), "png": str(self.run_dir / "busbw.png"),
                      "logs": str(self.run_dir)},
        }


def _print(summary: NcclTestSummary, plot: str) -> None:
    table(f"all-reduce bus bandwidth: {summary.cluster} ({summary.nodes} nodes)",
          ["SIZE (bytes)", "TIME (us)", "ALGBW (GB/s)", "BUSBW (GB/s)"],
          [[r.size_bytes, f"{r.time_us:.1f}", f"{r.algbw_gbps:.4g}", f"{r.busbw_gbps:.4g}"] for r in summary.sizes])
    ranks = summary.transport.ranks
    if ranks:
        table(f"transport per rank: {summary.transport_verdict}", ["RANK", "PROCESS", "TRANSPORT", "DEVICES", "NCCL"],
              [[r.rank, r.process, r.verdict, ", ".join(r.devices) or r.network or "-",
                r.evidence_.nccl_version or "-"] for r in ranks])
    else:
        say(f"transport: {summary.transport_verdict}")
    print(plot, end="")
    judged(summary.verdict.status, "; ".join(summary.verdict.reasons))
    say(f"results: {summary.run_dir / 'nccl-test.json'}, plot: {summary.run_dir / 'busbw.png'}")
    if summary.verdict.status == "FAIL":
        error(f"nccl-test FAILED; the node logs are in {summary.run_dir}")


def prepare(target: Target, sizes: str | None, expect: str | None) -> ExpectedBandwidth | None:
    """Check ``--sizes``, ship the benchmark, and find the bandwidth to expect (None: none known). Prints to
    stdout: call it with stdout redirected for --json."""
    if sizes is not None:
        try:
            parse_sizes(sizes)
        except ValueError as exc:
            raise UsageError(f"--sizes: {exc} (e.g. 8M:1G, 8M:1G:4 or 1M,64M,1G)") from None
    expected = ExpectedBandwidth(parse_bandwidth(expect), f"--expect {expect}") if expect is not None else None
    failed = ship_runtime(target.backend.access, target.handle, {BENCH: bench_source()})
    if failed:
        raise OperationError(f"cannot copy {BENCH} to the nodes: {'; '.join(failed)}")
    expected = expected or _file_expectation(target)
    if expected is None and target.handle.mode == "rdma":
        expected = expected_from_links(_link_facts(target))
    return expected


def run_bench(target: Target, nproc: int | None, sizes: str | None, *extra: str) -> LaunchResult:
    """Launch the benchmark on every node with NCCL's INFO log (``extra``: more of its arguments)."""
    args = ("--nccl-debug", "INFO", *(("--sizes", sizes) if sizes else ()), *extra)
    return launch(target, LaunchSpec("torchrun", BENCH, args, nproc=nproc,
                                     run_id=run_id(f"{target.handle.name}-nccl-test")))


def node_logs(result: LaunchResult) -> list[Path]:
    """Every node's log of the run, in node order."""
    return [result.log(n) for n in sorted(result.outcome.node_exit_codes)]


def run_nccl_test(target: Target, nproc: int | None = None, sizes: str | None = None, expect: str | None = None,
                  as_json: bool = False) -> int:
    """Ship and run the benchmark on every node, judge it, save and print the results; 1 on FAIL."""
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        expected = prepare(target, sizes, expect)
        result = run_bench(target, nproc, sizes)
    if result.outcome.interrupted:
        return result.exit_code
    logs = node_logs(result)
    results, report = read_results(logs), nccl_report(logs)
    verdict = evaluate(results, report, target.handle.mode, expected)
    handle = target.handle
    summary = NcclTestSummary(handle.name, result.run_id, handle.mode, handle.nodes, result.exit_code, result.run_dir,
                              results, report, expected, verdict)
    points = [(r.size_bytes, r.busbw_gbps) for r in results]
    write_png(result.run_dir / "busbw.png", points, expected.gbps if expected else None)
    (result.run_dir / "nccl-test.json").write_text(json.dumps(summary.to_json(), indent=2) + "\n")
    if as_json:
        print_json(summary.to_json())
    else:
        _print(summary, terminal_plot(points, expected.gbps if expected else None))
    return 1 if verdict.status == "FAIL" else 0
