"""Launch, stop and run logs for backends that start a command on each node through their exec (pods, local
"pods", ssh hosts): the runtime's ``launch``/``stop``/``logs`` on every node at once. A backend gets all of it by
inheriting :class:`FanoutJobs` and providing ``nodes`` and ``exec_argv``; what else it may override is
``core.capabilities.FanoutHooks``.

mlenv render imports this module (and uses no verb of it): what only launching, stopping or reading runs needs (the
parallel runner, the runtime's control and records) is imported in those verbs, lazy for that start-up."""

from __future__ import annotations

import json
import shlex
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from mlenv.core.capabilities import FanoutHooks, Handle, LaunchOutcome, LaunchRequest, LaunchSpec, Node
from mlenv.core.remote import RUNTIME_DIR, secrets_input
from mlenv.core.spares import described, place
from mlenv.errors import OperationError
from mlenv.runtime.records.jsonvalue import JsonValue
from mlenv.ui import info

if TYPE_CHECKING:
    from mlenv.core.runrecords import NodeJob
    from mlenv.runtime.records.runrecord import RunRecord
    from mlenv.runtime.records.states import NodeEnd

RUNS_DIR = f"{RUNTIME_DIR}/runs"
"""Where each node keeps its runs, relative to its workspace: ``.mlenv/runs/<run id>/attempt-<K>/node<R>/``."""
MASK = "<forwarded from your environment>"


def run_dir(run_id: str) -> str:
    """A run's directory on the nodes, relative to the workspace."""
    return f"{RUNS_DIR}/{run_id}"


