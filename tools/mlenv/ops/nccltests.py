"""``mlenv nccl-test --read FILE``: the fabric gate on the output of NVIDIA's nccl-tests (``all_reduce_perf`` and its
siblings), read by the runtime's reader (runtime/fabric/nccltests.py): the same table, plot and PASS/FAIL as the
all-reduce benchmark. Wrong results (a non-zero ``#wrong``, or the footer's ``Out of bounds values : N FAILED``)
FAIL whatever the bandwidth; an error, no rows or a cut-short output is UNKNOWN, with the reason."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlenv.errors import UsageError
from mlenv.ops.nccltest import Expectation, gate_bandwidth, parse_bandwidth
from mlenv.runtime.fabric.nccltests import NcclTestsReport, read_path

PASS, FAIL, UNKNOWN = "PASS", "FAIL", "UNKNOWN"


def judge(report: NcclTestsReport, expected: Expectation | None) -> tuple[str, str]:
    """(PASS, FAIL or UNKNOWN, why): wrong results first, then what keeps the bandwidth from being judged, then the
    bandwidth at the largest size against ``expected`` (as the benchmark's gate)."""
    more = "; the file goes on with another run, not read" if report.more_runs else ""
    if report.wrong:
        found = [f"{row.size} bytes {row.type}" for row in report.rows
                 if any(side.wrong for side in row.sides())]
        where = f" at {', '.join(found[:5])}{' ...' if len(found) > 5 else ''}" if found else ""
        footer = (f"; the footer says Out of bounds values : {report.out_of_bounds} FAILED"
                  if report.failed_footer else "")
        return FAIL, f"wrong results: nccl-tests counted wrong elements{where}{footer}: a FAIL whatever the bandwidth"
    largest = report.largest()
    if report.problem or largest is None:
        return UNKNOWN, f"{report.problem or 'no result row'}{more}"
    enough, reason = gate_bandwidth(largest.out_of_place.busbw_gbps, largest.size, expected)
    if report.wrong is None:
        reason += "; results not checked (nccl-tests ran with -c 0)"
    return (PASS if enough else FAIL), reason + more


def summary(report: NcclTestsReport, verdict: str, reason: str) -> dict[str, Any]:
    """The ``--json`` shape of docs/json.md."""
    return {"tool": "nccl-tests", "test": report.test, "ranks": report.ranks, "nodes": report.nodes,
            "rows": [row.to_dict() for row in report.rows], "avg_busbw_GBps": report.avg_busbw_gbps,
            "wrong": report.wrong, "error": report.error, "verdict": verdict, "reason": reason}


def read_output(path: Path) -> NcclTestsReport:
    """The report of the nccl-tests output at ``path``; UsageError (exit 2) naming a file that cannot be read."""
    if not path.is_file():
        raise UsageError(f"--read: no file {path}")
    try:
        return read_path(path)
    except OSError as exc:
        raise UsageError(f"--read: cannot read {path}: {exc.strerror or exc}") from None


def points(report: NcclTestsReport) -> list[tuple[int, float]]:
    """(size, out-of-place busbw) to plot: one per size, the lowest where several types or ops share it."""
    lowest: dict[int, float] = {}
    for row in report.rows:
        busbw = row.out_of_place.busbw_gbps
        lowest[row.size] = min(busbw, lowest.get(row.size, busbw))
    return sorted(lowest.items())


def run_read(path: Path, expect: str | None = None, as_json: bool = False) -> int:
    """Read, judge and print an nccl-tests output; 1 on FAIL, and on UNKNOWN when a bandwidth was expected."""
    from mlenv.ops.plot import terminal_plot
    from mlenv.ui import print_json

    expected = Expectation(parse_bandwidth(expect), f"--expect {expect}") if expect is not None else None
    report = read_output(path)
    verdict, reason = judge(report, expected)
    result = summary(report, verdict, reason)
    if as_json:
        print_json(result)
    else:
        _print(path, result, terminal_plot(points(report), expected.gbps if expected else None))
    return 1 if verdict == FAIL or (verdict == UNKNOWN and expected is not None) else 0


def _number(value: object) -> str:
    return "-" if value is None else str(value)


def _print(path: Path, result: Mapping[str, Any], plot: str) -> None:
    from mlenv.ui import error, judged, say, table

    scale = f"{_number(result['ranks'])} ranks, {_number(result['nodes'])} nodes"
    if result["rows"]:
        table(f"{result['test'] or 'nccl-tests'} bus bandwidth: {path.name} ({scale})",
              ["SIZE (bytes)", "TYPE", "REDOP", "TIME (us)", "ALGBW (GB/s)", "BUSBW (GB/s)", "#WRONG",
               "IN-PLACE BUSBW"],
              [[row["size"], row["type"], row["redop"] or "-", f"{row['out_of_place']['time_us']:.1f}",
                f"{row['out_of_place']['algbw_GBps']:.4g}", f"{row['out_of_place']['busbw_GBps']:.4g}",
                _number(row["out_of_place"]["wrong"]),
                f"{row['in_place']['busbw_GBps']:.4g}" if row["in_place"] else "-"] for row in result["rows"]])
        print(plot, end="")
    else:
        say(f"{path.name}: {scale}, no result row")
    if result["avg_busbw_GBps"] is not None:
        say(f"average bus bandwidth (nccl-tests' footer): {result['avg_busbw_GBps']:g} GB/s")
    if result["error"]:
        error(f"nccl-tests: {result['error']}")
    judged(result["verdict"], result["reason"])
