"""The Slurm backend on a private local Slurm (tests/integration/slurm_cluster.py): wall time of `mlenv launch` of a
tiny 2x2 torchrun job as a batch job, against the same job submitted by hand with a minimal sbatch script (the
seeds' head-node lookup, one torchrun per node) and waited for with the same squeue polling. The two alternate
(a warm-up pair, then REPEAT pairs; medians), so that both see the same load on a shared machine. Aim: <= 1.2x."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests._prereq import clean_environ
from tests.bench.timing import row, wall_time
from tests.helpers import MLENV
from tests.integration.slurm_cluster import CLIENTS, DAEMONS, SlurmCluster, _tool, running_cluster

REPEAT = 3
POLL_SECONDS = 0.25
"""mlenv's own squeue polling interval (mlenv.backends.slurm.waiting.POLL_SECONDS)."""
HAND_PORT = 29620
TINY_JOB = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
for step in range(1, 4):
    dist.all_reduce(t)
if dist.get_rank() == 0:
    print(f"done world_size={dist.get_world_size()} sum={t[0].item():.0f}", flush=True)
dist.destroy_process_group()
"""
HAND_SCRIPT = """\
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --chdir={workdir}
#SBATCH --output={workdir}/hand-%j.out
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
addr=$(srun --nodes=1 --ntasks=1 -w "$head" hostname --ip-address | awk '{{print $1}}')
export GLOO_SOCKET_IFNAME=lo
srun sh -c 'exec {python} -m torch.distributed.run --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
  --rdzv-endpoint "$1:{port}" --rdzv-id "hand-$SLURM_JOB_ID" --local-addr "$1" \\
  --rdzv-conf is_host=$([ "$SLURM_NODEID" = 0 ] && echo true || echo false) tiny.py' sh "$addr"
"""
CLUSTER = """\
backend: slurm
cluster: {{name: bench}}
slurm:
  partition: debug
  workdir: {workdir}
  setup: ["source {venv}/bin/activate"]
gpus: {{per_node: 0, default_nodes: 2, procs_per_node: 2}}
"""


def _by_hand(cluster: SlurmCluster, script: Path) -> Callable[[], object]:
    """sbatch the minimal script, then poll squeue until the job has left it; fail unless it completed."""

    def run() -> object:
        job_id = cluster.ok("sbatch", "--parsable", str(script)).strip()
        while cluster.state(job_id):
            time.sleep(POLL_SECONDS)
        if cluster.job(job_id)["ExitCode"] != "0:0":
            raise RuntimeError(f"the job by hand failed: {cluster.job(job_id)}")
        return job_id

    return run


def _mlenv(env: dict[str, str], home: Path) -> Callable[[], object]:
    mlenv = str(MLENV)

    def run() -> object:
        return subprocess.run([mlenv, "launch", "-c", "bench", "--launcher", "torchrun", "tiny.py"], env=env, cwd=home,
                              check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)

    return run


def _alternating(first: Callable[[], object], second: Callable[[], object]) -> tuple[float, float]:
    """Median wall times of ``first`` and ``second``, run in turns after one unmeasured turn."""
    first(), second()
    times = [(wall_time(first), wall_time(second)) for _ in range(REPEAT)]
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)


def run() -> list[dict[str, object]]:
    """Aim: mlenv launch of a batch job <= 1.2x of the same job submitted by hand."""
    if os.geteuid() != 0 or not all(shutil.which(_tool(name)) for name in (*DAEMONS, *CLIENTS)):
        print("bench_slurm: skipped (needs root and Debian's slurm-wlm and munge: make install-system)",
              file=sys.stderr)
        return []
    with tempfile.TemporaryDirectory(prefix="mlenv-bench-slurm-") as tmp, running_cluster() as cluster:
        home, workdir = Path(tmp) / "home", Path(tmp) / "work"
        (home / "clusters").mkdir(parents=True)
        (home / "workspace").mkdir()
        (home / "workspace" / "tiny.py").write_text(TINY_JOB)
        venv = Path(sys.executable).parent.parent
        (home / "clusters" / "bench.yaml").write_text(CLUSTER.format(workdir=workdir, venv=venv))
        env = clean_environ({**cluster.env, "MLENV_HOME": str(home)})
        subprocess.run([str(venv / "bin" / "mlenv"), "sync", "-c", "bench"], env=env, cwd=home, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
        script = Path(tmp) / "hand.sbatch"
        script.write_text(HAND_SCRIPT.format(workdir=workdir, python=sys.executable, port=HAND_PORT))
        by_hand, launch = _alternating(_by_hand(cluster, script), _mlenv(env, home))
    return [row("sbatch 2x2 torchrun by hand + squeue polling", by_hand, by_hand, "sbatch by hand"),
            row("mlenv launch torchrun 2x2 (batch job)", launch, by_hand, "sbatch by hand")]
