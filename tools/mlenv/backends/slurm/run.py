"""Running a launch: as a batch job (no allocation), or as steps inside the deployment's allocation.

A batch job is submitted, recorded, waited for while pending (Slurm's reason live) and followed by polling squeue
and reading its output file, as ``sbatch --wait`` would not (it returns long after the job). Inside an allocation
the launch script runs where Slurm's commands are, its srun output streamed. Either way the job's exit code is
the first failing node's own (the script's last line names it), and Ctrl-C stops the job.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mlenv.backends.slurm import jobs, record
from mlenv.backends.slurm.jobs import JobInfo
from mlenv.backends.slurm.login import Login
from mlenv.backends.slurm.output import NodeOutput
from mlenv.backends.slurm.script import OUTPUT_FILE, SlurmJob, step_name
from mlenv.backends.slurm.submit import SubmitError, ship_runtime, submit
from mlenv.backends.slurm.waiting import POLL_SECONDS, CannotStart, wait_started
from mlenv.core import remote
from mlenv.core.capabilities import Handle, LaunchOutcome, LaunchRequest
from mlenv.core.registry import Records
from mlenv.errors import OperationError
from mlenv.parallel import interrupted_by_sigterm, run_parallel
from mlenv.runtime.supervise.slurmsteps import ATTEMPT_FILE, EXIT_FILE
from mlenv.ui import info

STOPPED = 143
"""The exit code recorded for the nodes srun stopped (SIGTERM) after another one failed."""
DETACH = 'log=$1; shift; mkdir -p "${log%/*}" && nohup "$@" </dev/null >"$log" 2>&1 &'
"""Start the launch script in the background, its output in the run's output file (``$1``)."""


@dataclass(frozen=True)
class Run:
    """One launch of ``request`` for ``handle``'s cluster."""

    handle: Handle
    job: SlurmJob
    login: Login
    request: LaunchRequest
    log_dir: Path
    records: Records

    @property
    def run_id(self) -> str:
        return self.request.spec.run_id

    @property
    def run_path(self) -> str:
        return self.job.run_path(self.run_id)

    def outcome(self, code: int, failed: tuple[int, int] | None, logs: Mapping[int, Path],
                message: str | None = None, interrupted: bool = False,
                hosts: tuple[str, ...] = ()) -> LaunchOutcome:
        """Every node's exit code: the failing node's own, the stopped ones', or the job's for all; ``hosts``
        the job's nodes in node-rank order."""
        nodes = range(self.handle.nodes)
        if failed is not None and failed[0] in nodes:
            codes = {node: failed[1] if node == failed[0] else STOPPED for node in nodes}
            stopped = frozenset(node for node in nodes if node != failed[0])
        else:
            codes, stopped = dict.fromkeys(nodes, code), frozenset(nodes) if interrupted else frozenset()
        return LaunchOutcome(code, codes, {node: str(path) for node, path in logs.items()},
                             None if failed is None else failed[0], stopped=stopped, interrupted=interrupted,
                             message=message, hosts=dict(enumerate(hosts)))


def batch(run: Run) -> LaunchOutcome:
    """Submit the run as a batch job, record it, then (unless detached) follow it to its end."""
    spec = run.request.spec
    ship_runtime(run.login, run.job.runtime_path)
    # every attempt of the run appends to its output file (requeues too): this one's output starts at its end
    start = run.login.size(f"{run.run_path}/{OUTPUT_FILE}")
    try:
        job_id = submit(run.login, run.run_path, str(run.request.payload))
    except SubmitError as exc:
        return LaunchOutcome(1, {}, {}, message=str(exc))
    record.remember(run.records, run.handle, job_id, run.run_id, spec.script, spec.detach,
                    spec.max_restarts if spec.detach else 0)
    info(f"batch job {job_id} submitted to partition {run.job.settings.partition}; its output: "
         f"{run.run_path}/{OUTPUT_FILE}")
    if spec.detach:
        return LaunchOutcome(0, {}, {}, detached=True)
    output = NodeOutput(run.log_dir, run.handle.nodes)
    try:
        with interrupted_by_sigterm():
            final, hosts = _follow(run, job_id, output, start)
    except CannotStart as exc:
        run.login.run(["scancel", job_id])
        return run.outcome(1, None, output.paths, f"{exc}; job {job_id} cancelled")
    except KeyboardInterrupt:
        run.login.run(["scancel", job_id])
        return run.outcome(130, None, output.paths, f"job {job_id} cancelled", interrupted=True)
    finally:
        output.close()
    code = final.exit_code if final.exit_code is not None else exit_file(run.login, run.run_path)
    code = 1 if code is None else code
    explained = output.failed is not None or (code == 0 and final.state == "COMPLETED")
    message = None if explained else (f"job {job_id} ended {final.words()}; its output: "
                                      f"{run.run_path}/{OUTPUT_FILE}")
    return run.outcome(code, output.failed, output.paths, message, hosts=hosts)


