"""``mlenv nccl-test --read FILE``: the fabric gate on the output of NVIDIA's nccl-tests (``all_reduce_perf`` and its
siblings), read by the runtime's reader (runtime/fabric/nccltests.py): the same table, plot and PASS/FAIL as the
all-reduce benchmark. Wrong results (a non-zero ``#wrong``, or the footer's ``Out of bounds values : N FAILED``)
FAIL whatever the bandwidth; an error, no rows or a cut-short output is UNKNOWN, with the reason.

``mlenv nccl-test --tool nccl-tests`` runs it where every node has it (``network.nccl_tests``): through the
backend's own launcher where it declares one (``srun``), else the runtime's (mpirun from node 0), with the job's
NCCL environment (runtime/fabric/nccltestsrun.py); node 0's output is judged the same way and kept under runs/."""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from mlenv.core.capabilities import LaunchSpec
from mlenv.core.registry import BACKENDS
from mlenv.errors import OperationError, UsageError
from mlenv.ops.doctor import nccl_tests_check, node_reports, ship_runtime
from mlenv.ops.launch import launch, run_id
from mlenv.ops.nccltest import ExpectedBandwidth, gate_bandwidth, parse_bandwidth
from mlenv.ops.plot import terminal_plot
from mlenv.ops.target import Target, file_cluster
from mlenv.runtime.fabric.nccltests import MAX_ROWS, NcclTestsReport, read_path
from mlenv.runtime.fabric.nccltestsrun import TESTS
from mlenv.runtime.fabric.sizes import parse_sizes
from mlenv.runtime.regularfile import NotRegularFile
from mlenv.ui import error, info, judged, print_json, say, table

RUNNER = "nccl_tests_run.py"
"""Shipped to the top of every node's workspace: runs the runtime's nccl-tests runner (nccltestsrun.main)."""
RUNNER_TEXT = "import sys\n\nfrom mlenv.runtime.fabric.nccltestsrun import main\n\nsys.exit(main())\n"
DEFAULT_SIZES = "1M:1G:4"
"""As the benchmark's default on GPUs."""

PASS, FAIL, UNKNOWN = "PASS", "FAIL", "UNKNOWN"


def judge(report: NcclTestsReport, expected: ExpectedBandwidth | None) -> tuple[str, str]:
    """(PASS, FAIL or UNKNOWN, why): wrong results first, then what keeps the bandwidth from being judged, then the
    bandwidth at the largest size against ``expected`` (as the benchmark's gate)."""
    more = "; the file goes on with another run, not read" if report.more_runs else ""
    if report.wrong:
        found = [f"{row.size} bytes {row.type}" for row in report.rows
                 if any(side.wrong for side in row.sides())]
        where = f" at {', '.join(found[:5])}{' ...' if len(found) > 5 else ''}" if found else ""
        footer = (f"; the footer says Out of bounds values : {report.out_of_bounds} FAILED"
                  if report.failed_footer else "")
        footer += f"; and in rows past the first {MAX_ROWS}" if report.wrong_unkept else ""
        return FAIL, f"wrong results: nccl-tests counted wrong elements{where}{footer}: a FAIL whatever the bandwidth"
    largest = report.largest()
    if report.problem or largest is None:
        return UNKNOWN, f"{report.problem or 'no result row'}{more}"
    enough, reason = gate_bandwidth(largest.out_of_place.busbw_gbps, largest.size, expected)
    if report.wrong is None:
        reason += "; results not checked (nccl-tests ran with -c 0)"
    return (PASS if enough else FAIL), reason + more


def summary(report: NcclTestsReport, verdict: str, reason: str) -> dict[str, object]:
    """The ``--json`` shape of docs/json.md."""
    return {"tool": "nccl-tests", "test": report.test, "ranks": report.ranks, "nodes": report.nodes,
            "rows": [row.to_dict() for row in report.rows], "avg_busbw_GBps": report.avg_busbw_gbps,
            "wrong": report.wrong, "error": report.error, "verdict": verdict, "reason": reason}


def read_output(path: Path) -> NcclTestsReport:
    """The report of the nccl-tests output at ``path``; UsageError (exit 2) naming a path that is no file or cannot
    be read."""
    try:
        return read_path(path)
    except FileNotFoundError:
        raise UsageError(f"--read: no file {path}") from None
    except NotRegularFile as exc:
        raise UsageError(f"--read: {path} is not a regular file ({exc.kind}): give an nccl-tests output "
                         "file") from None
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
    expected = ExpectedBandwidth(parse_bandwidth(expect), f"--expect {expect}") if expect is not None else None
    report = read_output(path)
    verdict, reason = judge(report, expected)
    result = summary(report, verdict, reason)
    if as_json:
        print_json(result)
    else:
        _print(path, report, verdict, reason, terminal_plot(points(report), expected.gbps if expected else None))
    return 1 if verdict == FAIL or (verdict == UNKNOWN and expected is not None) else 0


def _last_line(path: Path) -> str | None:
    """The last line with text of ``path`` (its last 4 KiB), to say what stopped a run that printed no table."""
    try:
        with path.open("rb") as log:
            log.seek(max(0, log.seek(0, 2) - 4096))
            lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    return lines[-1][:300] if lines else None


def _number(value: object) -> str:
    return "-" if value is None else str(value)