class FanoutJobs(FanoutHooks, ABC):
    """``prepare_launch``/``launch``/``stop``/``logs_argv`` on top of ``nodes`` and ``exec_argv``, which the backend
    provides, and the hooks of ``FanoutHooks``, which it may override."""

    @abstractmethod
    def nodes(self, handle: Handle) -> list[Node]:
        """The job's nodes, in node-rank order (``NodeAccess.nodes``)."""

    @abstractmethod
    def exec_argv(self, handle: Handle, node: Node, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  interactive: bool = False, stop_on_stdin_eof: bool = False,
                  secrets: Sequence[str] = ()) -> list[str]:
        """A local argv running ``argv`` on ``node`` (``NodeAccess.exec_argv``)."""

    def python(self, handle: Handle) -> str:
        """The Python that runs the runtime on the nodes (``FanoutHooks.python``)."""
        return "python3"

    def runtime(self, handle: Handle, *args: str) -> list[str]:
        """``python3 -m mlenv.runtime ARGS``: the command run on a node."""
        return [self.python(handle), "-m", "mlenv.runtime", *args]

    def runtime_as_launched(self, handle: Handle, node: Node, args: Sequence[str],
                            env: Mapping[str, str]) -> list[str]:
        """The runtime through exec: a launch here sets up nothing more than exec does."""
        return self.exec_argv(handle, node, self.runtime(handle, *args), env=env)

    def runs_own_ports(self, handle: Handle) -> bool:
        """The deployment's env contract fixes MASTER_PORT (pods, local pods): every run would get the same."""
        return False

    torch_fix: str | None = None
    """Nothing to name beyond doctor's own hint: launches run in the software exec reaches."""

    def spares(self, handle: Handle) -> list[Node]:
        """PURE: none by default; a backend that keeps spare hosts lists them (and its ``node_names`` is pure too)."""
        return []

    def node_names(self, handle: Handle) -> list[str]:
        """The nodes' names in ordinal order (what a spare takes the place of): PURE where the backend keeps
        spares."""
        return [node.name for node in self.nodes(handle)]

    def placement(self, handle: Handle, exclude: Sequence[str]) -> dict[int, tuple[str, str]]:
        """PURE: node ordinal -> (its excluded host, the spare that runs it instead); OperationError when the spares
        are too few. Without spares every excluded host stops the run, as these nodes cannot be done without."""
        if not exclude:
            return {}
        spares = [node.name for node in self.spares(handle)]
        nodes = self.node_names(handle) if spares else list(exclude)
        return place(handle.name, nodes, spares, exclude)

    def prepare_launch(self, handle: Handle, spec: LaunchSpec) -> LaunchRequest:
        """PURE: the same runtime launch on every node, in its workspace; a node whose host must be left out runs
        on a spare host (same node rank), or the launch is refused when the spares are too few."""
        placed = self.placement(handle, spec.exclude)
        options = ["--launcher", spec.launcher, *(["--nproc", str(spec.nproc)] if spec.nproc else []),
                   "--run-dir", run_dir(spec.run_id), *(["--detach"] if spec.detach else []),
                   *(["--max-restarts", str(spec.max_restarts)] if spec.detach and spec.max_restarts else []),
                   *(["--max-preemptions", str(spec.max_preemptions)]
                     if spec.detach and spec.max_preemptions is not None else []),
                   *(["--expect-transport", spec.expect_transport] if spec.expect_transport else []),
                   *spec.watchdog_options()]
        command = self.runtime(handle, "launch", *options, "--", spec.script, *spec.args)
        env = {"MLENV_RUN_ID": spec.run_id, "MLENV_RESTART_COUNT": str(spec.attempt),
               "MLENV_CHECKPOINT_DIR": checkpoint_dir(spec.run_id), "PYTHONUNBUFFERED": "1"}
        commands = {ordinal: command for ordinal in range(handle.nodes)}
        standbys = self.standbys(handle, spec, placed)
        if standbys:  # the spare hosts wait to take a node's place in a later attempt (runtime/supervise/standby.py)
            from mlenv.runtime.supervise.standby import (
                STANDBYS,  # here: render (prepare only) never pays for the runtime
            )

            env[STANDBYS] = ",".join(node.ip or node.name for node in standbys)
            commands.update({node.ordinal: self.runtime(handle, "launch", *options, "--standby", str(slot), "--",
                                                         spec.script, *spec.args)
                             for slot, node in enumerate(standbys)})
        names = {node.ordinal: node.name for node in standbys}
        return LaunchRequest(spec, launch_text(handle, spec, env, commands, placed, names), commands, env,
                             spares=placed)

    def standbys(self, handle: Handle, spec: LaunchSpec, placed: Mapping[int, tuple[str, str]]) -> list[Node]:
        """PURE: the spare hosts a detached run under --max-restarts keeps waiting (those not running a node), so
        that its nodes can leave a faulty node out without mlenv; none otherwise."""
        if not (spec.detach and spec.max_restarts):
            return []
        running = {spare for _, spare in placed.values()}
        return [node for node in self.spares(handle) if node.name not in running]

    def launch(self, handle: Handle, request: LaunchRequest, secrets: Mapping[str, str],
               log_dir: str) -> LaunchOutcome:
        """Start the request on every node at once; fail-fast and Ctrl-C stop all of them (unless detached). The
        nodes' supervisors get a control secret of this start's own (runtime/supervise/control.py), forwarded as the
        secrets are: on stdin, never on a command line."""
        import secrets as random_secrets  # lazy, as the imports below: mlenv render's start-up (module docstring)

        from mlenv.parallel import run_parallel
        from mlenv.runtime.supervise.proofs import SECRET_VARIABLE

        nodes = self.nodes(handle)
        if len(nodes) < handle.nodes:
            raise OperationError(f"only {len(nodes)} of {handle.nodes} nodes of {handle.name} are running: "
                                 f"mlenv status shows why; deploy again to repair")
        nodes = self.placed(handle, nodes, request.spares)
        detach = request.spec.detach
        forwarded = {**secrets, SECRET_VARIABLE: random_secrets.token_hex(16)}
        names = (*request.spec.secrets, SECRET_VARIABLE)
        self.keep_for_resume(handle, request, forwarded)
        self._start_standbys(handle, request, forwarded)
        commands = {n.ordinal: self.exec_argv(handle, n, request.commands[n.ordinal], env=request.env,
                                              stop_on_stdin_eof=not detach, secrets=names) for n in nodes}

        logs = {n.ordinal: Path(log_dir) / f"node-{n.ordinal}.log" for n in nodes}
        result = run_parallel(commands, fail_fast=not detach, logs=logs, keep_stdin=not detach,
                              stdin=secrets_input(names, forwarded), warnings_once=True)
        return LaunchOutcome(result.exit_code, dict(result.exit_codes), {n: str(p) for n, p in logs.items()},
                             result.first_failure, detached=detach, stopped=result.stopped,
                             interrupted=result.interrupted, hosts={n.ordinal: n.host for n in nodes})

    def keep_for_resume(self, handle: Handle, request: LaunchRequest, secrets: Mapping[str, str]) -> None:
        """Where a run's nodes come back on their own (pods after a preemption), keep what they need to resume a
        detached run (``secrets``: the forwarded ones and the control secret); nothing here."""
        return None

    def _start_standbys(self, handle: Handle, request: LaunchRequest, secrets: Mapping[str, str]) -> None:
        """Start the request's standbys on their spare hosts (each returns once it listens, ``secrets`` in its
        environment); OperationError naming the spare hosts that could not, after stopping the others."""
        from mlenv.parallel import run_parallel  # lazy: mlenv render's start-up

        standbys = self.standby_nodes(handle, request)
        if not standbys:
            return
        said: dict[int, list[str]] = {}
        names = tuple(secrets)
        result = run_parallel({node.ordinal: self.exec_argv(handle, node, request.commands[node.ordinal],
                                                            env=request.env, secrets=names) for node in standbys},
                              echo=False, on_line=lambda ordinal, line: said.setdefault(ordinal, []).append(line),
                              stdin=secrets_input(names, dict(secrets)))
        failed = [node for node in standbys if result.exit_codes.get(node.ordinal) != 0]
        if failed:
            stop = self.runtime(handle, "stop", "--run", request.spec.run_id)
            run_parallel({node.ordinal: self.exec_argv(handle, node, stop) for node in standbys}, echo=False)
            raise OperationError("cannot start the standby of the run on " + "; ".join(
                f"{node.name}: {(said.get(node.ordinal) or [f'exit {result.exit_codes.get(node.ordinal)}'])[-1]}"
                for node in failed))
        for node in standbys:
            for line in said.get(node.ordinal, []):
                info(f"{node.name}: {line}")

    def standby_nodes(self, handle: Handle, request: LaunchRequest) -> list[Node]:
        """PURE: the spare hosts ``request`` starts as the run's standbys, in the order of their slots."""
        return [node for node in self.spares(handle) if node.ordinal in request.commands]

    def placed(self, handle: Handle, nodes: Sequence[Node], spares: Mapping[int, tuple[str, str]]) -> list[Node]:
        """``nodes`` with each one named in ``spares`` replaced by its spare host (keeping the node's ordinal)."""
        held = {node.name: node for node in self.spares(handle)}
        return [replace(held[spares[node.ordinal][1]], ordinal=node.ordinal) if node.ordinal in spares else node
                for node in nodes]

    def machines(self, handle: Handle) -> list[Node]:
        """The nodes and the spare hosts: every machine a run may have used."""
        return [*self.nodes(handle), *self.spares(handle)]

    def stop(self, handle: Handle) -> int:
        """The runtime's ``stop`` on every node and spare host: every job mlenv started there ends; they stay."""
        from mlenv.parallel import run_parallel  # lazy: mlenv render's start-up

        nodes = self.machines(handle)
        commands = {n.ordinal: self.exec_argv(handle, n, self.runtime(handle, "stop")) for n in nodes}
        return run_parallel(commands).exit_code

    def run_states(self, handle: Handle, run_id: str) -> dict[int, NodeEnd | None]:
        """Node ordinal -> its end of run ``run_id`` (its exit code once it ended), or None (unknown)."""
        return dict(self.latest_run(handle, run_id).nodes)

    def latest_run(self, handle: Handle, run_id: str) -> RunRecord:
        """Run ``run_id`` as its nodes' supervisors recorded it (docs/runs.md; ``core.runrecords.latest_run``)."""
        from mlenv.core.runrecords import latest_run  # lazy: mlenv render's start-up

        return latest_run(run_id, self._node_jobs(handle, run_id))

    def runs(self, handle: Handle, run_ids: Sequence[str]) -> dict[str, RunRecord]:
        """Each run of ``run_ids`` as ``latest_run`` reads it, from one look at every machine."""
        from mlenv.core.runrecords import latest_run  # lazy: mlenv render's start-up

        nodes, spares, found = self._every_job(handle)
        return {run_id: latest_run(run_id, {ordinal: job for ordinal, (_, job)
                                            in _placed_jobs(nodes, spares, found, run_id).items()})
                for run_id in run_ids}

    def rank_nodes(self, handle: Handle) -> dict[int, int]:
        """Global rank -> the ordinal of the node it ran on, in each node's newest run."""
        return {rank["rank"]: ordinal for ordinal, job in self._node_jobs(handle, None).items() if job
                for rank in job.get("ranks", [])}

    def _node_jobs(self, handle: Handle, run_id: str | None) -> dict[int, NodeJob | None]:
        """Node ordinal -> its runtime's ``jobs --json`` entry of ``run_id`` (its newest run when None; None: none
        there, or unreadable)."""
        return {ordinal: job for ordinal, (_, job) in self._machine_jobs(handle, run_id).items()}

    def _machine_jobs(self, handle: Handle, run_id: str | None
                      ) -> dict[int, tuple[Node, NodeJob | None]]:
        """Node ordinal -> the machine that ran its part of ``run_id`` (its newest run when None) last, as a node of
        that ordinal (a spare host that took its place, else the node), and that machine's ``jobs --json`` entry."""
        return _placed_jobs(*self._every_job(handle), run_id)

    def _every_job(self, handle: Handle) -> tuple[list[Node], list[Node], dict[int, list[JsonValue]]]:
        """The nodes, the spare hosts, and each machine's runtime ``jobs --json`` (by ordinal; the spares' ordinals
        come after the nodes'; an empty list where unreadable)."""
        from mlenv.parallel import run_parallel  # lazy: mlenv render's start-up

        output: dict[int, list[str]] = {}
        nodes, spares = self.nodes(handle), self.spares(handle)
        commands = {n.ordinal: self.exec_argv(handle, n, self.runtime(handle, "jobs", "--json"))
                    for n in [*nodes, *spares]}
        run_parallel(commands, echo=False, on_line=lambda node, line: output.setdefault(node, []).append(line))
        return nodes, spares, {ordinal: _listed("\n".join(output.get(ordinal, []))) for ordinal in commands}

    def logs_argv(self, handle: Handle, node: Node, follow: bool, rank: int | None = None,
                  run_id: str | None = None) -> list[str]:
        """The runtime's ``logs`` of the node's latest run, or of ``run_id`` (``--follow`` ends with the run, or
        when the local side goes away; ``rank``: only that global rank's lines)."""
        options = [*(["--follow"] if follow else []), *(["--rank", str(rank)] if rank is not None else []),
                   *(["--run", run_id] if run_id is not None else [])]
        if self.spares(handle):  # the node's run may have run on a spare host
            node = self._machine_jobs(handle, run_id).get(node.ordinal, (node, None))[0]
        return self.exec_argv(handle, node, self.runtime(handle, "logs", *options), stop_on_stdin_eof=follow)


