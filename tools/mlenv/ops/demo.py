"""``mlenv demo``: the whole workflow on this machine with no cluster: deploy clusters/local.yaml, sync
workspace/, train with DeepSpeed on 2 nodes x 2 processes, measure all-reduce bandwidth, check the transport,
print a summary and clean up."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from mlenv.backends.base import Backend
from mlenv.ops.launch import LaunchResult, launch
from mlenv.plan import Deployment

DONE = re.compile(r"done steps=(\d+) first_loss=(\S+) last_loss=(\S+) world_size=(\d+)")
PEAK = re.compile(r"peak_busbw_gbps=([\d.]+) size_bytes=(\d+)")
STAGES = 6


def _stage(number: int, text: str) -> None:
    from mlenv.ui import info

    info(f"\n==> [{number}/{STAGES}] {text}")


def _find(pattern: re.Pattern[str], result: LaunchResult) -> re.Match[str] | None:
    """The last match of ``pattern`` in the node logs of ``result`` (rank 0 prints on node 0)."""
    for ordinal in sorted(result.node_exit_codes):
        matches = list(pattern.finditer(result.log(ordinal).read_text(errors="replace")))
        if matches:
            return matches[-1]
    return None


def _transport(logs: list[Path]) -> str:
    """The runtime's NCCL log check over the node logs; on CPU no NCCL line appears: gloo over sockets."""
    check = subprocess.run([sys.executable, "-m", "mlenv.runtime", "nccl-log-check", "--json",
                            *map(str, logs)], capture_output=True, text=True, check=False)
    try:
        report = json.loads(check.stdout)
    except ValueError:
        return f"unknown (nccl-log-check failed: {check.stderr.strip()})"
    if not report.get("ranks"):
        return "gloo over TCP sockets (CPU; no NCCL in use)"
    return f"NCCL: {report['verdict']}"


def _deploy(backend: Backend, deployment: Deployment) -> None:
    from mlenv import state

    backend.deploy(deployment, timeout=120)
    state.save(state.ActiveDeployment(
        cluster_file=deployment.cluster.source, mode=deployment.mode, nodes=deployment.nodes, image=None,
        namespace=deployment.namespace, app=deployment.app, backend=deployment.cluster.backend))


def _clean(backend: Backend, deployment: Deployment) -> None:
    from mlenv import state

    backend.clean(deployment, delete_data=True)
    state.forget(deployment.cluster.source)


def run_demo(keep: bool = False, steps: int = 30) -> int:
    """Run the demo; 0 when training ended with a lower loss than it started with."""
    from mlenv.backends import backend_for
    from mlenv.config import load_cluster
    from mlenv.ops.sync import sync
    from mlenv.plan import plan
    from mlenv.ui import error, info, table

    started = time.monotonic()
    deployment = plan(load_cluster("local"))
    backend = backend_for(deployment.cluster)
    try:
        _stage(1, f"deploy the local cluster: {deployment.nodes} pods x {deployment.procs_per_node} processes")
        _deploy(backend, deployment)
        _stage(2, "sync workspace/ (and the in-pod runtime) to every pod")
        if not sync(backend, deployment).ok:
            return 1
        _stage(3, f"train train_multi_node.py with DeepSpeed ZeRO-2 for {steps} steps")
        trained = launch(backend, deployment, launcher="deepspeed", script="train_multi_node.py",
                         args=["--steps", str(steps)])
        if trained.exit_code != 0:
            return trained.exit_code
        _stage(4, "all-reduce bandwidth across every rank")
        bench = launch(backend, deployment, launcher="torchrun", script="allreduce_bench.py")
        if bench.exit_code != 0:
            return bench.exit_code
        _stage(5, "transport check of the node logs")
        transport = _transport([trained.log(n) for n in sorted(trained.node_exit_codes)])
    finally:
        if keep:
            info("\nkept the local cluster: mlenv status / mlenv shell / mlenv clean --cluster local")
        else:
            _stage(6, "clean up")
            _clean(backend, deployment)
    done, peak = _find(DONE, trained), _find(PEAK, bench)
    if done is None:
        error(f"training printed no 'done' line; see {trained.run_dir}")
        return 1
    first, last = float(done.group(2)), float(done.group(3))
    table("mlenv demo", ["WHAT", "RESULT"], [
        ["nodes x processes", f"{deployment.nodes} x {deployment.procs_per_node}"],
        ["world size", done.group(4)],
        ["steps", done.group(1)],
        ["loss first -> last", f"{first:.4f} -> {last:.4f}"],
        ["all-reduce peak busbw", f"{peak.group(1)} GB/s at {peak.group(2)} bytes" if peak else "-"],
        ["transport", transport],
        ["logs", f"{trained.run_dir}, {bench.run_dir}"],
        ["wall time", f"{time.monotonic() - started:.0f} s"],
    ])
    if not last < first:
        error(f"the loss did not fall ({first:.4f} -> {last:.4f})")
        return 1
    return 0
