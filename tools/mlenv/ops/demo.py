"""``mlenv demo``: the whole workflow on this machine with no cluster: deploy clusters/local.yaml, sync
workspace/, train with DeepSpeed on 2 nodes x 2 processes, measure all-reduce bandwidth, check the transport,
print a summary and clean up."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from mlenv import state
from mlenv.core.capabilities import LaunchSpec
from mlenv.core.clusters import load_plan
from mlenv.ops.deploy import deploy
from mlenv.ops.launch import launch, run_id
from mlenv.ops.nccltest import PEAK, find_in_logs, transport
from mlenv.ops.sync import sync
from mlenv.ops.target import Target, backend_of
from mlenv.ui import error, info, table

DONE = re.compile(r"done steps=(\d+) first_loss=(\S+) last_loss=(\S+) world_size=(\d+)")
STAGES = 6


def _stage(number: int, text: str) -> None:
    info(f"\n==> [{number}/{STAGES}] {text}")


@dataclass(frozen=True)
class Before:
    """What of the local cluster existed before the demo: the demo leaves exactly that behind."""

    pods: bool
    """Pods were running: the demo reuses them and leaves them (and their data) as they were."""
    data: bool
    """Pod workspaces were kept by an earlier clean: the demo's clean keeps them too."""
    recorded: bool
    """The local cluster was recorded in .mlenv/state.json: the demo leaves the record."""
    current: str | None
    """The current deployment: the demo makes it current again at the end."""


def _before(target: Target) -> Before:
    existing = target.backend.deploy.status(target.handle)
    recorded = state.load()
    return Before(pods=any(pod.phase != "Missing" for pod in existing), data=bool(existing),
                  recorded=target.handle.name in recorded.deployments, current=recorded.current)


def _finish(target: Target, before: Before, keep: bool) -> None:
    """Clean up what the demo created, nothing else."""
    if keep or before.pods:
        why = "as asked" if keep else "it was running before the demo"
        info(f"\nkept the local cluster ({why}): mlenv status|shell|clean --cluster local")
        return
    _stage(6, "clean up" + (" (the pod workspaces an earlier clean kept stay)" if before.data else ""))
    target.backend.deploy.clean(target.handle, delete_data=not before.data)
    if not before.recorded:
        state.forget(target.handle.name)
    if before.current is not None and before.current in state.load().deployments:
        state.use(before.current)


def run_demo(keep: bool = False, steps: int = 30) -> int:
    """Run the demo; 0 when training ended with a lower loss than it started with."""
    started = time.monotonic()
    job = load_plan("local")
    backend = backend_of(job.cluster.backend)
    target = Target(backend, backend.deploy.prepare(job).handle, None, job)
    before = _before(target)
    try:
        _stage(1, f"deploy the local cluster: {job.nodes} pods x {job.procs_per_node} processes")
        deploy(job, None, timeout=120)
        _stage(2, "sync workspace/ (and the in-pod runtime) to every pod")
        if not sync(backend.access, target.handle).ok:
            return 1
        _stage(3, f"train train_multi_node.py with DeepSpeed ZeRO-2 for {steps} steps (a first run waits about a "
                  "minute with no output while DeepSpeed compiles its ops; later runs reuse them)")
        trained = launch(target, LaunchSpec("deepspeed", "train_multi_node.py", ("--steps", str(steps)),
                                            run_id=run_id(job.app)))
        if trained.exit_code != 0:
            return trained.exit_code
        _stage(4, "all-reduce bandwidth across every rank")
        bench = launch(target, LaunchSpec("torchrun", "allreduce_bench.py", run_id=run_id(job.app)))
        if bench.exit_code != 0:
            return bench.exit_code
        _stage(5, "transport check of the node logs")
        carried_by, _ = transport([trained.log(n) for n in sorted(trained.outcome.node_exit_codes)])
    finally:
        _finish(target, before, keep)
    done, peak = find_in_logs(DONE, trained), find_in_logs(PEAK, bench)
    if done is None:
        error(f"training printed no 'done' line; see {trained.run_dir}")
        return 1
    first, last = float(done.group(2)), float(done.group(3))
    table("mlenv demo", ["WHAT", "RESULT"], [
        ["nodes x processes", f"{job.nodes} x {job.procs_per_node}"],
        ["world size", done.group(4)],
        ["steps", done.group(1)],
        ["loss first -> last", f"{first:.4f} -> {last:.4f}"],
        ["all-reduce peak busbw", f"{float(peak.group(1)):.4g} GB/s at {peak.group(2)} bytes" if peak else "-"],
        ["transport", carried_by],
        ["logs", f"{trained.run_dir}, {bench.run_dir}"],
        ["wall time", f"{time.monotonic() - started:.0f} s"],
    ])
    if not last < first:
        error(f"the loss did not fall ({first:.4f} -> {last:.4f})")
        return 1
    return 0
