"""The scripts Slurm runs, rendered from the jinja2 templates in manifests/slurm/. Pure.

Every ``{{ }}`` in a template is shell-quoted on its way out (``finalize``), so no value from a cluster file can
inject shell; only text composed here from quoted parts (:class:`Shell`) and the ``slurm.setup`` lines, which are
the user's own shell code, are inserted as written. Values that would break a line (``#SBATCH`` lines, comments)
are refused.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import mlenv
from mlenv.backends.slurm.settings import SlurmSettings
from mlenv.config.model import Container
from mlenv.core.fanout import checkpoint_dir, run_dir
from mlenv.core.remote import RUNTIME_DIR, read_secrets
from mlenv.errors import OperationError, UsageError, shown
from mlenv.render.templates import Templates
from mlenv.runtime.records.runlayout import CHECKPOINT_SIGNAL_VARIABLE
from mlenv.runtime.supervise.slurmsteps import FAILED_FILE

TEMPLATES = Path(mlenv.__file__).parent / "manifests" / "slurm"
PYTHON = "python3"
DEPLOYMENT_FILE = "deployment"
"""In a run directory: the name of the deployment (cluster file) that ran it, so that logs and status find its own
runs where another file's share the workdir."""
REQUEUES = 10
"""How many times a batch job's script requeues it after the warning signal when --max-restarts does not say."""
OUTPUT_FILE = "output.log"
"""In a run directory: a batch job's output (srun's --label lines of every node, and the script's own)."""


class Shell(str):
    """Shell text composed by mlenv from quoted parts: inserted into a script as it is."""


@dataclass(frozen=True)
class SlurmJob:
    """Everything the scripts are made from, decided by ``prepare`` (and kept in the handle)."""

    name: str
    """The deployment's (cluster's) name."""
    source: str
    """The cluster file, as given."""
    job_name: str
    nodes: int
    hosts: tuple[str, ...]
    """slurm.nodelist cut to ``nodes`` (empty: any nodes)."""
    gpus_per_node: int
    procs_per_node: int
    env: Mapping[str, str]
    """The env contract (without MLENV_NODE_RANK, MASTER_ADDR and MASTER_PORT, which come from the job)."""
    settings: SlurmSettings
    container: Container | None
    interfaces: Mapping[str, str]
    """Slurm node name -> socket interface (network.tcp.interfaces)."""
    spares: int = 0
    """Nodes the allocation holds beyond ``nodes`` (deploy --spares): a launch runs on ``nodes`` of the others when
    nodes must be left out."""

    @property
    def workdir(self) -> str:
        return self.settings.workdir

    @property
    def runtime_path(self) -> str:
        """Where sync (or launch) ships the runtime: PYTHONPATH for ``python3 -m mlenv.runtime``."""
        return f"{self.workdir}/{RUNTIME_DIR}"

    def run_path(self, run_id: str) -> str:
        """A run's directory on the cluster."""
        return f"{self.workdir}/{run_dir(run_id)}"

    def allocation_output(self) -> str:
        """The allocation job's own output file (it holds nothing but Slurm's messages)."""
        return f"{self.workdir}/{RUNTIME_DIR}/runs/allocation-%j.log"


def _single_line(text: str, what: str) -> str:
    if any(char in text for char in "\n\r\0"):
        raise UsageError(f"{what}: {shown(text)} has a line break, which cannot go into a Slurm script")
    return text


def _finalize(value: Any) -> str:
    """Every ``{{ }}``: shell-quoted, unless mlenv composed it (Shell)."""
    if isinstance(value, Shell):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return shlex.quote(_single_line(str(value), "a value"))


@lru_cache(maxsize=2)
def _templates(directory: str) -> Templates:
    filters: dict[str, Callable[..., Any]] = {
        "shell": lambda value: Shell(shlex.quote(_single_line(str(value), "a value"))),
        "comment": lambda value: Shell(shown(str(value))), "verbatim": Shell}
    return Templates(directory, _finalize, filters, trim_blocks=True, lstrip_blocks=True)


def _render(template: str, **context: Any) -> str:
    if not TEMPLATES.is_dir():
        raise OperationError("the Slurm templates (manifests/slurm/) are missing from this installation: reinstall "
                             "mlenv (pip install .) or run it from its checkout")
    return _templates(str(TEMPLATES)).render(template, **context)


def _context(job: SlurmJob, title: str, output: str, batch: bool = False) -> dict[str, object]:
    settings = {**job.settings.to_data(), "signal_name": job.settings.signal_name}
    return {"job": job, "s": settings, "title": title, "output": output, "batch": batch,
            "grace": grace_seconds(job.settings.signal_seconds), "export": job.settings.sbatch_export,
            "held": job.nodes if batch else job.nodes + job.spares}