def _print(path: Path, report: NcclTestsReport, verdict: str, reason: str, plot: str) -> None:
    scale = f"{_number(report.ranks)} ranks, {_number(report.nodes)} nodes"
    if report.rows:
        table(f"{report.test or 'nccl-tests'} bus bandwidth: {path.name} ({scale})",
              ["SIZE (bytes)", "TYPE", "REDOP", "TIME (us)", "ALGBW (GB/s)", "BUSBW (GB/s)", "#WRONG",
               "IN-PLACE BUSBW"],
              [[row.size, row.type, row.redop or "-", f"{row.out_of_place.time_us:.1f}",
                f"{row.out_of_place.algbw_gbps:.4g}", f"{row.out_of_place.busbw_gbps:.4g}",
                _number(row.out_of_place.wrong),
                f"{row.in_place.busbw_gbps:.4g}" if row.in_place else "-"] for row in report.rows])
        print(plot, end="")
    else:
        say(f"{path.name}: {scale}, no result row")
    if report.avg_busbw_gbps is not None:
        say(f"average bus bandwidth (nccl-tests' footer): {report.avg_busbw_gbps:g} GB/s")
    if report.error:
        error(f"nccl-tests: {report.error}")
    judged(verdict, reason)


def tool_args(target: Target, test: str, setting: str, sizes: Sequence[int], gpus: int,
              hosts: Sequence[str]) -> list[str]:
    """The runner's arguments: which launcher (the backend's own, else the runtime's), test, where to find it,
    sizes, nodes x GPUs and the hosts, node 0 first."""
    launcher = BACKENDS[target.handle.backend].task_launcher or "runtime"
    return ["--launcher", launcher, "--test", test, "--setting", setting, "--sizes", ",".join(map(str, sizes)),
            "--nodes", str(target.handle.nodes), "--gpus", str(gpus), "--hosts", ",".join(hosts)]


def _setting(target: Target) -> tuple[str, int]:
    """(network.nccl_tests, gpus.per_node) of the deployment's cluster file; UsageError when it is off."""
    cluster = file_cluster(target, "network.nccl_tests")
    setting = cluster.nccl_tests if cluster else "auto"
    if setting == "off":
        raise UsageError("--tool nccl-tests: network.nccl_tests is off in the cluster file (set auto, or the "
                         "directory holding all_reduce_perf)")
    return setting, cluster.gpus.per_node if cluster else 0


def run_tool(target: Target, test: str | None = None, nproc: int | None = None, sizes: str | None = None,
             expect: str | None = None, as_json: bool = False) -> int:
    """Run nccl-tests across the nodes where every node has it, judge node 0's output, keep it under runs/; 1 on
    FAIL (and on UNKNOWN under --expect)."""
    name = test or "all_reduce_perf"
    if name not in TESTS:
        raise UsageError(f"--test: {name!r} is not a test of nccl-tests ({', '.join(TESTS)})")
    try:
        chosen = parse_sizes(sizes or DEFAULT_SIZES)
    except ValueError as exc:
        raise UsageError(f"--sizes: {exc} (e.g. 8M:1G, 8M:1G:4 or 1M,64M,1G)") from None
    expected = ExpectedBandwidth(parse_bandwidth(expect), f"--expect {expect}") if expect is not None else None
    setting, per_node = _setting(target)
    with contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext():
        nodes = target.backend.access.nodes(target.handle)
        reports = node_reports(target.backend.access, target.handle, nodes)
        facts = {r.node.name: r.facts for _, r in sorted(reports.items())}
        check = nccl_tests_check(facts)
        missing = [node.name for node in nodes if not facts.get(node.name, {}).get("nccl_tests")]
        if missing:
            raise OperationError(f"--tool nccl-tests: all_reduce_perf is not on {', '.join(missing)} "
                                 f"({check.evidence}); network.nccl_tests is {setting}")
        plain = [name for name, found in facts.items() if not found.get("nccl_tests_mpi")]
        if len(nodes) > 1 and plain:
            raise OperationError(f"--tool nccl-tests: all_reduce_perf on {', '.join(plain)} was built without MPI, "
                                 f"so it cannot span the {len(nodes)} nodes; use an image whose nccl-tests has MPI "
                                 "(*_perf_mpi) or network.nccl_tests: the directory of such a build")
        info(f"nccl-tests: {check.evidence}")
        gpus = nproc or per_node or int(next(iter(facts.values())).get("gpus") or 1)
        with tempfile.TemporaryDirectory(prefix="mlenv-nccl-tests-") as staging:
            runner = Path(staging, RUNNER)
            runner.write_text(RUNNER_TEXT)
            failed = ship_runtime(target.backend.access, target.handle, {RUNNER: runner})
        if failed:
            raise OperationError(f"cannot copy {RUNNER} to the nodes: {'; '.join(failed)}")
        args = tool_args(target, name, setting, chosen, gpus, [node.name for node in nodes])
        result = launch(target, LaunchSpec("torchrun", RUNNER, tuple(args), nproc=1,
                                           run_id=run_id(f"{target.handle.name}-nccl-tests")))
    if result.outcome.interrupted:
        return result.exit_code
    log = result.log(min(result.outcome.node_exit_codes, default=0))
    report = read_output(log)
    verdict, reason = judge(report, expected)
    ranks = len(nodes) * gpus
    if verdict != FAIL and report.ranks is not None and report.ranks < ranks:
        verdict, reason = UNKNOWN, (f"{report.ranks} of the {ranks} ranks ran together: the processes did not join "
                                    f"one test (no MPI between them: srun's MPI plugin, mpirun); {reason}")
    elif verdict == UNKNOWN and not report.error and (said := _last_line(log)):
        reason += f"; node 0's log ends: {said}"
    output = summary(report, verdict, reason)
    (result.run_dir / "nccl-tests.json").write_text(json.dumps(output, indent=2) + "\n")
    if as_json:
        print_json(output)
    else:
        _print(log, report, verdict, reason, terminal_plot(points(report), expected.gbps if expected else None))
    return 1 if verdict == FAIL or (verdict == UNKNOWN and expected is not None) else 0
