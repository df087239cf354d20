"""``mlenv nccl-test --pairs``: pairwise fabric bisection. The benchmark all-reduces within disjoint node pairs at once,
in rounds that rotate the pairs (mlenv.runtime.fabric.pairs); a pair is slow under 80 % of the expected bus bandwidth,
or, with no expectation, under half of the best pair's and below the widest gap between the pairs' figures; a node is
named when every pair it was in is slow and some pair without it is not. Results go to runs/<run id>/ as
nccl-pairs.json and pairs.png; ``--exclude-bad`` records the named nodes as excluded from the deployment's next runs."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from itertools import pairwise
from pathlib import Path

from mlenv import state
from mlenv.core.recorded import ExcludedNode
from mlenv.errors import UsageError
from mlenv.ops.nccltest import PASS_RATIO, ExpectedBandwidth, node_logs, prepare, run_bench
from mlenv.ops.plot import write_bars
from mlenv.ops.target import Target
from mlenv.runtime.fabric.pairs import MIN_NODES
from mlenv.ui import error, info, print_json, table, warn

PAIR = re.compile(r"^(?:\[node-\d+ r\d+\] )?pair round=(\d+) nodes=(\d+),(\d+) size_bytes=(\d+) "
                  r"time_us=([\d.]+) busbw_GBps=([\d.]+) *$", re.MULTILINE)
"""A line of the benchmark in --pairs mode, printed by the lowest rank of each pair (as the runtime tagged it)."""
BEST_SHARE = 0.5
"""Without an expected bandwidth a pair is slow under this share of the best pair's."""


@dataclass(frozen=True)
class PairResult:
    """One pair of one round, and whether it was slow."""

    round: int
    nodes: tuple[int, int]
    size_bytes: int
    time_us: float
    busbw_gbps: float
    slow: bool = False


def read_pairs(logs: Sequence[Path]) -> list[PairResult]:
    """Every pair's line, from whichever node log holds it, by round and pair."""
    found = {}
    for path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for m in PAIR.finditer(text):
            found[(int(m[1]), int(m[2]), int(m[3]))] = PairResult(int(m[1]), (int(m[2]), int(m[3])), int(m[4]),
                                                                   float(m[5]), float(m[6]))
    return [found[key] for key in sorted(found)]


def threshold(pairs: Sequence[PairResult], expected: ExpectedBandwidth | None) -> tuple[float, str]:
    """The bus bandwidth under which a pair is slow, and why that figure."""
    if expected is not None:
        return expected.gbps * PASS_RATIO, f"{PASS_RATIO:.0%} of the expected {expected.gbps:.4g} GB/s " \
                                           f"({expected.source})"
    half = max((p.busbw_gbps for p in pairs), default=0.0) * BEST_SHARE
    share = f"{BEST_SHARE:.0%} of the best pair's {half / BEST_SHARE:.4g} GB/s"
    gap = widest_gap(sorted(p.busbw_gbps for p in pairs))
    if gap is None or gap >= half:
        return half, f"{share} (no expected bandwidth)"
    return gap, f"{gap:.4g} GB/s, the pair above the widest gap between the pairs' figures (no expected " \
                f"bandwidth; {share} is higher)"


def widest_gap(figures: Sequence[float]) -> float | None:
    """The figure just above the widest ratio between neighbours of ``figures`` (ascending), None with fewer than 2.

    A loaded machine spreads healthy pairs apart by more than 2x now and then; only the pairs below the widest gap
    are apart from the others as a group, so a pair must also be under this figure to be slow."""
    steps = [(high / low if low > 0 else float("inf"), high) for low, high in pairwise(figures)]
    return max(steps)[1] if steps else None


def judge(pairs: Sequence[PairResult], below: float) -> tuple[list[PairResult], list[int]]:
    """The pairs with their slow flag, and the nodes every one of whose pairs is slow while some pair without them
    is not."""
    judged = [PairResult(p.round, p.nodes, p.size_bytes, p.time_us, p.busbw_gbps, p.busbw_gbps < below)
              for p in pairs]
    nodes = sorted({node for p in judged for node in p.nodes})
    named = [node for node in nodes
             if all(p.slow for p in judged if node in p.nodes)
             and any(not p.slow for p in judged if node not in p.nodes)]
    return judged, named