def grace_seconds(warning: int) -> int:
    """Of the seconds between the warning signal and the time limit, what the ranks get to checkpoint before
    mlenv stops them and requeues the job: three quarters, the rest for the requeue."""
    return max(1, warning * 3 // 4)


def allocation_script(job: SlurmJob) -> str:
    """The sbatch script of ``deploy``: a job that holds the nodes until its time limit or ``clean``."""
    spares = f" and {job.spares} spare{'s' if job.spares > 1 else ''}" if job.spares else ""
    title = f"mlenv deploy: allocation of {job.nodes} nodes{spares} for {job.name}"
    return _render("allocation.sbatch.j2", **_context(job, title, job.allocation_output()))


def after_setup(job: SlurmJob, argv: Sequence[str]) -> list[str]:
    """``argv`` run by bash after the slurm.setup lines, as written (the user's own shell code), as the launch
    script runs its srun after them; ``argv`` alone without setup lines."""
    if not job.settings.setup:
        return list(argv)
    return ["bash", "-c", "\n".join([*job.settings.setup, 'exec "$@"']), "bash", *argv]


def container_argv(job: SlurmJob) -> list[str]:
    """``apptainer exec [--nv] --bind ... --env ... IMAGE``, or nothing without a container."""
    container = job.container
    if container is None:
        return []
    binds = [f"{b.host}:{b.container}" + (":ro" if b.options == "ro" else "") for b in container.binds]
    env = {**container.env, "PYTHONPATH": job.runtime_path}
    return [container.runtime, "exec", *(["--nv"] if container.nv else []),
            *(option for bind in (*binds, job.workdir) for option in ("--bind", bind)), "--pwd", job.workdir,
            *(option for name, value in env.items() for option in ("--env", f"{name}={value}")), container.image]


def runtime_argv(launcher: str, run_id: str, script: str, args: Sequence[str], nproc: int | None,
                 expect_transport: str | None = None, options: Sequence[str] = ()) -> list[str]:
    """``python3 -m mlenv.runtime launch ...``: one node's share of a run (its node rank from Slurm); ``options``:
    more of the runtime launch's options (the hang watchdog's)."""
    return [PYTHON, "-m", "mlenv.runtime", "launch", "--launcher", launcher,
            *(["--nproc", str(nproc)] if nproc else []), "--run-dir", run_dir(run_id),
            *(["--expect-transport", expect_transport] if expect_transport else []), *options, "--", script, *args]


def task_wrapper(interfaces: Mapping[str, str], secrets: Sequence[str] = (), warning: str | None = None,
                 placed: bool = False) -> str:
    """The ``sh -c`` script around each node's task: the forwarded ``secrets`` from the step's stdin, the node's
    rank (its SLURM_NODEID in the step, which spans every node, in Slurm's order; ``placed``, on a step whose tasks
    srun placed in the order of its --nodelist, one a node: the task's SLURM_PROCID, its node's place there) and
    socket interface when the file names one, then the task; a failing node records ``<node> <code>`` in the
    attempt's ``failed`` file, the first one only. With a ``warning`` signal, this shell and what it starts ignore
    it (the runtime, apptainer, torchrun's agent, DeepSpeed's launchers), unless they catch it: the ranks that
    checkpoint on it install their own handler."""
    rank = "$SLURM_PROCID" if placed else "$SLURM_NODEID"
    steps = [*([read_secrets(secrets).rstrip("; ")] if secrets else []), f'export MLENV_NODE_RANK="{rank}"',
             *([f"trap '' {warning}"] if warning else [])]
    if interfaces:
        cases = " ".join(f"{shlex.quote(host)}) export NCCL_SOCKET_IFNAME={shlex.quote(nic)} "
                         f"GLOO_SOCKET_IFNAME={shlex.quote(nic)} ;;" for host, nic in sorted(interfaces.items()))
        steps.append(f'case "$SLURMD_NODENAME" in {cases} esac')
    steps += ['"$@"; code=$?',
              f'[ "$code" -eq 0 ] || (set -C; echo "$MLENV_NODE_RANK $code" > '
              f'"$MLENV_RUN_DIR/attempt-$MLENV_RESTART_COUNT/{FAILED_FILE}") 2>/dev/null',
              'exit "$code"']
    return "; ".join(steps)


def step_name(run_id: str) -> str:
    """The name of a run's srun step (``squeue -s`` shows it), so that the run's own step can be found."""
    return f"mlenv-{run_id}"


def srun_line(job: SlurmJob, run_id: str, task: Sequence[str], secrets: Sequence[str] = (),
              nodelist: Sequence[str] = ()) -> Shell:
    """The srun of a run's attempt: one task per node (with a ``nodelist``, which the runtime adds as --nodelist,
    in its order: node N runs on its N-th host, also where that is not Slurm's order, as a spare in an excluded
    node's place), fail-fast, every line labelled with its node. Forwarded ``secrets`` reach every task on the step's
    stdin, which Slurm hands over and never saves, unlike a job's or a step's environment."""
    options = ["srun", "--overlap", f"--job-name={step_name(run_id)}", f"--nodes={job.nodes}", "--ntasks-per-node=1",
               *([f"--cpus-per-task={job.settings.cpus_per_task}"] if job.settings.cpus_per_task else []),
               "--kill-on-bad-exit=1", "--label", *(["--input=all"] if secrets else []),
               *(["--distribution=arbitrary"] if nodelist else [])]
    wrapper = task_wrapper(job.interfaces, secrets, job.settings.signal_name, placed=bool(nodelist))
    parts = [shlex.join(options), shlex.join(["sh", "-c", wrapper, "sh"])]
    if job.container is not None:
        parts.append(shlex.join(container_argv(job)))
    parts.append(shlex.join(task))
    return Shell(" \\\n  ".join(parts))


def _run_context(job: SlurmJob, title: str, run_id: str, task: Sequence[str], batch: bool = False,
                 attempt: int = 0, exclude: Sequence[str] = (), secrets: Sequence[str] = (),
                 nodelist: Sequence[str] = (), restarts: int = 0) -> dict[str, object]:
    warning = job.settings.checkpoint_signal if batch else None  # the warning reaches batch jobs only
    env = {**job.env, "MLENV_RUN_ID": run_id, "MLENV_RUN_DIR": job.run_path(run_id),
           "MLENV_CHECKPOINT_DIR": f"{job.workdir}/{checkpoint_dir(run_id)}",
           **({CHECKPOINT_SIGNAL_VARIABLE: warning} if warning else {}), "PYTHONUNBUFFERED": "1"}
    return {**_context(job, title, f"{job.run_path(run_id)}/{OUTPUT_FILE}", batch), "env": env,
            "runtime_path": job.runtime_path,
            "srun": srun_line(job, run_id, task, secrets, nodelist), "attempt": attempt, "exclude": ",".join(exclude),
            "nodelist": list(nodelist), "restarts": restarts, "deployment_file": DEPLOYMENT_FILE,
            "resubmit_export": ",".join([*job.settings.export, "MLENV_RESUBMITTED=1"]),
            "python": PYTHON, "unexported": Shell(" ".join(secrets)),  # names checked by read_secrets in srun_line
            "secret_values": Shell(" ".join(f'"${name}"' for name in secrets))}


def batch_script(job: SlurmJob, title: str, run_id: str, task: Sequence[str], attempt: int = 0,
                 exclude: Sequence[str] = (), restarts: int = 0, requeues: int = 0) -> str:
    """The sbatch script of a launch without an allocation: the run as a batch job (its ``attempt``-th start, away
    from the ``exclude`` hosts), which runs a failed attempt again while ``restarts`` (a detached run's
    --max-restarts) allows, and requeues itself after the warning signal up to ``requeues`` times (the run's
    --max-restarts; REQUEUES without)."""
    words = f"--max-restarts {requeues}" if requeues else f"mlenv's default ({REQUEUES}, without --max-restarts)"
    return _render("batch.sbatch.j2", **_run_context(job, title, run_id, task, True, attempt, exclude,
                                                     restarts=restarts),
                   requeues=requeues or REQUEUES, requeues_by=words)


def launch_script(job: SlurmJob, title: str, run_id: str, task: Sequence[str], job_id: str, attempt: int = 0,
                  secrets: Sequence[str] = (), nodelist: Sequence[str] = (), restarts: int = 0,
                  allocation_nodes: Sequence[str] = (), exclude: Sequence[str] = ()) -> str:
    """The bash script of a launch inside the allocation ``job_id``, run where Slurm's commands are (on the
    allocation's ``nodelist`` nodes when given, the first the master); the forwarded ``secrets`` arrive in its
    environment and leave it at once, for the run's step's stdin alone. It runs a failed attempt again while
    ``restarts`` (a detached run's --max-restarts) allows; with a ``nodelist``, on the first of the
    ``allocation_nodes`` not excluded (``exclude``, and the nodes the restart policy leaves out)."""
    return _render("launch.sh.j2", **_run_context(job, title, run_id, task, attempt=attempt, exclude=exclude,
                                                  secrets=secrets, nodelist=nodelist, restarts=restarts),
                   job_id=job_id, allocation_nodes=list(allocation_nodes))
