"""The Slurm backend: ``deploy`` holds N nodes with a batch job (the allocation), ``exec``/``shell``/``launch`` run
steps inside it with ``srun --jobid --overlap``; without an allocation, ``launch`` submits the run as a batch job.
Slurm's commands run on this machine or, with ``slurm.login``, over ssh on the login host. The workdir is on the
cluster's shared filesystem: sync copies it once, and every run keeps its files in ``workdir/.mlenv/runs/<run>/``.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from mlenv.backends.slurm import followed, jobs, noderecords, run, runstate, script
from mlenv.backends.slurm import record as recorded
from mlenv.backends.slurm.allocation import Allocation
from mlenv.backends.slurm.checks import slurm_checks
from mlenv.backends.slurm.jobs import JobInfo
from mlenv.backends.slurm.login import Login
from mlenv.backends.slurm.script import SlurmJob
from mlenv.backends.slurm.settings import SlurmSettings
from mlenv.backends.slurm.submit import submit
from mlenv.backends.slurm.waiting import CannotStart, wait_started
from mlenv.config.model import Bind, Container
from mlenv.core import remote
from mlenv.core.capabilities import (
    Check,
    Checks,
    CopyTarget,
    Deploy,
    Feature,
    Handle,
    Jobs,
    LaunchOutcome,
    LaunchRequest,
    LaunchSpec,
    Node,
    NodeAccess,
    NodeStatus,
    Preemption,
    Preempts,
    Recorder,
    Refused,
    Request,
)
from mlenv.core.fanout import RUNS_DIR
from mlenv.core.recorded import SubmittedJob
from mlenv.core.registry import Records
from mlenv.core.runrecords import latest_run
from mlenv.core.spares import place
from mlenv.errors import ConfigError, OperationError, Problem, UsageError
from mlenv.plan import JobPlan
from mlenv.runtime.records.jsonvalue import JsonObject
from mlenv.runtime.records.runrecord import RunRecord
from mlenv.runtime.records.states import NodeEnd
from mlenv.runtime.supervise.slurmsteps import EXIT_FILE, NEXT_FILE, STOP_FILE, master_port
from mlenv.ui import info

_SECRETS_REFUSED = (
    "--env {names}: on Slurm, {run} (like a batch job, a detached run or a requeue) would need the secret later, "
    "when mlenv is no longer there to pass it on, and Slurm saves a job's environment in its state directory. "
    "Instead deploy an allocation (mlenv deploy {name}) and launch attached: the secret then reaches the run's "
    "step on its stdin only; or provide the variable yourself through slurm.setup (e.g. a line that reads it "
    "from a file only you can read)")
MARK_STOPPED = 'for f; do [ -d "${f%/*}" ] && date -u +%Y-%m-%dT%H:%M:%SZ > "$f"; done; exit 0'
"""``sh -c MARK_STOPPED sh FILE...``: each run's stop file, where its directory is."""
STEP_PREFIX = script.step_name("")
CLEAN_TIMEOUT = 60.0
SHOWN_JOBS = 10
"""Batch jobs status shows: the newest."""
LOGS = """runs=$1 node=$2 follow=$3 only=$4 name=$5 run= newest= found= tailing=
if [ -n "$6" ]; then set -- "$runs/$6/"; else set -- "$runs"/*; fi  # run $6, else every run
for dir in "$@"; do  # the deployment's newest run with a log (names sort by time, a run's same-second suffix (-2)
  # after it: no slash after them); one of another file's: no
  dir=${dir%/}
  if [ -f "$dir/DEPLOYMENT_FILE" ] && [ "$(cat "$dir/DEPLOYMENT_FILE")" != "$name" ]; then continue; fi
  for log in "$dir"/attempt-*/node*/output.log; do [ -e "$log" ] && run=$dir && break; done
done
[ -n "$run" ] || { echo "no run of $name has a log under $runs yet" >&2; exit 1; }
for dir in "$run"/attempt-*; do  # attempts in number order: attempt-10 after attempt-9
  k=${dir##*/attempt-}
  case $k in ''|*[!0-9]*) continue ;; esac
  if [ -z "$newest" ] || [ "$k" -gt "$newest" ]; then newest=$k; fi
done
where() {  # attempt $1's node directory with the log: node $node's, or the one rank $only ran on then
  if [ -z "$only" ]; then
    [ ! -e "$run/attempt-$1/node$node/output.log" ] || echo "$run/attempt-$1/node$node"
    return
  fi
  for dir in "$run/attempt-$1"/node*; do
    if grep -q "\\"rank\\": $only," "$dir/ranks.json" 2>/dev/null && [ -e "$dir/output.log" ]; then
      echo "$dir"
      return
    fi
  done
}
show() { if [ -n "$only" ]; then grep --line-buffered -a "^\\[node-[0-9]* r$only\\] "; else cat; fi; }
k=0
while [ "$k" -le "$newest" ]; do  # restarted: every attempt under a header naming it, the newest last
  dir=$(where "$k")
  if [ -n "$dir" ]; then
    found=$dir
    [ "$newest" -eq 0 ] ||
      echo "mlenv: ==== attempt $k (MLENV_RESTART_COUNT=$k) of run ${run##*/}, node ${dir##*/node} ===="
    if [ -n "$follow" ] && [ "$k" -eq "$newest" ]; then tailing=1; else show < "$dir/output.log"; fi
  fi
  k=$((k + 1))
done
if [ -z "$found" ]; then
  [ -z "$only" ] || exit 2
  echo "run ${run##*/} of $name has no log of node $node yet" >&2
  exit 1
fi
[ -n "$tailing" ] || exit 0
k=$newest dir=$found
while :; do  # attempt $k until it ended, then the next one while the run's script says that one comes
  pid=$(mktemp)
  { tail -n +1 -f "$dir/output.log" & echo $! > "$pid"; wait; } | show &
  late=0  # the attempt's exit file comes after the restart policy's verdict; the node's alone: the script is gone
  while [ ! -e "$run/attempt-$k/EXIT_FILE" ] && [ "$late" -lt 60 ]; do
    [ ! -e "$dir/EXIT_FILE" ] || late=$((late + 1))
    sleep 1
  done
  sleep 1; kill "$(cat "$pid")"; rm -f "$pid"; wait
  code=$(cat "$run/attempt-$k/EXIT_FILE" 2>/dev/null || cat "$dir/EXIT_FILE" 2>/dev/null)
  case $code in ''|*[!0-9]*) code=1 ;; esac
  next="$run/attempt-$k/NEXT_FILE"
  [ -s "$next" ] || exit "$code"
  echo "mlenv: attempt $k ended (exit $code); waiting for attempt $((k + 1)) ($(head -n 1 "$next"))"
  k=$((k + 1))
  until dir=$(where "$k") && [ -n "$dir" ]; do  # a stop, or a requeue that failed, ends the run
    [ ! -e "$run/STOP_FILE" ] || exit 143
    [ -e "$next" ] || exit "$(cat "$run/attempt-$((k - 1))/EXIT_FILE" 2>/dev/null || echo "$code")"
    sleep 1
  done
  echo "mlenv: ==== attempt $k (MLENV_RESTART_COUNT=$k) of run ${run##*/}, node ${dir##*/node} ===="
done
""".replace("DEPLOYMENT_FILE", script.DEPLOYMENT_FILE).replace("EXIT_FILE", EXIT_FILE).replace(
    "NEXT_FILE", NEXT_FILE).replace("STOP_FILE", STOP_FILE)