def _listed(jobs_json: str) -> list[JsonValue]:
    """One machine's ``jobs --json`` (empty when it is not a list)."""
    try:
        jobs = json.loads(jobs_json or "[]")
    except ValueError:
        return []
    return jobs if isinstance(jobs, list) else []


def _job(jobs: list[JsonValue], run_id: str | None) -> NodeJob | None:
    """One machine's ``jobs --json`` entry of ``run_id`` (of its newest run when None)."""
    mine = [job for job in jobs if isinstance(job, dict) and run_id in (None, job.get("run_id"))]
    return mine[-1] if mine else None


def _placed_jobs(nodes: list[Node], spares: list[Node], found: Mapping[int, list[JsonValue]],
                 run_id: str | None) -> dict[int, tuple[Node, NodeJob | None]]:
    """Node ordinal -> the machine that ran its part of ``run_id`` last and its entry, from every machine's jobs
    (``found``)."""
    jobs = {node.ordinal: (node, _job(found[node.ordinal], run_id)) for node in nodes}
    for spare in spares:  # a spare host that ran a node's part more recently than the node's own host
        job = _job(found[spare.ordinal], run_id)
        rank = job.get("node_rank") if job is not None else None
        if job is not None and isinstance(rank, int) and rank in jobs and _newer(job, jobs[rank][1]):
            jobs[rank] = (replace(spare, ordinal=rank), job)
    return jobs


