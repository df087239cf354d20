"""The collective record's cost: a 2-rank gloo training loop (a matmul and an all_reduce per step) with the record's
thread running in each rank (as the runtime's sitecustomize starts it, writing every PERIOD_SECONDS) against the
same loop without it: medians of 5 runs each, the two alternating so that a change of load hits both. Both keep
PyTorch's flight recorder on, as the launcher sets it."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from mlenv.runtime.forensics.collectives import FILE_ENV, SWITCH_ENV
from mlenv.runtime.forensics.flightrecorder import TRACE_BUFFER_SIZE

from tests.bench.timing import ROOT, row, wall_time

REPEAT = 5
STEPS = 1500
PORT = 29613
JOB = f"""\
import os, torch, torch.distributed as dist
from mlenv.runtime.forensics.collectives import start_recorder
environ = dict(os.environ, {FILE_ENV}=os.path.join(os.environ["RECORDS"], "rank" + os.environ["RANK"] + ".json"))
start_recorder(environ)
dist.init_process_group("gloo")
weights, grad = torch.randn(256, 256), torch.zeros(256, 256)
for step in range({STEPS}):
    grad = weights @ weights
    dist.all_reduce(grad)
dist.destroy_process_group()
"""


def _job(directory: Path, record: bool) -> Callable[[], object]:
    script = directory / "loop.py"
    script.write_text(JOB)
    env = {**os.environ, "RECORDS": str(directory / "records"), "TORCH_FR_BUFFER_SIZE": TRACE_BUFFER_SIZE,
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tools"), os.environ.get("PYTHONPATH", "")]),
           SWITCH_ENV: "on" if record else "off", "OMP_NUM_THREADS": "1"}

    def run() -> object:
        return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               "--master-port", str(PORT), str(script)], env=env, check=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    return run


def run() -> list[dict[str, object]]:
    """Aim: the record costs <= 1 % of a training loop's time."""
    with tempfile.TemporaryDirectory(prefix="mlenv-bench-") as home:
        jobs = {record: _job(Path(home), record) for record in (False, True)}
        for job in jobs.values():  # warm-up
            job()
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(REPEAT):
            for record, job in jobs.items():
                times[record].append(wall_time(job))
        without, recorded = statistics.median(times[False]), statistics.median(times[True])
        if not any((Path(home) / "records").glob("rank*.json")):
            raise RuntimeError("the recorded loop wrote no collective record")
    return [row(f"gloo 2 ranks x {STEPS} steps, no record", without, without, "the loop without the record"),
            row(f"gloo 2 ranks x {STEPS} steps, collective record", recorded, without, "the loop without the record")]
