"""``mlenv doctor`` for Slurm: what sinfo says about the partition against what the cluster file asks for, the
workdir and the container image. Every check runs (one failing never hides the others), except when the login
host cannot be reached, and the partition's when sinfo does not work."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from mlenv.backends.slurm.login import Login
from mlenv.backends.slurm.script import SlurmJob
from mlenv.backends.slurm.settings import minutes
from mlenv.core.capabilities import Check
from mlenv.errors import MlenvError

SINFO_FORMAT = "%N|%a|%T|%G|%l"
UNUSABLE = ("down", "drain", "fail", "maint", "inval", "unk", "future", "reboot")
"""Node states (prefixes, without sinfo's flag characters) in which no job starts there."""
WRITABLE = 'd=$1; while [ ! -e "$d" ]; do d=$(dirname "$d"); done; [ -d "$d" ] && [ -w "$d" ] && echo "$d"'
_GPUS = re.compile(r"gpu(?::[^:(,]+)?:(\d+)")


@dataclass(frozen=True)
class NodeRow:
    """One node of the partition, as sinfo shows it."""

    name: str
    partition_up: bool
    state: str
    gpus: int
    time_limit: str

    @property
    def usable(self) -> bool:
        return not self.state.strip("*~#!%$@^-+").startswith(UNUSABLE)


def parse_sinfo(text: str) -> list[NodeRow]:
    """``sinfo -h -N -p PART -o SINFO_FORMAT`` lines."""
    rows = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) == 5:
            name, available, state, gres, limit = fields
            gpus = max((int(count) for count in _GPUS.findall(gres)), default=0)
            rows.append(NodeRow(name, available == "up", state, gpus, limit))
    return rows


def _partition_checks(job: SlurmJob, rows: list[NodeRow]) -> list[Check]:
    s = job.settings
    if not rows:
        return [Check("partition", "FAIL", f"sinfo knows no partition {s.partition}",
                      "set slurm.partition to one that `sinfo -s` lists")]
    checks = [Check("partition", "PASS" if rows[0].partition_up else "FAIL",
                    f"{s.partition} is {'up' if rows[0].partition_up else 'down'}",
                    None if rows[0].partition_up else "ask the admins, or pick another slurm.partition")]
    usable = [row for row in rows if row.usable]
    enough = len(usable) >= job.nodes
    checks.append(Check("nodes", "PASS" if enough else "FAIL",
                        f"{len(usable)} of {len(rows)} nodes of {s.partition} can run jobs; {job.nodes} asked",
                        None if enough else "lower gpus.default_nodes (or --nodes), or pick a larger partition"))
    if job.gpus_per_node:
        with_gpus = [row for row in usable if row.gpus >= job.gpus_per_node]
        ok = len(with_gpus) >= job.nodes
        checks.append(Check("gpus", "PASS" if ok else "FAIL",
                            f"{len(with_gpus)} usable nodes have {job.gpus_per_node} or more GPUs (gres "
                            f"{', '.join(sorted({str(row.gpus) for row in rows}))} per node)",
                            None if ok else "lower gpus.per_node, or pick a GPU partition"))
    if job.hosts:
        missing = sorted(set(job.hosts) - {row.name for row in rows})
        checks.append(Check("nodelist", "FAIL" if missing else "PASS",
                            f"not in {s.partition}: {', '.join(missing)}" if missing
                            else f"{', '.join(job.hosts)} are in {s.partition}",
                            "fix slurm.nodelist (`sinfo -N -p PARTITION` lists the nodes)" if missing else None))
    if s.time:
        asked, limit = minutes(s.time), minutes(rows[0].time_limit)
        fits = asked is None or limit is None or asked <= limit
        checks.append(Check("time", "PASS" if fits else "FAIL",
                            f"slurm.time {s.time}; the partition allows {rows[0].time_limit}",
                            None if fits else f"lower slurm.time to {rows[0].time_limit} or less"))
    return checks


def config_value(text: str, name: str) -> str | None:
    """One ``NAME = value`` of ``scontrol show config``."""
    match = re.search(rf"^{re.escape(name)}\s*=\s*(\S*)", text, re.MULTILINE)
    return match[1] if match else None