"""The log of the deployment's newest run (never another cluster file's sharing the workdir): node N's, or with a
rank only that rank's lines from the node it ran on in each attempt (exit 2, silently, when it ran in none); after a
restart every attempt's, each under a header naming it, the newest last; with follow, until the run has ended: into
every attempt the run's script says comes next (script.NEXT_FILE; one line says what it waits for), then with the
last attempt's exit code (its exit file, the batch or step script's; the node's own a minute after it, where the
script is gone without one)."""


def job_data(job: SlurmJob) -> JsonObject:
    """The handle's record of ``job`` (JsonValue)."""
    data = asdict(job)
    data["settings"] = job.settings.to_data()
    return data


def _job(recorded: Mapping[str, Any]) -> SlurmJob:
    data = dict(recorded["job"])
    container = data["container"]
    if container is not None:
        container = Container(**{**container, "binds": tuple(Bind(**b) for b in container["binds"])})
    return SlurmJob(**{**data, "hosts": tuple(data["hosts"]), "container": container,
                       "settings": SlurmSettings.from_data(data["settings"])})


def job_from(handle: Handle) -> SlurmJob:
    """The job recorded in ``handle``; UsageError for a record of another shape."""
    return handle.decoded(_job)


def _settings(plan: JobPlan) -> SlurmSettings:
    settings = plan.cluster.settings
    if not isinstance(settings, SlurmSettings):
        raise UsageError(f"{plan.cluster.source}: backend slurm needs its slurm: settings")
    return settings


