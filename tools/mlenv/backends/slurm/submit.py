"""Submitting with sbatch, and shipping the in-node runtime to the workdir when sync has not."""

from __future__ import annotations

import io
import tarfile

from mlenv.backends.slurm.login import Login
from mlenv.core.remote import runtime_files
from mlenv.errors import OperationError

HINTS = (
    ("invalid partition", "check slurm.partition: `sinfo -s` lists the partitions"),
    ("invalid account", "check slurm.account: `sacctmgr show associations user=$USER` lists yours"),
    ("invalid qos", "check slurm.qos: `sacctmgr show associations user=$USER format=qos` lists yours"),
    ("time limit", "check slurm.time against the partition's limit (`sinfo -o '%P %l'`)"),
    ("node count", "lower gpus.default_nodes (or --nodes), or pick a larger partition"),
    ("feature", "check slurm.constraint: `sinfo -o '%N %f'` lists the nodes' features"),
    ("memory", "check slurm.mem against the nodes' memory (`sinfo -o '%N %m'`)"),
)
GENERIC_HINT = "`mlenv doctor` checks the cluster file against this Slurm"
SUBMIT = 'mkdir -p "$1" || exit 1; unset SBATCH_EXPORT; exec sbatch --parsable'
"""Make the directory of the output file (sbatch does not), then submit the script that follows on stdin, with its
own ``#SBATCH --export`` (SBATCH_EXPORT would override it). Never with a forwarded secret: slurmctld saves a batch
job's environment in its state directory."""
RUNTIME_MARKER = "mlenv/runtime/__main__.py"
SHIP = f'test -e "$1/{RUNTIME_MARKER}" && exit 0; mkdir -p "$1" && exec tar -xf - -C "$1"'


class SubmitError(OperationError):
    """sbatch refused the job: its own words and what to check."""


def hint(stderr: str) -> str:
    """What to check for an sbatch error message."""
    lowered = stderr.lower()
    return next((text for words, text in HINTS if words in lowered), GENERIC_HINT)


def submit(login: Login, output_dir: str, script: str) -> str:
    """Submit ``script``; the job id. SubmitError with sbatch's message, verbatim, and a hint."""
    result = login.run(["sh", "-c", SUBMIT, "sh", output_dir], stdin=script.encode())
    stderr = result.stderr.decode(errors="replace").strip()
    job_id = result.stdout.decode(errors="replace").strip().split(";")[0]
    if result.returncode != 0 or not job_id.isdigit():
        raise SubmitError(f"sbatch refused the job on {login.where}:\n{stderr or f'exit code {result.returncode}'}\n"
                          f"hint: {hint(stderr)}")
    return job_id


def runtime_archive() -> bytes:
    """The runtime's files (``runtime_files``: mlenv/__init__.py and mlenv/runtime/, stdlib only) as a tar archive."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path, shipped in runtime_files():
            archive.add(path, shipped)
    return buffer.getvalue()


def ship_runtime(login: Login, runtime_path: str) -> None:
    """Copy the runtime to ``runtime_path`` unless it is there already (mlenv sync ships it)."""
    result = login.run(["sh", "-c", SHIP, "sh", runtime_path], stdin=runtime_archive())
    if result.returncode != 0:
        raise OperationError(f"cannot copy the mlenv runtime to {runtime_path} on {login.where}: "
                             f"{result.stderr.decode(errors='replace').strip()}; run mlenv sync")