def _follow(run: Run, job_id: str, output: NodeOutput, offset: int) -> tuple[JobInfo, tuple[str, ...]]:
    """Pending (live reason), then the output as it grows from ``offset``, until the job has ended; how it ended,
    and the nodes it started on (a node Slurm lost meanwhile is no longer the job's at its end)."""
    current = wait_started(run.login, job_id, f"batch job {job_id}")
    hosts = tuple(current.hosts)
    while True:
        data = run.login.read(f"{run.run_path}/{OUTPUT_FILE}", offset)
        offset += len(data)
        output.feed(data)
        if not current.live:
            break
        time.sleep(POLL_SECONDS)
        current = jobs.state(run.login, job_id)
    output.feed(run.login.read(f"{run.run_path}/{OUTPUT_FILE}", offset))
    return current, hosts or tuple(current.hosts)


def exit_file(login: Login, run_path: str) -> int | None:
    """The exit code the script wrote for the run's latest attempt (None while it has none), for a job Slurm has
    forgotten: an earlier attempt's never reads as the result of a later one."""
    attempt = login.read(f"{run_path}/{ATTEMPT_FILE}", 0).decode(errors="replace").strip()
    if not attempt.isdigit():
        return None
    text = login.read(f"{run_path}/attempt-{int(attempt)}/{EXIT_FILE}", 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None


def _cancel_step(run: Run, job_id: str) -> str:
    """Cancel what is left of the run's step in the allocation: srun ends it when stopped in time, but not when it
    is killed first (a slow teardown, or a second Ctrl-C). Says what was done."""
    listed = run.login.run(["squeue", "-h", "-s", f"--jobs={job_id}", "-o", "%i %j"])
    name = step_name(run.run_id)
    steps = [step for step, _, named in (line.partition(" ") for line in listed.stdout.decode().splitlines())
             if named.strip() == name]
    if listed.returncode != 0 or (steps and run.login.run(["scancel", *steps]).returncode != 0):
        return f"the run's step may still be running: see squeue -s --jobs={job_id}, then scancel it"
    return f"step {', '.join(steps)} cancelled" if steps else "the run's step has ended"


def in_allocation(run: Run, job_id: str, secrets: Mapping[str, str], hosts: tuple[str, ...] = ()) -> LaunchOutcome:
    """Run the launch script inside the allocation ``job_id`` (waiting while it is pending) on ``hosts`` (in
    node-rank order, where known); attached, the forwarded ``secrets`` go to its stdin (never with --detach:
    ``prepare_launch`` refuses that)."""
    spec = run.request.spec
    current = wait_started(run.login, job_id, f"allocation {job_id} of {run.handle.name}")
    if current.state != "RUNNING":
        raise OperationError(f"the allocation {job_id} of {run.handle.name} has ended ({current.words()}): deploy "
                             f"again (mlenv deploy), or mlenv clean it and launch runs a batch job")
    ship_runtime(run.login, run.job.runtime_path)
    script = ["bash", "-c", str(run.request.payload), "bash"]
    if spec.detach:
        wrapped = ["sh", "-c", remote.script(), "sh", run.job.workdir, "sh", "-c", DETACH, "sh",
                   f"{run.run_path}/{OUTPUT_FILE}", *script]
        started = run.login.run(wrapped)
        if started.returncode != 0:
            return LaunchOutcome(1, {}, {}, message=f"cannot start the run on {run.login.where}: "
                                                    f"{started.stderr.decode(errors='replace').strip()}")
        info(f"run {run.run_id} started inside allocation {job_id}; its output: {run.run_path}/{OUTPUT_FILE}")
        return LaunchOutcome(0, {}, {}, detached=True)
    command = ["sh", "-c", remote.script(stop_on_stdin_eof=True, secrets=spec.secrets), "sh", run.job.workdir,
               *script]
    output = NodeOutput(run.log_dir, run.handle.nodes)
    try:
        result = run_parallel({0: run.login.argv(command)}, keep_stdin=True, echo=False,
                              stdin=remote.secrets_input(spec.secrets, dict(secrets)),
                              on_line=lambda _, line: output.line(line))
    finally:
        output.close()
    if result.interrupted:
        return run.outcome(130, None, output.paths, f"interrupted: {_cancel_step(run, job_id)}", interrupted=True,
                           hosts=hosts)
    code = result.exit_codes[0]
    return run.outcome(128 - code if code < 0 else code, output.failed, output.paths, hosts=hosts)

