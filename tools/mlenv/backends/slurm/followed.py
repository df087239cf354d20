"""The batch jobs that detached runs' scripts submitted to go on without a node the restart policy left out (the
``resubmitted`` file of the run's directory, docs/runs.md): recorded as the runs' jobs once the job that submitted
one has ended, so that status, logs, stop and clean see them, with the nodes they left out for a node-fault sign
recorded as excluded; and the nodes that detached runs' scripts inside an allocation left out (the ``left`` file),
recorded the same way."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from itertools import pairwise

from mlenv.backends.slurm import record
from mlenv.backends.slurm.jobs import JobInfo
from mlenv.backends.slurm.login import Login
from mlenv.backends.slurm.script import DEPLOYMENT_FILE, SlurmJob
from mlenv.core.capabilities import Handle
from mlenv.core.registry import Records
from mlenv.runtime.supervise.slurmsteps import LEFT_FILE, RESUBMITTED_FILE

SEPARATOR = "\036"
READ = f'for path; do printf "{SEPARATOR}%s\\n" "$path"; cat -- "$path" 2>/dev/null || :; done'
"""``sh -c READ sh PATH...``: each file after a line ``<SEP>PATH`` (nothing for a missing one)."""


def follow(login: Login, records: Records, handle: Handle, job: SlurmJob, found: Mapping[str, JobInfo]) -> bool:
    """Record the jobs that the ended restartable jobs of ``handle`` (as ``found`` now) submitted, in one command on
    the login host (none when no such job has ended since it was last looked at); whether any was new. An ended
    job is marked ``followed`` (read once), with ``next``: the job it handed its run on to."""
    recorded = record.jobs(records, handle.name)
    ended = [submitted for submitted in recorded if submitted.restarts and not submitted.followed
             and submitted.id in found and not found[submitted.id].live]
    if not ended:
        return False
    paths = {f"{job.run_path(str(submitted.run))}/{RESUBMITTED_FILE}": str(submitted.run) for submitted in ended}
    known = {submitted.id for submitted in recorded}
    handed: dict[str, str] = {}  # job -> the job it handed its run on to
    for chunk in login.ok(["sh", "-c", READ, "sh", *paths]).split(SEPARATOR)[1:]:
        path, _, text = chunk.partition("\n")
        run_id = paths.get(path)
        if run_id is None:
            continue
        origin = next(submitted for submitted in recorded if submitted.run == run_id)
        lines = [parsed for parsed in map(_parse, text.splitlines()) if parsed is not None]
        chain = [origin.id, *(job_id for job_id, *_ in lines)]
        handed.update(pairwise(chain))
        for job_id, host, node, saved, why in lines:
            if job_id not in known:
                record.remember(records, handle, job_id, run_id, origin.script or "", True, origin.restarts)
                if saved:  # a node-fault sign; a node that failed first twice is left out of this run only
                    records.exclude(handle.name, {node: (host, why)})
                known.add(job_id)
    since = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for submitted in ended:
        records.update_job(handle.name, submitted.followed_at(since, handed.get(submitted.id)))
    return len(known) > len(recorded)


TAKE_LEFT = f"""root=$1 name=$2
for path in "$root"/*/{LEFT_FILE}; do
  dir=${{path%/*}}
  [ -f "$path" ] && [ "$(cat "$dir/{DEPLOYMENT_FILE}" 2>/dev/null)" = "$name" ] || continue
  mv -- "$path" "$path.$$" || continue
  printf '{SEPARATOR}%s\\n' "$path"
  cat -- "$path.$$" && cat -- "$path.$$" >> "$dir/{LEFT_FILE}.read" && rm -f -- "$path.$$"
done"""
"""``sh -c TAKE_LEFT sh RUNS_ROOT NAME``: each ``left`` file of deployment NAME's runs after a line ``<SEP>PATH``,
taken (read once: its lines go on to ``left.read``)."""


def left_out(login: Login, records: Records, handle: Handle, runs_root: str) -> None:
    """Record as excluded the nodes that detached runs' scripts inside ``handle``'s allocation left out for a
    node-fault sign since this was last asked (one command on the login host)."""
    for chunk in login.ok(["sh", "-c", TAKE_LEFT, "sh", runs_root, handle.name]).split(SEPARATOR)[1:]:
        for host, node, saved, why in filter(None, map(_left, chunk.partition("\n")[2].splitlines())):
            if saved:
                records.exclude(handle.name, {node: (host, why)})


SAVED = {"saved=1": True, "saved=0": False}
"""The policy's word on the left-out node, as the script writes it: recorded as excluded for later runs, or not."""


def _parse(line: str) -> tuple[str, str, int, bool, str] | None:
    """``<job id> <host> <node> saved=<0|1> <why>``; None for a line that is not one. A line an earlier version
    wrote, ``<job id> <host> <node> <why>``, says nothing typed of the node: it is not recorded as excluded."""
    job_id, _, rest = line.partition(" ")
    left = _left(rest)
    return (job_id, *left) if job_id.isdigit() and left is not None else None


def _left(line: str) -> tuple[str, int, bool, str] | None:
    """``<host> <node> saved=<0|1> <why>`` (saved=0 where the flag is missing); None for a line that is not one."""
    host, node, rest = (*line.split(" ", 2), "", "")[:3]
    flag, _, why = rest.partition(" ")
    saved = SAVED.get(flag)
    if saved is None:
        saved, why = False, rest
    return (host, int(node), saved, why) if host and node.isdigit() else None
