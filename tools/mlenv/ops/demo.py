"""``mlenv demo``: the whole workflow on this machine with no cluster: deploy clusters/local.yaml, sync
workspace/, train with DeepSpeed on 2 nodes x 2 processes, measure all-reduce bandwidth, check the transport,
print a summary and clean up."""

from __future__ import annotations

import re
import time

from mlenv.backends.base import Backend
from mlenv.ops.launch import launch
from mlenv.ops.nccltest import PEAK, find_in_logs, transport
from mlenv.plan import Deployment

DONE = re.compile(r"done steps=(\d+) first_loss=(\S+) last_loss=(\S+) world_size=(\d+)")
STAGES = 6


def _stage(number: int, text: str) -> None:
    from mlenv.ui import info

    info(f"\n==> [{number}/{STAGES}] {text}")


def _deploy(backend: Backend, deployment: Deployment) -> None:
    from mlenv import state

    backend.deploy(deployment, timeout=120, on_applied=lambda: state.record(deployment))


def _clean(backend: Backend, deployment: Deployment) -> None:
    from mlenv import state

    backend.clean(deployment, delete_data=True)
    state.forget(deployment)


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
        carried_by, _ = transport([trained.log(n) for n in sorted(trained.node_exit_codes)])
    finally:
        if keep:
            info("\nkept the local cluster: mlenv status / mlenv shell / mlenv clean --cluster local")
        else:
            _stage(6, "clean up")
            _clean(backend, deployment)
    done, peak = find_in_logs(DONE, trained), find_in_logs(PEAK, bench)
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
        ["transport", carried_by],
        ["logs", f"{trained.run_dir}, {bench.run_dir}"],
        ["wall time", f"{time.monotonic() - started:.0f} s"],
    ])
    if not last < first:
        error(f"the loss did not fall ({first:.4f} -> {last:.4f})")
        return 1
    return 0