def requeue_check(config: str) -> Check:
    """slurm.requeue against the site's JobRequeue (``scontrol show config``): 0 means the admins do not want batch
    jobs requeued. A job's own ``--requeue`` overrides it (Slurm 22.05 requeues such a job), unless the site's
    policy takes it away (a job_submit plugin, an admin's ``scontrol update Requeue=0``): then ``scontrol
    requeue`` refuses, and the run fails with its words."""
    value = config_value(config, "JobRequeue")
    if value is None:
        return Check("requeue", "WARN", "scontrol show config does not say JobRequeue", "ask the admins whether "
                     "batch jobs may be requeued")
    if value == "0":
        return Check("requeue", "WARN", "slurm.requeue is set, but this Slurm has JobRequeue=0: its admins do not "
                     "want batch jobs requeued. mlenv's #SBATCH --requeue asks for it all the same; where the site "
                     "refuses, the requeue after the warning signal fails and so does the run, with Slurm's words "
                     "in its output (\"Requested operation is presently disabled\")",
                     "ask the admins whether jobs may be requeued here, or remove slurm.requeue")
    return Check("requeue", "PASS", f"JobRequeue={value}: batch jobs may be requeued")


def _workdir_check(login: Login, job: SlurmJob) -> Check:
    result = login.run(["sh", "-c", WRITABLE, "sh", job.workdir])
    found = result.stdout.decode(errors="replace").strip()
    if result.returncode != 0 or not found:
        return Check("workdir", "FAIL", f"{job.workdir} cannot be written on {login.where}",
                     f"set slurm.workdir to a directory of yours on the shared filesystem, or "
                     f"mkdir -p {shlex.quote(job.workdir)}")
    where = "exists" if found == job.workdir else f"will be made in {found}"
    return Check("workdir", "PASS", f"{job.workdir} {where} and is writable on {login.where}")


def _container_checks(login: Login, job: SlurmJob) -> list[Check]:
    container = job.container
    if container is None:
        return []
    found = login.run(["sh", "-c", 'command -v "$1"', "sh", container.runtime])
    runtime = found.stdout.decode(errors="replace").strip()
    checks = [Check(container.runtime, "PASS" if runtime else "WARN",
                    runtime or f"{container.runtime} not on the PATH of {login.where}",
                    None if runtime else "make sure the compute nodes have it (slurm.setup can `module load` it)")]
    if "://" in container.image:
        checks.append(Check("image", "PASS", f"{container.image}: pulled by {container.runtime} when the job starts"))
    else:
        there = login.run(["test", "-r", container.image]).returncode == 0
        checks.append(Check("image", "PASS" if there else "FAIL",
                            f"{container.image} {'is there' if there else 'cannot be read'} on {login.where}",
                            None if there else "fix container.image (a .sif file on the shared filesystem)"))
    return checks


def environment_check(job: SlurmJob) -> Check:
    """Which variables mlenv's batch jobs (deploy's allocation, a launch without one) get: never the submitting
    shell's, but slurm.export's, since slurmctld saves a job's environment in its state directory."""
    carried = (f"from the shell that submits them only slurm.export's {', '.join(job.settings.export)}"
               if job.settings.export else "nothing from the shell that submits them")
    contract = ", ".join(sorted({*job.env, "MASTER_ADDR", "MASTER_PORT", "MLENV_RUN_ID", "MLENV_RUN_DIR",
                                 "MLENV_CHECKPOINT_DIR", "MLENV_RESTART_COUNT", "PYTHONPATH"}))
    return Check("environment", "PASS",
                 f"batch jobs are submitted with --export={job.settings.sbatch_export}: they get Slurm's SLURM_* "
                 f"variables and the login environment Slurm sets up on the node, {carried}; a run's steps add "
                 f"{contract}, then what slurm.setup sets")


def slurm_checks(login: Login, job: SlurmJob) -> list[Check]:
    """Every check of ``job`` against the Slurm reached through ``login``."""
    try:
        version = login.run(["sinfo", "--version"])
    except MlenvError as exc:
        return [Check("slurm", "FAIL", str(exc), "install the Slurm client tools, or set slurm.login")]
    if version.returncode != 0:
        checks = [Check("slurm", "FAIL", f"sinfo failed on {login.where}: "
                        f"{version.stderr.decode(errors='replace').strip()}", "check the Slurm client configuration")]
    else:
        checks = [Check("slurm", "PASS", f"{version.stdout.decode(errors='replace').strip()} on {login.where}")]
        listing = login.run(["sinfo", "-h", "-N", "-p", job.settings.partition, "-o", SINFO_FORMAT])
        checks += _partition_checks(job, parse_sinfo(listing.stdout.decode(errors="replace")))
    if job.settings.requeue:
        shown = login.run(["scontrol", "show", "config"])
        checks.append(requeue_check(shown.stdout.decode(errors="replace")) if shown.returncode == 0 else Check(
            "requeue", "WARN", f"scontrol show config failed: {shown.stderr.decode(errors='replace').strip()}"))
    return [*checks, _workdir_check(login, job), *_container_checks(login, job), environment_check(job)]
