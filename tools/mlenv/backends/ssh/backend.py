"""The ssh backend: a few plain machines (GPU boxes on-prem or rented) reached over ssh, no scheduler.

Node rank = position in ``ssh.hosts``; host 0 is the master. ``prepare`` is pure: the hosts, the ssh_config
(under a private control directory, see ``transport``) and what deploy checks. ``apply`` writes the ssh_config,
checks every host, makes the workspaces and finds out whether they are one shared directory; ``nodes`` (where every
verb that reaches the hosts starts) writes the ssh_config again when it is gone (a reboot clears /tmp). Every later
verb runs through ``exec_argv``, which only builds the command line
``ssh -F CONFIG ... -- user@host 'env K=V... sh -c WRAPPER sh WORKSPACE ARGV...'``: one multiplexed connection per
host, with the env contract passed explicitly (sshd takes no client env) and the stdin-EOF watcher of
``core.remote``, so a remote job stops when the local side goes away. Launch, stop and logs come from
:class:`FanoutJobs` (the runtime on every host); ``MASTER_PORT`` is picked free on host 0 at launch.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import yaml

from mlenv.backends.ssh import deploy as deploying
from mlenv.backends.ssh import doctor
from mlenv.backends.ssh.diagnose import failure
from mlenv.backends.ssh.facts import Reply, parallel, probe, probe_all
from mlenv.backends.ssh.settings import SshSettings
from mlenv.backends.ssh.target import SshTarget
from mlenv.backends.sshlink.hosts import HostSpec
from mlenv.backends.sshlink.transport import Transport, control_dir
from mlenv.core import remote
from mlenv.core.capabilities import (
    Check,
    Checks,
    CopyTarget,
    Deploy,
    Handle,
    Jobs,
    LaunchOutcome,
    LaunchRequest,
    LaunchSpec,
    Node,
    NodeAccess,
    NodeStatus,
    Recorder,
    Request,
)
from mlenv.core.fanout import FanoutJobs
from mlenv.errors import OperationError, UsageError, shown
from mlenv.parallel import run_parallel
from mlenv.plan import JobPlan
from mlenv.runtime.records.jsonvalue import JsonObject
from mlenv.runtime.records.states import RunState
from mlenv.runtime.supervise import standby
from mlenv.ui import info, warn

if TYPE_CHECKING:
    from mlenv.backends.ssh.probe import ProbeRequest

PORT_NOTE = "MASTER_PORT=<picked free on host 0 at launch>"
LEFTOVER_GRACE = 5
"""Seconds between SIGTERM and SIGKILL for what a failed or interrupted run left on the hosts."""


def _settings(plan: JobPlan) -> SshSettings:
    settings = plan.cluster.settings
    if not isinstance(settings, SshSettings):
        raise UsageError(f"{plan.cluster.source}: backend ssh needs its ssh: settings")
    return settings


def _owner(plan: JobPlan, target_hosts: Sequence[str], workdir: str) -> str:
    text = "\0".join([plan.name, workdir, *target_hosts])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class SshBackend(FanoutJobs, Deploy, NodeAccess, Jobs, Checks):
    """Plain machines over ssh: the runtime started on every host through its ssh connection."""

    name = "ssh"

    def __init__(self, uid: int | None = None) -> None:
        self.control_dir = control_dir(os.getuid() if uid is None else uid)

    def prepare(self, plan: JobPlan) -> Request:
        """PURE: the hosts in rank order, how ssh reaches them (the ssh_config) and what deploy does there."""
        settings = _settings(plan)
        if plan.nodes > len(settings.hosts):
            raise UsageError(f"--nodes {plan.nodes}: {plan.cluster.source} lists {len(settings.hosts)} hosts in "
                             "ssh.hosts (one node per host)")
        hosts = settings.hosts[:plan.nodes]
        transport = Transport(settings.connect_timeout, self.control_dir, settings.user, settings.identity_file,
                              settings.known_hosts, settings.jump)
        target = SshTarget(hosts, transport, settings.workdir, settings.python,
                           _owner(plan, [h.display(settings.user) for h in hosts], settings.workdir),
                           plan.gpus_per_node, spares=settings.spares)
        handle = Handle(self.name, plan.name, plan.nodes, plan.mode, False, dict(plan.env), target.to_data())
        text = _request_text(plan, target)
        return Request(handle, text, {"deploy.yaml": text, "ssh_config": transport.config_text}, target)

    def apply(self, request: Request, record: Recorder) -> Handle:
        """Record, then check every host, make the workspaces and detect a shared one; record what was learned."""
        target = SshTarget.of(request.handle)
        record(request.handle)
        target.transport.write_config()
        deployed = deploying.deploy(target)
        handle = replace(request.handle, shared_workspace=deployed.shared,
                         env={**request.handle.env, "MASTER_ADDR": deployed.master_addr},
                         data=deployed.target.to_data())
        record(handle)
        hosts = f"{handle.nodes} host{'s' if handle.nodes > 1 else ''}"
        info(f"{handle.name}: {hosts} ready, master {deployed.master_addr} ({target.label(0)}); next: mlenv sync, "
             "then mlenv launch SCRIPT")
        return handle

    def wait_ready(self, handle: Handle, timeout: float, record: Recorder) -> None:
        """Hosts are ready once deploy checked them; each must still answer (through its open connection)."""
        target = _reached(handle)
        target.deployed(handle.name)

        def reach(ordinal: int) -> str | None:
            host = target.machines[ordinal]
            result = subprocess.run(target.transport.ssh_argv(host, ["true"]), capture_output=True, text=True,
                                    stdin=subprocess.DEVNULL, timeout=target.transport.connect_timeout + timeout,
                                    check=False)
            return failure(target.transport, host, result.stderr).message if result.returncode else None

        errors = [e for e in parallel(reach, {i: i for i in range(len(target.machines))}).values() if e]
        if errors:
            raise OperationError("hosts not reachable:\n" + "\n".join(errors))

    def status(self, handle: Handle) -> list[NodeStatus]:
        """Every host, then every spare host (``spare: yes``): reachable, its GPUs, the mlenv jobs running there
        (the runtime's ``jobs --json``)."""
        target = _reached(handle)
        requests: dict[int, tuple[HostSpec, ProbeRequest]] = {
            i: (host, {"workdir": target.workspace(i), "gpus": target.gpus_per_node > 0, "jobs": True})
            for i, host in enumerate(target.machines)}
        replies = probe_all(target.transport, target.python, requests)
        return [_status_row(target, i, replies[i]) for i in range(len(target.machines))]

    def nodes(self, handle: Handle) -> list[Node]:
        """The deployed hosts, in rank order (``_reached``)."""
        target = _reached(handle)
        workspaces = target.deployed(handle.name)
        return [Node(i, target.label(i), workspaces[i], host.host, ready=True) for i, host in enumerate(target.hosts)]

    def python(self, handle: Handle) -> str:
        """The hosts' Python (ssh.python)."""
        return SshTarget.of(handle).python

    def node_names(self, handle: Handle) -> list[str]:
        """PURE: the hosts' labels, in rank order."""
        target = SshTarget.of(handle)
        return [target.label(i) for i in range(len(target.hosts))]

    def spares(self, handle: Handle) -> list[Node]:
        """PURE: the spare hosts (ssh.spares), their ordinals after the hosts'."""
        target = SshTarget.of(handle)
        return [Node(i, target.label(i), target.workspace(i), host.host, ready=True)
                for i, host in enumerate(target.machines) if i >= len(target.hosts)]

    def exec_argv(self, handle: Handle, node: Node, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  interactive: bool = False, stop_on_stdin_eof: bool = False,
                  secrets: Sequence[str] = ()) -> list[str]:
        """PURE: ``ssh ... -- user@host 'env K=V... sh -c WRAPPER sh WORKSPACE ARGV...'`` (``-t`` when
        interactive); the ssh_config it names is written by deploy and ``nodes``."""
        target = SshTarget.of(handle)
        variables = {**handle.env, "MLENV_NODE_RANK": str(node.ordinal), **(env or {})}
        script = remote.script(stop_on_stdin_eof=stop_on_stdin_eof and not interactive, secrets=secrets)
        command = ["env", *(f"{key}={value}" for key, value in variables.items()), "sh", "-c", script, "sh",
                   node.workspace, *argv]
        return target.transport.ssh_argv(target.machine(node.name, node.ordinal), command, tty=interactive)

    def copy_target(self, handle: Handle, node: Node) -> CopyTarget:
        """PURE: rsync over the host's ssh connection (``-e 'ssh -F CONFIG -p PORT'``) to ``user@host:WORKSPACE/``."""
        target = SshTarget.of(handle)
        host = target.machine(node.name, node.ordinal)
        return CopyTarget(target.transport.destination(host, node.workspace), target.transport.ssh_base(host))

    def data_volumes(self, handle: Handle) -> list[str]:
        """The workspaces ``clean --delete-data`` deletes (those deploy made; others are kept)."""
        target = SshTarget.of(handle)
        ordinals = [0] if handle.shared_workspace else range(len(target.machines))
        return [f"{target.label(i)}:{target.workspace(i)}" for i in ordinals]

    def clean(self, handle: Handle, delete_data: bool) -> None:
        """Stop every job mlenv started on the hosts (the runtime's ``stop``, by recorded PID); delete the
        workspaces only with ``delete_data`` and only where deploy made them. Twice is fine."""
        target = _reached(handle)
        every = range(len(target.machines))
        stopped = self._on_hosts(target, every, {"stop": True})
        errors = [r.error for r in stopped.values() if r.error]
        for ordinal, answer in sorted(stopped.items()):
            facts = answer.facts or {}
            for line in facts.get("stopped", []):
                info(f"{target.label(ordinal)}: {line}")
            if facts.get("error"):
                errors.append(f"{target.label(ordinal)}: {shown(str(facts['error']))}")
        if delete_data:
            reachable = [i for i in ([0] if handle.shared_workspace else every) if stopped[i].facts is not None]
            deleted = self._on_hosts(target, reachable, {"delete": True, "owner": target.owner})
            errors += [r.error for r in deleted.values() if r.error]
            for ordinal, answer in sorted(deleted.items()):
                _say_deleted(target, ordinal, answer)
        else:
            info(f"kept the workspaces ({', '.join(self.data_volumes(handle))}); mlenv clean --delete-data "
                 "deletes them")
        if errors:
            raise OperationError("clean did not finish on every host (run it again):\n" + "\n".join(errors))

    def _on_hosts(self, target: SshTarget, ordinals: Sequence[int], request: ProbeRequest) -> dict[int, Reply]:
        requests: dict[int, tuple[HostSpec, ProbeRequest]] = {
            i: (target.machines[i], {"workdir": target.workspace(i), **request}) for i in ordinals}
        return probe_all(target.transport, target.python, requests)

    def checks(self, plan: JobPlan) -> list[Check]:
        """Local ssh/rsync; per host: reachable, host key, Python, rsync, workdir, disk, GPUs; the master
        reachable from every host."""
        target: SshTarget = self.prepare(plan).payload
        return doctor.checks(target)

    def prepare_launch(self, handle: Handle, spec: LaunchSpec) -> LaunchRequest:
        """PURE: the runtime's launch on every host (a spare in an excluded host's place); MASTER_PORT is only
        picked at launch, and MASTER_ADDR too when node 0 runs on a spare."""
        request = super().prepare_launch(handle, spec)
        master = (f"# MASTER_ADDR=<the address of node 0's spare {request.spares[0][1]}, as its ssh server sees the "
                  "connection>\n") if 0 in request.spares else ""
        return replace(request, text=request.text + master + f"# {PORT_NOTE} (exec and shell see "
                                                             f"MASTER_PORT={handle.env.get('MASTER_PORT', '')})\n")

    def runs_own_ports(self, handle: Handle) -> bool:
        """Each launch picks a free MASTER_PORT (and the control port after it) on node 0's host."""
        return True

    def launch(self, handle: Handle, request: LaunchRequest, secrets: Mapping[str, str],
               log_dir: str) -> LaunchOutcome:
        """Pick a free MASTER_PORT on node 0's host (a fixed one collides on shared machines; its address is
        MASTER_ADDR when it is a spare), then start every host."""
        target = SshTarget.of(handle)
        (head,) = self.placed(handle, self.nodes(handle)[:1], request.spares)
        host = target.machine(head.name, head.ordinal)
        answer = probe(target.transport, host, target.python, {"workdir": head.workspace, "free_port": True})
        if answer.facts is None:
            raise OperationError(f"cannot pick the rendezvous port on {head.name} (node 0): {answer.error}")
        env = {**request.env, "MASTER_PORT": str(answer.facts["free_port"])}
        if 0 in request.spares:
            env["MASTER_ADDR"] = str(answer.facts.get("address") or host.host)
        info(f"MASTER_PORT {env['MASTER_PORT']} (free on {head.name}), MASTER_ADDR "
             f"{env.get('MASTER_ADDR', handle.env.get('MASTER_ADDR'))}")
        check_standby_ports(target, self.standby_nodes(handle, request), env)
        outcome = super().launch(handle, replace(request, env=env), secrets, log_dir)
        if outcome.exit_code != 0 and not outcome.detached:
            self._stop_leftovers(handle, request.spec.run_id, request.spares)
        return outcome

    def _stop_leftovers(self, handle: Handle, run_id: str, spares: Mapping[int, tuple[str, str]]) -> None:
        """After a failed or interrupted run, the runtime's ``stop`` of that run on every host: it ends every
        process carrying the run's marker, including those a launcher left behind when its parent was stopped
        (DeepSpeed's runner leaves its ``launch`` child running)."""
        command = self.runtime(handle, "stop", "--run", run_id, "--grace", str(LEFTOVER_GRACE))
        commands = {n.ordinal: self.exec_argv(handle, n, command) for n in self.placed(handle, self.nodes(handle),
                                                                                    spares)}
        lines: list[tuple[int, str]] = []
        run_parallel(commands, echo=False, on_line=lambda ordinal, line: lines.append((ordinal, line)))
        for ordinal, line in sorted(lines):
            if line.startswith("stopped"):
                info(f"node-{ordinal}: {line}")


def check_standby_ports(target: SshTarget, standbys: Sequence[Node], env: Mapping[str, str]) -> None:
    """Each standby's port (``MASTER_PORT`` + 2 + its slot, runtime/supervise/standby.py) free on its spare host,
    as node 0's ports are checked (the probe's ``port_free``); UsageError naming each host and port taken, before
    anything starts. A host that does not answer says so when its standby starts."""
    ports = {node.ordinal: standby.port(env, slot) for slot, node in enumerate(standbys)}
    answers = probe_all(target.transport, target.python, {
        node.ordinal: (target.machine(node.name, node.ordinal),
                       {"workdir": node.workspace, "ports": [ports[node.ordinal]]})
        for node in standbys})
    taken = [f"port {ports[node.ordinal]} on {node.name}" for node in standbys
             if (answers[node.ordinal].facts or {}).get("taken")]
    if taken:
        raise UsageError(f"the run's standby cannot listen: {', '.join(taken)} is taken (MASTER_PORT "
                         f"{env['MASTER_PORT']} + 2 + the standby's slot); nothing was started: free it, or launch "
                         "again (each launch picks another MASTER_PORT)")


def _reached(handle: Handle) -> SshTarget:
    """The hosts recorded in ``handle``, with the ssh_config every command to them uses written again when it is
    gone (a reboot clears /tmp): where the verbs that reach the hosts start."""
    target = SshTarget.of(handle)
    target.transport.write_config()
    return target


def _status_row(target: SshTarget, ordinal: int, answer: Reply) -> NodeStatus:
    label = target.label(ordinal)
    # the SPARE column only where the file has spare hosts
    spare = {"spare": "yes" if ordinal >= len(target.hosts) else "no"} if target.spares else {}
    facts = answer.facts
    if facts is None:
        return NodeStatus(label, ordinal, None, "Unreachable", False, 0, 0, None, detail=answer.error, extra=spare)
    jobs = facts.get("jobs")  # unknown (the host could not tell): no JOBS count rather than a made-up one
    running = {} if jobs is None else {
        "jobs": sum(1 for job in jobs if job.get("state") in (RunState.RUNNING, RunState.HUNG))}
    detail = None if facts["exists"] else "workspace missing: mlenv deploy makes it again"
    detail = detail or facts.get("gpu_error") or facts.get("jobs_error")
    return NodeStatus(label, ordinal, str(facts["hostname"]), "Reachable" if facts["exists"] else "NoWorkspace",
                      bool(facts["exists"]), 0, int(facts.get("gpus", 0)), facts.get("address"),
                      detail=None if detail is None else shown(str(detail)), extra={**running, **spare})


def _say_deleted(target: SshTarget, ordinal: int, answer: Reply) -> None:
    facts = answer.facts or {}
    where = f"{target.label(ordinal)}:{target.workspace(ordinal)}"
    if facts.get("deleted"):
        info(f"deleted the workspace {where}")
    elif facts.get("kept"):
        warn(f"kept the workspace {where}: {facts['kept']}")


def _request_text(plan: JobPlan, target: SshTarget) -> str:
    """What ``render`` and ``deploy --dry-run`` print: the hosts, what deploy does on each, the env contract and
    the ssh_config every ssh and rsync uses."""
    transport = target.transport
    checks = ["ssh login (BatchMode; a new host key is accepted and its fingerprint printed)",
              f"{target.python} is Python {'.'.join(map(str, deploying.MIN_PYTHON))}+",
              f"at least {deploying.MIN_FREE_BYTES >> 30} GiB free for the workspace",
              *([f"nvidia-smi -L lists at least {target.gpus_per_node} GPUs"] if target.gpus_per_node else []),
              f"mkdir -p {target.workdir} (marked as mlenv's when deploy makes it)",
              "shared workspace? a marker written through host 0, looked for through the others"]
    document: JsonObject = {
        "backend": "ssh",
        "name": plan.name,
        "hosts": [{"rank": i, "host": target.label(i),
                   "ssh": shlex.join([*transport.ssh_base(host), "--", host.destination(transport.user)])}
                  for i, host in enumerate(target.hosts)],
        **({"spares": [{"host": target.label(i), "ssh": shlex.join([*transport.ssh_base(host), "--",
                                                                  host.destination(transport.user)])}
                       for i, host in enumerate(target.machines) if i >= len(target.hosts)]} if target.spares else {}),
        "workdir": target.workdir,
        "python": target.python,
        "deploy_checks": list(checks),
        "env": {**plan.env, "MASTER_ADDR": "<host 0's address, as its ssh server sees the connection>",
                "MASTER_PORT": f"<picked free on host 0 at launch; exec and shell see {plan.env.get('MASTER_PORT')}>"},
        "launch": f"{PORT_NOTE}; the runtime on each host picks its NIC and NCCL settings",
    }
    config = "".join(f"#   {line}\n" for line in transport.config_text.splitlines())
    return (f"# mlenv deploy (ssh): {plan.name} on {len(target.hosts)} hosts, host 0 is the master\n"
            + yaml.safe_dump(document, sort_keys=False, width=120)
            + f"# ssh_config, written to {transport.config_path} and passed with -F to every ssh and rsync:\n"
            + config)
