"""Smoke tests of the private Slurm (tests/integration/slurm_cluster.py), pinning the behaviour of Slurm 22.05
that the Slurm backend relies on: output formats, job states, exit codes, error texts and step environments."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported at run time as a plugin, so that pytest rewrites its asserts
    from tests.integration.slurm_cluster import SlurmCluster

pytest_plugins = ["tests.integration.slurm_cluster"]

STEP_VARIABLES = ("SLURMD_NODENAME", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_NODELIST",
                  "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_NODEID", "SLURM_PROCID", "SLURM_LOCALID",
                  "SLURM_NTASKS", "CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE")

# The seeds' pattern: find the head node and its address from inside the job, then one task per node writes
# its rank and node; the script's own exit code becomes the job's.
BATCH_SCRIPT = """\
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --job-name=harness
#SBATCH --output={out}/job_%j.out
nodes=( $(scontrol show hostnames "$SLURM_JOB_NODELIST") )
srun --nodes=1 --ntasks=1 -w "${{nodes[0]}}" hostname --ip-address > {out}/head.txt
echo "${{nodes[0]}}" >> {out}/head.txt
srun -l bash -c 'echo "$SLURM_PROCID $SLURMD_NODENAME" > {out}/rank_$SLURM_PROCID.txt; echo wrote'
exit 3
"""


def task_env(output: str) -> dict[int, dict[str, str]]:
    """``srun -l env`` output as {task: {variable: value}}, for :data:`STEP_VARIABLES` only."""
    tasks: dict[int, dict[str, str]] = {}
    for task, name, value in re.findall(r"^(\d+): (\w+)=(.*)$", output, re.MULTILINE):
        if name in STEP_VARIABLES:
            tasks.setdefault(int(task), {})[name] = value
    return tasks


def sorted_lines(output: str) -> list[str]:
    """Lines of tasks' output, which arrive in any order."""
    return sorted(output.splitlines())


def local_ip_address() -> str:
    return subprocess.run(["hostname", "--ip-address"], capture_output=True, text=True, timeout=10,
                          check=True).stdout