def _hosts(plan: JobPlan, settings: SlurmSettings) -> tuple[str, ...]:
    """slurm.nodelist cut to the nodes asked for; ConfigError when it has fewer."""
    if settings.nodelist and plan.nodes > len(settings.nodelist):
        line, col = plan.cluster.where(("slurm", "nodelist"))
        raise ConfigError([Problem(plan.cluster.source, line, col, "slurm.nodelist",
                                   f"{plan.nodes} nodes requested but only {len(settings.nodelist)} are pinned here; "
                                   f"use --nodes {len(settings.nodelist)} or fewer, or pin more nodes")])
    return settings.nodelist[:plan.nodes]


class SlurmBackend(Deploy, NodeAccess, Jobs, Checks, Preempts):
    """Slurm through sbatch, squeue, scontrol, srun and scancel, here or on the login host."""

    name = "slurm"

    def __init__(self, records: Records) -> None:
        self.records = records
        """mlenv's records (the recorded deployment, the batch jobs submitted), handed to the backend."""

    def prepare(self, plan: JobPlan) -> Request:
        """PURE: the allocation's sbatch script, and the handle every later verb works from."""
        settings = _settings(plan)
        job = SlurmJob(name=plan.name, source=plan.cluster.source, job_name=f"mlenv-{plan.name}", nodes=plan.nodes,
                       hosts=_hosts(plan, settings), gpus_per_node=plan.gpus_per_node,
                       procs_per_node=plan.procs_per_node,
                       env={k: v for k, v in plan.env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")},
                       settings=settings, container=plan.cluster.container,
                       interfaces=dict(plan.cluster.tcp.interfaces), spares=plan.spares)
        text = script.allocation_script(job)
        handle = Handle(self.name, plan.name, plan.nodes, plan.mode, True, dict(job.env),
                        {"job": job_data(job), "allocation": None})
        return Request(handle, text, {"allocation.sbatch": text}, job)

    def apply(self, request: Request, record: Recorder) -> Handle:
        """Submit the allocation (or keep the live one submitted with the same script); record its job id."""
        handle = request.handle
        job = job_from(handle)
        login = Login.of(job.settings)
        digest = hashlib.sha256(request.text.encode()).hexdigest()[:16]
        known = self._live_allocation(login, handle.name)
        if known is not None:
            if Allocation.of(known).digest == digest:
                info(f"allocation {Allocation.of(known).id} of {handle.name} is already queued or running")
                record(known)
                return known
            raise OperationError(f"allocation {Allocation.of(known).id} of {handle.name} is queued or running with "
                                 f"other settings: mlenv clean -c {handle.name} cancels it, then deploy again")
        record(handle)
        job_id = submit(login, f"{job.workdir}/{RUNS_DIR}", request.text)
        handle = Allocation(job_id, digest).on(handle)
        record(handle)
        spares = f" ({job.nodes} + {job.spares} spare{'s' if job.spares > 1 else ''})" if job.spares else ""
        info(f"allocation {job_id} submitted: {job.nodes + job.spares} nodes{spares} of partition "
             f"{job.settings.partition}")
        return handle

    def _live_allocation(self, login: Login, name: str) -> Handle | None:
        known = self.records.handle_of(name)
        job_id = Allocation.of(known).id if known and known.backend == self.name else None
        if known is None or job_id is None or not jobs.state(login, job_id).live:
            return None
        return known

    def wait_ready(self, handle: Handle, timeout: float, record: Recorder) -> None:
        """Slurm's pending reason live until the allocation runs; then find the master's address there."""
        job_id = self._allocation(handle)
        job = job_from(handle)
        login = Login.of(job.settings)
        what = f"allocation {job_id} of {handle.name}"
        fix = f"mlenv status shows it; mlenv clean -c {handle.name} cancels it"
        try:
            current = wait_started(login, job_id, what, timeout)
        except CannotStart as exc:
            raise OperationError(f"{exc}\nfix the cluster file, then: mlenv clean -c {handle.name} and deploy "
                                 "again") from None
        except OperationError as exc:
            raise OperationError(f"{exc}: {fix}") from None
        if current.state != "RUNNING":
            raise OperationError(f"{what} ended before it ran: {current.words()}; Slurm's messages: "
                                 f"{job.allocation_output().replace('%j', job_id)}")
        head = current.hosts[0]
        addresses = _addresses(login, job_id, current.hosts)
        master = addresses[0] or head
        allocation = replace(Allocation.of(handle), master_addr=master, addresses=tuple(addresses),
                             hosts=tuple(current.hosts))
        env = {**handle.env, "MASTER_ADDR": master, "MASTER_PORT": str(master_port(job_id))}
        record(allocation.on(replace(handle, env=env)))
        spares = f" ({job.nodes} for the job, {job.spares} spare)" if job.spares else ""
        info(f"{what} is running on {current.nodelist}{spares}; master {head} at {master}:{master_port(job_id)}")

    @staticmethod
    def _allocation(handle: Handle) -> str:
        job_id = Allocation.of(handle).id
        if job_id is None:
            raise OperationError(f"{handle.name} has no allocation: mlenv deploy {handle.name} holds nodes")
        return job_id

    def _jobs(self, handle: Handle, exit_codes: bool = False
              ) -> tuple[Login, dict[str, JobInfo], list[SubmittedJob]]:
        """The allocation and the recorded batch jobs of ``handle`` (the newest SHOWN_JOBS with ``exit_codes``),
        as Slurm knows them now, with the jobs that detached runs' scripts submitted to go on without a node."""
        job = job_from(handle)
        login = Login.of(job.settings)
        while True:  # again once when the runs' scripts submitted jobs not recorded yet (followed.follow)
            submitted = recorded.jobs(self.records, handle.name)
            batch = submitted[-SHOWN_JOBS:] if exit_codes else submitted
            allocation = Allocation.of(handle).id
            ids = [*([allocation] if allocation else []), *(entry.id for entry in batch)]
            found = jobs.query(login, ids, exit_codes)
            if not followed.follow(login, self.records, handle, job, found):
                return login, found, batch

    def status(self, handle: Handle) -> list[NodeStatus]:
        """The allocation's nodes (or its pending reason), then the newest batch jobs mlenv submitted for the
        file: pending with the reason, running, or ended with the exit code. The nodes that detached runs' scripts
        inside the allocation left out since it was last asked are recorded as excluded first (``mlenv nodes``)."""
        job = job_from(handle)
        login, found, batch = self._jobs(handle, exit_codes=True)
        rows: list[NodeStatus] = []
        allocation = Allocation.of(handle).id
        if allocation is not None:
            followed.left_out(login, self.records, handle, f"{job.workdir}/{RUNS_DIR}")
            rows += self._allocation_rows(handle, job, found[allocation])
        for index, submitted in enumerate(batch):
            current = found[submitted.id]
            run_id = submitted.run or ""
            rows.append(NodeStatus(f"job-{current.id}", index, current.nodelist, current.state,
                                   current.state == "RUNNING", 0, job.gpus_per_node * job.nodes, None,
                                   detail=_job_detail(login, job, submitted, current),
                                   extra={"job": current.id, "run": run_id, "elapsed": current.elapsed or ""}))
        return rows

    @staticmethod
    def _allocation_rows(handle: Handle, job: SlurmJob, current: JobInfo) -> list[NodeStatus]:
        extra = {"job": current.id, "run": "allocation", "elapsed": current.elapsed or "",
                 **({"spares": str(job.spares)} if job.spares else {})}
        if current.state != "RUNNING":
            detail = current.reason_words() if current.state == "PENDING" else current.words()
            return [NodeStatus(f"node-{index}", index, None, current.state, False, 0, job.gpus_per_node, None,
                               detail=detail, extra=extra) for index in range(job.nodes + job.spares)]
        allocation = Allocation.of(handle)
        addresses = list(allocation.addresses or [allocation.master_addr])
        addresses += [None] * (len(current.hosts) - len(addresses))
        return [NodeStatus(f"node-{index}", index, host, "RUNNING", True, 0, job.gpus_per_node, addresses[index],
                           extra=extra) for index, host in enumerate(current.hosts)]

    def nodes(self, handle: Handle) -> list[Node]:
        """The nodes of the allocation while it runs, else of the newest running batch job mlenv submitted (ready:
        exec, shell and stacks reach them; the allocation's spares after the job's nodes are not among them);
        otherwise the nodes as placeholders, which share the workdir (sync and logs need no job)."""
        job = job_from(handle)
        running = self._running(handle)
        if running is not None:
            return [Node(index, host, job.workdir, ready=True) for index, host in enumerate(running.hosts[:job.nodes])]
        return [Node(index, f"node-{index}", job.workdir) for index in range(job.nodes)]

    def _running(self, handle: Handle) -> JobInfo | None:
        """The job whose nodes exec reaches: the allocation while it runs, else (none deployed) the newest running
        batch job of the deployment's runs."""
        login = Login.of(job_from(handle).settings)
        allocation = Allocation.of(handle).id
        if allocation is not None:
            current = jobs.state(login, allocation)
            return current if current.state == "RUNNING" else None
        submitted = [entry.id for entry in recorded.jobs(self.records, handle.name)][-SHOWN_JOBS:]
        found = jobs.query(login, submitted, exit_codes=False) if submitted else {}
        return next((found[job_id] for job_id in reversed(submitted) if found[job_id].state == "RUNNING"), None)

    def spares(self, handle: Handle) -> list[Node]:
        """PURE: the allocation's spare nodes (deploy --spares) as deploy found them, their ordinals after the job's
        nodes: exec and shell reach them with --pod while the allocation runs (Slurm says when it does not). Not
        ready: nothing that fans out over the nodes asks them (they share the workdir)."""
        job = job_from(handle)
        held = Allocation.of(handle).held
        return [Node(index, host, job.workdir) for index, host in enumerate(held) if index >= job.nodes]

    def exec_argv(self, handle: Handle, node: Node, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  interactive: bool = False, stop_on_stdin_eof: bool = False,
                  secrets: Sequence[str] = ()) -> list[str]:
        """``srun --jobid=ID --overlap -w NODE env K=V... sh -c SCRIPT sh WORKDIR ARGV`` (with ``--pty`` for an
        interactive shell on a terminal), over ssh with a login host. The step sees the env contract of the node:
        its rank in the allocation, the master, and its socket interface when the file names one."""
        tty = interactive and sys.stdin.isatty()
        step = self._step(handle, node, argv, env=env, tty=tty, stop_on_stdin_eof=stop_on_stdin_eof and not interactive,
                          secrets=secrets)
        return Login.of(job_from(handle).settings).argv(step, tty=tty)

    def runtime(self, handle: Handle, *args: str) -> list[str]:
        """``python3 -m mlenv.runtime ARGS`` after the slurm.setup lines, on the node, as the launch's ranks run
        (the Python and tools, py-spy among them, of the environment slurm.setup activates)."""
        return script.after_setup(job_from(handle), [script.PYTHON, "-m", "mlenv.runtime", *args])

    torch_fix = ("install PyTorch where slurm.setup puts the job (e.g. `source VENV/bin/activate`), or run in a "
                 "container: with it (container.image in the cluster file)")
    """What doctor names when a node cannot import torch: the fields a Slurm launch takes its software from."""

    def runtime_as_launched(self, handle: Handle, node: Node, args: Sequence[str],
                            env: Mapping[str, str]) -> list[str]:
        """``python3 -m mlenv.runtime ARGS`` on ``node`` as a launch runs it: the step started after the
        slurm.setup lines (where Slurm's commands are, as the launch script does), inside container: when the
        file names one."""
        job = job_from(handle)
        runtime = [*script.container_argv(job), script.PYTHON, "-m", "mlenv.runtime", *args]
        return Login.of(job.settings).argv(script.after_setup(job, self._step(handle, node, runtime, env=env)))

    def _step(self, handle: Handle, node: Node, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              tty: bool = False, stop_on_stdin_eof: bool = False, secrets: Sequence[str] = ()) -> list[str]:
        """The srun of ``argv`` on ``node`` in the allocation, as run where Slurm's commands are."""
        job = job_from(handle)
        job_id = Allocation.of(handle).id
        if job_id is None and node.ready:  # a node of a running batch job
            job_id = running.id if (running := self._running(handle)) and node.name in running.hosts else None
        if not (node.ready or node.name in Allocation.of(handle).held) or job_id is None:  # a placeholder, or no job
            raise OperationError(f"no running allocation or batch job of {handle.name}: exec, shell and stacks run "
                                 f"inside one (mlenv deploy {handle.name}, or mlenv launch; mlenv status shows them)")
        variables = {**handle.env, "MASTER_PORT": str(master_port(job_id)), "MLENV_NODE_RANK": str(node.ordinal)}
        master = Allocation.of(handle).master_addr
        if master:
            variables["MASTER_ADDR"] = str(master)
        if node.name in job.interfaces:
            nic = job.interfaces[node.name]
            variables.update(NCCL_SOCKET_IFNAME=nic, GLOO_SOCKET_IFNAME=nic)
        variables.update(env or {})
        step = ["srun", f"--jobid={job_id}", "--overlap", "--nodes=1", "--ntasks=1", "-w", node.name,
                f"--chdir={job.workdir}", *(["--pty"] if tty else []),
                "env", *(f"{name}={value}" for name, value in variables.items()),
                "sh", "-c", remote.script(stop_on_stdin_eof=stop_on_stdin_eof, secrets=secrets),
                "sh", node.workspace, *argv]
        return step

    def copy_target(self, handle: Handle, node: Node) -> CopyTarget:
        """The workdir, on the shared filesystem: here, or on the login host over ssh."""
        job = job_from(handle)
        return Login.of(job.settings).copy_target(job.workdir)

    def logs_argv(self, handle: Handle, node: Node, follow: bool, rank: int | None = None,
                  run_id: str | None = None) -> list[str]:
        """The node's log of the newest run, or of ``run_id`` (from the shared workdir; ``follow`` ends with the
        node's job)."""
        job = job_from(handle)
        command = ["sh", "-c", LOGS, "sh", f"{job.workdir}/{RUNS_DIR}", str(node.ordinal), "1" if follow else "",
                   "" if rank is None else str(rank), handle.name, run_id or ""]
        return Login.of(job.settings).argv(command)

    def data_volumes(self, handle: Handle) -> list[str]:
        """What ``clean --delete-data`` deletes: the runtime and runs mlenv keeps in the workdir (never the rest
        of the workdir, which is yours)."""
        return [f"{job_from(handle).workdir}/{remote.RUNTIME_DIR}"]

    def clean(self, handle: Handle, delete_data: bool) -> None:
        """Cancel the allocation and the batch jobs mlenv submitted that are still queued or running; wait
        until Slurm has ended them. ``delete_data`` also removes workdir/.mlenv."""
        login, found, _ = self._jobs(handle)
        live = [job_id for job_id, current in found.items() if current.live]
        if live:
            login.ok(["scancel", *live])
            _wait_gone(login, live)
            info(f"cancelled job(s) {', '.join(live)} of {handle.name}")
        else:
            info(f"nothing to cancel: no queued or running job of {handle.name}")
        if delete_data:
            path = self.data_volumes(handle)[0]
            login.ok(["rm", "-rf", "--", path])
            info(f"deleted {path}")

    def checks(self, plan: JobPlan) -> list[Check]:
        """Slurm reachable, the partition up with enough nodes and GPUs, the pinned nodes in it, the time
        limit within the partition's, the workdir writable and the container image there."""
        job = job_from(self.prepare(plan).handle)
        return slurm_checks(Login.of(job.settings), job)

    def prepare_launch(self, handle: Handle, spec: LaunchSpec) -> LaunchRequest:
        """PURE: the batch script of the run (no allocation), or the script that runs it inside the allocation."""
        job = job_from(handle)
        task = script.runtime_argv(spec.launcher, spec.run_id, spec.script, spec.args, spec.nproc,
                                   spec.expect_transport, spec.watchdog_options())
        allocation = Allocation.of(handle).id
        if spec.secrets and (allocation is None or spec.detach):
            raise Refused(Feature.JOBS, _SECRETS_REFUSED.format(names=" ".join(spec.secrets), name=handle.name,
                                                                run="a detached run" if allocation else "a batch job"))
        forwarded = f"; forwarded from your environment: {', '.join(spec.secrets)}" if spec.secrets else ""
        where = f"inside allocation {allocation}" if allocation else "as a batch job"
        title = (f"mlenv launch: run {spec.run_id} of {handle.name}, {spec.script} with {spec.launcher} on "
                 f"{job.nodes} nodes {where}{' (detached)' if spec.detach else ''}{forwarded}")
        placed = _placement(handle, job, spec.exclude) if allocation else {}
        nodelist = _step_hosts(handle, job, placed) if allocation and job.spares else ()
        restarts = spec.max_restarts if spec.detach else 0  # an attached run's restarts are mlenv's own
        text = (script.launch_script(job, title, spec.run_id, task, allocation, spec.attempt, spec.secrets,
                                     nodelist, restarts, Allocation.of(handle).held, spec.exclude) if allocation
                else script.batch_script(job, title, spec.run_id, task, spec.attempt, spec.exclude, restarts,
                                         spec.max_restarts))
        return LaunchRequest(spec, text, dict.fromkeys(range(job.nodes), task), {"MLENV_RUN_ID": spec.run_id}, text,
                             spares=placed)

    def launch(self, handle: Handle, request: LaunchRequest, secrets: Mapping[str, str],
               log_dir: str) -> LaunchOutcome:
        """Run the request: inside the allocation (waiting while it is pending), or as a batch job."""
        job = job_from(handle)
        this = run.Run(handle, job, Login.of(job.settings), request, Path(log_dir), self.records)
        allocation = Allocation.of(handle).id
        return (run.in_allocation(this, allocation, secrets, _step_hosts(handle, job, request.spares)) if allocation
                else run.batch(this))

    def stop(self, handle: Handle) -> int:
        """Stop the runs for good: first each run's stop file (its script starts no further attempt, and the run
        reads as stopped), then cancel the allocation's steps (it keeps holding the nodes) and the batch jobs."""
        login, found, batch = self._jobs(handle)
        allocation = Allocation.of(handle).id
        targets = [job_id for job_id, current in found.items() if current.live and job_id != allocation]
        runs = {entry.run for entry in batch if entry.run and found[entry.id].live}
        if allocation is not None and found[allocation].state == "RUNNING":
            listed = login.ok(["squeue", "-h", "-s", f"--jobs={allocation}", "-o", "%i %j"]).splitlines()
            for step, _, name in (line.partition(" ") for line in listed):
                if step.partition(".")[2].isdigit():
                    targets.append(step)
                    runs |= {name.strip().removeprefix(STEP_PREFIX)} if name.startswith(STEP_PREFIX) else set()
        if not targets:
            info(f"nothing to stop: no run of {handle.name} is queued or running")
            return 0
        job = job_from(handle)
        login.ok(["sh", "-c", MARK_STOPPED, "sh", *(f"{job.run_path(run_id)}/{STOP_FILE}"
                                                    for run_id in sorted(runs))])
        login.ok(["scancel", *targets])
        info(f"cancelled {', '.join(targets)}")
        return 0

    def runs_own_ports(self, handle: Handle) -> bool:
        """A batch job's ports follow from its own job id; the runs inside an allocation all get the allocation's."""
        return Allocation.of(handle).id is None

    def latest_run(self, handle: Handle, run_id: str) -> RunRecord:
        """Run ``run_id`` as its nodes' supervisors recorded it in the shared run directory, its newest attempt
        (``core.runrecords.latest_run``): read in one command on the login host; a node without an exit status is
        ``running`` (or ``hung``) while the run's step (in the allocation) or batch job runs, else ``failed`` when
        its supervisor had started (gone without an exit status), else ``-``; the run's state as its batch job says
        (``runstate.reconcile``: requeued, preempted, failed)."""
        job = job_from(handle)
        login, live, batch_job = self._live(handle, run_id)
        found = noderecords.read(login, f"{job.workdir}/{RUNS_DIR}", run_id)
        run = latest_run(run_id, {node: noderecords.node_job(found.files.get(node, {}), found.attempt, live,
                                                             found.stopped, found.lost.get(node),
                                                             found.earlier.get(node))
                                  for node in range(job.nodes)})
        return replace(run, state=runstate.reconcile(run.state, batch_job, found.stopped,
                                                     None if live else found.ended))

    def runs(self, handle: Handle, run_ids: Sequence[str]) -> dict[str, RunRecord]:
        """Each run of ``run_ids`` as ``latest_run`` reads it (one look each at the shared run directory)."""
        return {run_id: self.latest_run(handle, run_id) for run_id in run_ids}

    def rank_nodes(self, handle: Handle) -> dict[int, int]:
        """Global rank -> the node it ran on, in the newest attempt of the deployment's newest run in the shared run
        directory."""
        job = job_from(handle)
        files = noderecords.read(Login.of(job.settings), f"{job.workdir}/{RUNS_DIR}", None, handle.name).files
        return {rank.rank: node for node, mine in files.items() for rank in noderecords.ranks(mine)}

    def run_states(self, handle: Handle, run_id: str) -> dict[int, NodeEnd | None]:
        """Node ordinal -> its end of run ``run_id`` as ``latest_run`` reads it: its state with its exit code once the
        node's supervisor wrote its exit status, else ``running``, ``hung``, ``failed`` (lost), or None (unknown)."""
        return dict(self.latest_run(handle, run_id).nodes)

    def preemption_refused(self, handle: Handle) -> Refused | None:
        """PURE: Slurm warns a batch job (slurm.signal) and mlenv's script requeues it (slurm.requeue): a run in
        the allocation gets no warning."""
        settings = job_from(handle).settings
        cannot = "the slurm backend cannot preempt this run as Slurm does"
        if Allocation.of(handle).id is not None:
            return Refused(Feature.TAKE_AWAY, f"{cannot}: Slurm's warning signal (slurm.signal) reaches batch jobs "
                           f"only, and runs of {handle.name} are steps of its allocation: mlenv clean it, then drill "
                           "with -c CLUSTER")
        if settings.signal is None or not settings.requeue:
            return Refused(Feature.TAKE_AWAY, f"{cannot}: it needs slurm.signal (the warning before the time limit, "
                           "SIG@SECONDS such as USR1@60) and slurm.requeue: true (the job requeues itself after it) "
                           "in the cluster file")
        return None

    def take_away(self, handle: Handle, node: Node, run_id: str) -> Preemption:
        """Send run ``run_id``'s batch job its warning signal (slurm.signal), as Slurm does before the time limit:
        its script passes it to every rank and requeues the job once they ended (every node: ``node`` is moot)."""
        login, found, batch = self._jobs(handle)
        live = [entry.id for entry in batch if entry.run == run_id and found[entry.id].live]
        if not live:
            raise OperationError(f"no batch job of run {run_id} is queued or running")
        settings = job_from(handle).settings
        at = time.time()
        login.ok(["scancel", f"--signal={settings.signal_name}", "--batch", live[-1]])
        return Preemption(f"batch job {live[-1]} sent SIG{settings.signal_name} (slurm.signal)",
                          float(script.grace_seconds(settings.signal_seconds)), at)

    def _live(self, handle: Handle, run_id: str) -> tuple[Login, bool, JobInfo | None]:
        """Whether run ``run_id``'s batch job runs (not waiting to start, nor again), or its step runs in the
        allocation; and its newest batch job (its exit code once ended), None for a run inside the allocation."""
        login, found, batch = self._jobs(handle)
        mine = [found[submitted.id] for submitted in batch if submitted.run == run_id]
        job = mine[-1] if mine else None
        live = job is not None and job.live and job.state not in runstate.WAITING
        if job is not None and not job.live:
            job = jobs.state(login, job.id)
        allocation = Allocation.of(handle).id
        if job is None and allocation is not None and found[allocation].state == "RUNNING":
            steps = login.ok(["squeue", "-h", "-s", f"--jobs={allocation}", "-o", "%j"]).split()
            live = script.step_name(run_id) in steps
        return login, live, job


def _placement(handle: Handle, job: SlurmJob, exclude: Sequence[str]) -> dict[int, tuple[str, str]]:
    """PURE: node -> (its excluded host, the allocation's spare node that runs instead), the allocation's first
    ``job.nodes`` nodes being the job's; OperationError when the spares are too few."""
    held = Allocation.of(handle).held
    if not exclude or not held:
        return place(handle.name, list(exclude), [], exclude) if exclude else {}  # nodes unknown: none to spare
    return place(handle.name, held[:job.nodes], held[job.nodes:], exclude)


def _step_hosts(handle: Handle, job: SlurmJob, placed: Mapping[int, tuple[str, str]]) -> tuple[str, ...]:
    """The run's nodes inside the allocation, in the order of their node ranks: its first ``job.nodes`` nodes with
    the spares of ``placed`` in the excluded ones' place, so that a spare takes the node rank of the node it replaces
    (the run's tasks take their rank from this order, not from Slurm's, script.task_wrapper)."""
    held = Allocation.of(handle).held[:job.nodes]
    return tuple(placed[index][1] if index in placed else host for index, host in enumerate(held))


def _job_detail(login: Login, job: SlurmJob, submitted: SubmittedJob, current: JobInfo) -> str | None:
    """A batch job's reason while pending, its exit code once ended (from its run's exit file once Slurm has
    forgotten it), or the job it handed its run on to."""
    run_id = submitted.run or ""
    if current.state == "PENDING":
        return current.reason_words()
    if current.live:
        return None
    if submitted.next:
        return f"its run went on as job {submitted.next}, without a node the restart policy left out"
    code = current.exit_code
    if current.state == jobs.GONE and run_id:
        code = run.exit_file(login, job.run_path(run_id))
    return None if code is None else f"exit code {code}"


def _addresses(login: Login, job_id: str, hosts: Sequence[str]) -> list[str | None]:
    """Each node's address, as ``hostname --ip-address`` says there (one step over every node, its lines labelled
    with the task, which is the node's index); None for a node that did not say."""
    said = login.ok(["srun", f"--jobid={job_id}", "--overlap", f"--nodes={len(hosts)}", "--ntasks-per-node=1",
                     "--label", "hostname", "--ip-address"])
    found: dict[int, str] = {}
    for line in said.splitlines():
        task, _, words = line.partition(":")
        if task.strip().isdigit() and words.split():
            found[int(task)] = words.split()[0]
    return [found.get(index) for index in range(len(hosts))]


def _wait_gone(login: Login, job_ids: list[str]) -> None:
    deadline = time.monotonic() + CLEAN_TIMEOUT
    while any(current.live for current in jobs.query(login, job_ids, exit_codes=False).values()):
        if time.monotonic() > deadline:
            raise OperationError(f"job(s) {', '.join(job_ids)} still there {CLEAN_TIMEOUT:.0f}s after scancel; "
                                 "squeue shows why")
        time.sleep(0.25)