def _newer(job: NodeJob, than: NodeJob | None) -> bool:
    """Whether ``job`` started after ``than`` (the later attempt when both started in the same millisecond)."""
    def key(entry: NodeJob) -> tuple[str, int]:
        return str(entry.get("started_at") or ""), int(entry.get("attempt") or 0)

    return than is None or key(job) > key(than)


def checkpoint_dir(run_id: str) -> str:
    """Where a run's script keeps its checkpoints, relative to the node's workspace (the run's working directory;
    the runtime makes it absolute there when the node's share starts): the same for every attempt, and shared by the
    nodes when the workspace is."""
    return f"checkpoints/{run_id}"


def launch_text(handle: Handle, spec: LaunchSpec, env: Mapping[str, str], commands: Mapping[int, Sequence[str]],
                spares: Mapping[int, tuple[str, str]], standbys: Mapping[int, str] | None = None) -> str:
    """What ``launch --dry-run`` prints: the nodes run on spare hosts, every node's command (and the standby's of
    each spare host in ``standbys``: ordinal -> its name), shell-quoted, forwarded secrets masked."""
    shown_env = [f"{k}={shlex.quote(v)}" for k, v in env.items()] + [f"{name}={MASK}" for name in spec.secrets]
    lines = [f"# mlenv launch: run {spec.run_id} of {handle.name} on {handle.nodes} nodes "
             f"({spec.launcher}{', detached' if spec.detach else ''})",
             "# each node runs, in its workspace, with the deployment's env contract and MLENV_NODE_RANK=<node>:",
             f"# env {' '.join(shown_env)}", *described(spares)]
    lines += [f"{f'standby on {standbys[ordinal]}' if standbys and ordinal in standbys else f'node-{ordinal}'}: "
              f"{shlex.join(command)}" for ordinal, command in sorted(commands.items())]
    return "\n".join(lines) + "\n"