def test_srun_runs_one_task_on_each_node(slurm_cluster: SlurmCluster) -> None:
    hostname = subprocess.run(["hostname"], capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    assert slurm_cluster.ok("srun", "-N2", "-w", "n1,n2", "hostname") == f"{hostname}\n{hostname}\n"  # one host
    assert sorted_lines(slurm_cluster.ok("srun", "-N2", "-w", "n1,n2", "-l", "printenv", "SLURMD_NODENAME")) == [
        "0: n1", "1: n2"]
    # The seed's head-node lookup: every node is this machine, so the answer is this machine's address.
    assert slurm_cluster.ok("srun", "-w", "n1", "hostname", "--ip-address") == local_ip_address()


def test_step_environment_and_gpus(slurm_cluster: SlurmCluster) -> None:
    output = slurm_cluster.ok("srun", "-N2", "--ntasks-per-node=1", "--gpus-per-node=1", "-l", "env")
    tasks = task_env(output)
    job_id = tasks[0]["SLURM_JOB_ID"]
    common = {"SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODELIST": "n[1-2]",
              "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_LOCALID": "0",
              "SLURM_NTASKS": "2", "CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "1"}
    assert tasks == {rank: {**common, "SLURMD_NODENAME": f"n{rank + 1}", "SLURM_NODEID": str(rank),
                            "SLURM_PROCID": str(rank)} for rank in (0, 1)}


def test_batch_job_on_two_nodes(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_text(BATCH_SCRIPT.format(out=tmp_path))
    job_id = slurm_cluster.ok("sbatch", "--parsable", str(tmp_path / "job.sh")).strip()
    assert job_id.isdigit()  # no ";cluster": that comes only with --clusters
    job = slurm_cluster.wait_finished(job_id)
    assert {k: job[k] for k in ("JobState", "Reason", "ExitCode", "NodeList", "BatchHost", "StdOut")} == {
        "JobState": "FAILED", "Reason": "NonZeroExitCode", "ExitCode": "3:0", "NodeList": "n[1-2]",
        "BatchHost": "n1", "StdOut": f"{tmp_path}/job_{job_id}.out"}
    # Ended jobs leave squeue's default view (pending, running, completing) at once; -t all still shows them.
    assert slurm_cluster.ok("squeue", "-h", f"--jobs={job_id}", "-o", "%T|%r|%N") == ""
    assert slurm_cluster.ok("squeue", "-h", f"--jobs={job_id}", "-t", "all", "-o", "%T|%r|%N") == (
        "FAILED|NonZeroExitCode|n[1-2]\n")
    assert (tmp_path / "head.txt").read_text() == local_ip_address() + "n1\n"
    assert [(tmp_path / f"rank_{r}.txt").read_text() for r in (0, 1)] == ["0 n1\n", "1 n2\n"]
    assert sorted_lines((tmp_path / f"job_{job_id}.out").read_text()) == ["0: wrote", "1: wrote"]

    ok_id = slurm_cluster.ok("sbatch", "--parsable", "--wrap", "true").strip()
    assert {k: v for k, v in slurm_cluster.wait_finished(ok_id).items() if k in ("JobState", "ExitCode")} == {
        "JobState": "COMPLETED", "ExitCode": "0:0"}


def test_pending_reasons_and_scancel(slurm_cluster: SlurmCluster) -> None:
    held = slurm_cluster.ok("sbatch", "--parsable", "--hold", "--wrap", "true").strip()
    down = slurm_cluster.ok("sbatch", "--parsable", "-p", "down", "--wrap", "true").strip()
    too_big = slurm_cluster.ok("sbatch", "--parsable", "-N3", "--wrap", "true").strip()  # EnforcePartLimits=NO

    def reasons() -> list[str]:
        return [slurm_cluster.ok("squeue", "-h", f"--jobs={j}", "-o", "%T|%r|%N").strip() for j in (held, down,
                                                                                                      too_big)]

    # Right after submission the too-big job's reason is PartitionConfig; the scheduler then refines it.
    slurm_cluster.wait(lambda: reasons()[2] != "PENDING|PartitionConfig|", "the scheduler to look at the jobs", 15)
    assert reasons() == ["PENDING|JobHeldUser|", "PENDING|PartitionDown|", "PENDING|PartitionNodeLimit|"]
    assert slurm_cluster.job(held)["Reason"] == "JobHeldUser"
    slurm_cluster.ok("scancel", held, down, too_big)
    assert [slurm_cluster.wait_finished(j)["JobState"] for j in (held, down, too_big)] == ["CANCELLED"] * 3
    unknown = slurm_cluster.run("scancel", "999999")
    assert (unknown.returncode, unknown.stdout, unknown.stderr) == (0, "", "")  # says nothing without -v


def test_invalid_partition_is_rejected(slurm_cluster: SlurmCluster) -> None:
    result = slurm_cluster.run("sbatch", "--parsable", "-p", "nosuch", "--wrap", "true")
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == ("sbatch: error: invalid partition specified: nosuch\n"
                             "sbatch: error: Batch job submission failed: Invalid partition name specified\n")
    # Without accounting, an account is not checked at all.
    account = slurm_cluster.ok("sbatch", "--parsable", "-A", "nosuch", "--wrap", "true").strip()
    assert slurm_cluster.wait_finished(account)["JobState"] == "COMPLETED"


def hold_allocation(cluster: SlurmCluster, how: str) -> str:
    """A running two-node job with no step of its own: ``salloc --no-shell``, or ``sbatch`` of a sleeper."""
    if how == "salloc":
        granted = cluster.run("salloc", "--no-shell", "-N2", "-J", "holder")
        assert granted.returncode == 0, granted.stderr
        match = re.search(r"^salloc: Granted job allocation (\d+)$", granted.stderr, re.MULTILINE)
        assert match, granted.stderr
        return match[1]
    job_id = cluster.ok("sbatch", "--parsable", "-N2", "-J", "holder", "--output=/dev/null", "--wrap",
                        "exec sleep 600").strip()
    cluster.wait_running(job_id)
    return job_id


@pytest.mark.parametrize("how", ["salloc", "sbatch"])
def test_steps_join_a_held_allocation(slurm_cluster: SlurmCluster, how: str) -> None:
    job_id = hold_allocation(slurm_cluster, how)
    assert slurm_cluster.state(job_id) == "RUNNING"
    assert slurm_cluster.ok("srun", f"--jobid={job_id}", "--overlap", "-w", "n2", "printenv",
                            "SLURMD_NODENAME") == "n2\n"
    tasks = task_env(slurm_cluster.ok("srun", f"--jobid={job_id}", "--overlap", "-w", "n2", "-N1", "-l", "env"))
    # A step started from outside the job: SLURM_JOB_NODELIST is the STEP's nodes, SLURM_NODELIST the job's,
    # and SLURM_JOB_NUM_NODES is not set.
    assert tasks == {0: {"SLURMD_NODENAME": "n2", "SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": "n2",
                         "SLURM_NODELIST": "n[1-2]", "SLURM_STEP_NODELIST": "n2", "SLURM_NNODES": "1",
                         "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1"}}
    # From outside, srun does not know the job's size: without -N it runs on the first node only.
    every = ("srun", f"--jobid={job_id}", "--overlap", "--ntasks-per-node=1", "-l", "printenv", "SLURMD_NODENAME")
    assert slurm_cluster.ok(*every) == "0: n1\n"
    assert sorted_lines(slurm_cluster.ok(*every[:3], "-N2", *every[3:])) == ["0: n1", "1: n2"]
    slurm_cluster.ok("scancel", job_id)
    assert slurm_cluster.wait_finished(job_id)["JobState"] == "CANCELLED"


def test_overlap_is_needed_beside_a_running_step(slurm_cluster: SlurmCluster) -> None:
    job_id = slurm_cluster.ok("sbatch", "--parsable", "-N2", "--output=/dev/null", "--wrap", "srun sleep 600").strip()
    slurm_cluster.wait(lambda: f"{job_id}.0" in slurm_cluster.ok("squeue", "-h", "-s", f"--jobs={job_id}", "-o", "%i"),
                       f"step {job_id}.0 to run", 30)
    busy = slurm_cluster.run("srun", f"--jobid={job_id}", "-w", "n2", "-N1", "--immediate=2", "true")
    assert (busy.returncode, busy.stderr) == (
        1, f"srun: error: Unable to create step for job {job_id}: Requested nodes are busy\n")
    assert slurm_cluster.ok("srun", f"--jobid={job_id}", "--overlap", "-w", "n2", "-N1", "echo", "beside") == "beside\n"


def test_kill_on_bad_exit(slurm_cluster: SlurmCluster) -> None:
    task = 'if [ "$SLURM_PROCID" = 1 ]; then exit 7; fi; exec sleep {}'
    began = time.monotonic()
    killed = slurm_cluster.run("srun", "-N2", "--kill-on-bad-exit=1", "bash", "-c", task.format(60))
    assert time.monotonic() - began < 20
    failed = "srun: error: n2: task 1: Exited with exit code 7\n"
    assert failed in killed.stderr
    # The highest of 7 and 128 + the signal that ended task 0: SIGTERM, or SIGKILL ("task 0: Killed").
    assert killed.returncode in (143, 137), killed.stderr
    # Right after a job, srun may first say "srun: job N queued and waiting for resources" (nodes completing).
    waited = slurm_cluster.run("srun", "-N2", "--kill-on-bad-exit=0", "bash", "-c", task.format(1))
    assert waited.returncode == 7
    assert waited.stderr.endswith(failed)


def test_sinfo_and_hostnames(slurm_cluster: SlurmCluster) -> None:
    assert slurm_cluster.ok("sinfo", "-h", "-o", "%P|%a|%D|%F|%G|%l") == (
        "debug*|up|2|0/2/0/2|gpu:2|infinite\ndown|down|2|0/2/0/2|gpu:2|infinite\n")
    assert slurm_cluster.ok("sinfo", "-h", "-N", "-p", "debug", "-o", "%N|%T|%c|%G") == (
        "n1|idle|4|gpu:2\nn2|idle|4|gpu:2\n")
    assert slurm_cluster.ok("scontrol", "show", "hostnames", "n[1-2],gpu-[08-10]") == "n1\nn2\ngpu-08\ngpu-09\ngpu-10\n"


def test_harness_finds_and_clears_job_processes(slurm_cluster: SlurmCluster) -> None:
    job_id = slurm_cluster.ok("sbatch", "--parsable", "-N2", "--output=/dev/null", "--wrap", "srun sleep 600").strip()

    def commands() -> list[str]:
        return list(slurm_cluster.processes().values())

    slurm_cluster.wait(lambda: [c.endswith("/sleep 600") for c in commands()].count(True) == 2, "both sleeps", 30)
    assert {f"slurmstepd: [{job_id}.batch]", f"slurmstepd: [{job_id}.0]"} <= set(commands())
    slurm_cluster.cancel_all()
    slurm_cluster.wait(lambda: not slurm_cluster.processes(), "job processes to end", 10)
