"""``mlenv nccl-test``: all-reduce bus bandwidth across every node, and, from NCCL's own log, the transport
that carried it (RDMA+GDR, RDMA, sockets) checked against the deployment's network mode."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from mlenv.backends.base import Backend
from mlenv.ops.launch import LaunchResult, launch
from mlenv.plan import Deployment

PEAK = re.compile(r"peak_busbw_gbps=([\d.]+) size_bytes=(\d+)")


def find_in_logs(pattern: re.Pattern[str], result: LaunchResult) -> re.Match[str] | None:
    """The last match of ``pattern`` in the first node log that has one (global rank 0 may be on any node)."""
    for ordinal in sorted(result.node_exit_codes):
        matches = list(pattern.finditer(result.log(ordinal).read_text(errors="replace")))
        if matches:
            return matches[-1]
    return None


def transport(logs: Sequence[Path], expect: str | None = None) -> tuple[str, bool]:
    """(what carried the collectives, whether that matches ``expect``), from the runtime's nccl-log-check."""
    check = subprocess.run([sys.executable, "-m", "mlenv.runtime", "nccl-log-check", "--json",
                            *(["--expect", expect] if expect else []), *map(str, logs)],
                           capture_output=True, text=True, check=False)
    try:
        report = json.loads(check.stdout)
    except ValueError:
        return f"unknown (nccl-log-check failed: {check.stderr.strip()})", False
    if not report.get("ranks"):
        return "gloo over TCP sockets (no NCCL in use)", expect is None
    return f"NCCL {report['verdict']}", check.returncode == 0


def run_nccl_test(backend: Backend, deployment: Deployment, nproc: int | None = None) -> int:
    """Run workspace/allreduce_bench.py on every node; 1 when it fails or RDMA was expected but not used."""
    from mlenv.ui import error, table

    result = launch(backend, deployment, launcher="torchrun", script="allreduce_bench.py", nproc=nproc)
    if result.exit_code != 0:
        return result.exit_code
    expect = "rdma" if deployment.mode == "rdma" else None
    verdict, ok = transport([result.log(n) for n in sorted(result.node_exit_codes)], expect)
    peak = find_in_logs(PEAK, result)
    table("mlenv nccl-test", ["WHAT", "RESULT"], [
        ["nodes", str(deployment.nodes)],
        ["peak bus bandwidth", f"{peak.group(1)} GB/s at {peak.group(2)} bytes" if peak else "-"],
        ["transport", verdict],
        ["expected", deployment.mode],
        ["logs", str(result.run_dir)],
    ])
    if not ok:
        error(f"{deployment.mode} mode, but the job ran over: {verdict}; see mlenv nccl-test logs in {result.run_dir}"
              + (" (set nccl.debug: INFO in the cluster file so NCCL logs its transport)"
                 if "NCCL_DEBUG" not in deployment.env else ""))
        return 1
    return 0