@dataclass(frozen=True)
class PairsReport:
    """One bisection: every pair judged against ``slow_below_gbps`` (and why that figure), the nodes named slow and,
    with ``--exclude-bad``, the nodes excluded afterwards; its files are in ``run_dir``."""

    cluster: str
    run_id: str
    nodes: int
    exit_code: int
    run_dir: Path
    slow_below_gbps: float
    slow_because: str
    pairs: list[PairResult]
    slow_nodes: list[int]
    excluded: tuple[ExcludedNode, ...] | None = None

    @property
    def ok(self) -> bool:
        """Some pair reported and no node is named."""
        return bool(self.pairs) and not self.slow_nodes

    @property
    def files(self) -> dict[str, str]:
        """Where the results (``json``), the plot (``png``) and the node logs (``logs``) are."""
        return {"json": str(self.run_dir / "nccl-pairs.json"), "png": str(self.run_dir / "pairs.png"),
                "logs": str(self.run_dir)}

    def to_json(self) -> dict[str, object]:
        """``nccl-test --pairs --json`` and nccl-pairs.json (docs/json.md)."""
        return {"ok": self.ok, "verdict": "PASS" if self.ok else "FAIL", "cluster": self.cluster,
                "run_id": self.run_id, "nodes": self.nodes, "exit_code": self.exit_code,
                "size_bytes": self.pairs[0].size_bytes if self.pairs else None,
                "slow_below_gbps": self.slow_below_gbps, "slow_because": self.slow_because,
                "pairs": [{**asdict(p), "nodes": list(p.nodes)} for p in self.pairs], "slow_nodes": self.slow_nodes,
                "files": self.files,
                "excluded": None if self.excluded is None else [entry.to_json() for entry in self.excluded]}


def _print(report: PairsReport) -> None:
    table(f"pairwise all-reduce: {report.cluster} ({report.nodes} nodes, "
          f"{report.pairs[0].size_bytes if report.pairs else None} bytes)",
          ["ROUND", "PAIR", "TIME (us)", "BUSBW (GB/s)", "SLOW"],
          [[p.round, f"node-{p.nodes[0]} + node-{p.nodes[1]}", f"{p.time_us:.1f}", f"{p.busbw_gbps:.4g}",
            "SLOW" if p.slow else ""] for p in report.pairs])
    print(f"slow: under {report.slow_below_gbps:.4g} GB/s, {report.slow_because}")
    named = report.slow_nodes
    if named:
        warn(f"slow node{'s' if len(named) > 1 else ''}: {', '.join(f'node-{n}' for n in named)} (every pair "
             "with it was slow, some pair without it was not)")
    else:
        print("no node is to blame: " + ("every pair is fast" if not any(p.slow for p in report.pairs)
                                        else "no node was slow in every pair it was in"))
    print(f"results: {report.files['json']}, plot: {report.files['png']}")


def _exclude(target: Target, named: Sequence[int], run: str) -> tuple[ExcludedNode, ...]:
    """Record ``named`` as excluded from the deployment's next runs."""
    if target.recorded is None:
        raise UsageError(f"--exclude-bad: {target.handle.name} is not deployed, so there is no record to keep "
                         "excluded nodes in")
    hosts = {node.ordinal: node.name for node in target.backend.access.nodes(target.handle)}
    reason = f"nccl-test --pairs (run {run}): every pair with it was slow"
    return state.exclude(target.recorded.name, {n: (hosts.get(n, f"node-{n}"), reason) for n in named})


def run_pairs(target: Target, nproc: int | None = None, sizes: str | None = None, expect: str | None = None,
              as_json: bool = False, exclude_bad: bool = False) -> int:
    """Bisect the fabric pair by pair; print and save the pairs; 1 when a node is named or no pair reported."""
    if target.handle.nodes < MIN_NODES:
        raise UsageError(f"nccl-test --pairs: {target.handle.name} has {target.handle.nodes} nodes; it cannot bisect "
                         f"fewer than {MIN_NODES} (a slow pair of 2 nodes cannot tell which one is slow)")
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        expected = prepare(target, sizes, expect)
        result = run_bench(target, nproc, sizes, "--pairs")
    if result.outcome.interrupted:
        return result.exit_code
    pairs = read_pairs(node_logs(result))
    below, because = threshold(pairs, expected)
    judged, named = judge(pairs, below)
    report = PairsReport(target.handle.name, result.run_id, target.handle.nodes, result.exit_code, result.run_dir,
                         below, because, judged, named)
    write_bars(result.run_dir / "pairs.png", [(f"{p.nodes[0]}-{p.nodes[1]}", p.busbw_gbps, p.slow) for p in judged],
               below)
    if exclude_bad and named:
        report = replace(report, excluded=_exclude(target, named, result.run_id))
    Path(report.files["json"]).write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if as_json:
        print_json(report.to_json())
    else:
        _print(report)
    if not judged:
        error(f"the benchmark printed no pair result; the node logs are in {result.run_dir}")
        return 1
    if report.excluded:
        info(f"excluded from the next runs: {', '.join(f'node-{n}' for n in named)} "
             "(mlenv nodes --forget-excluded clears)")
    return 1 if named else 0
