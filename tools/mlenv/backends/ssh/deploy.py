"""Deploy on plain hosts: check every host and spare host (ssh login, Python, free disk, GPUs), make the workspace
dirs, and find out whether they share the workspace (a marker written through host 0, looked for through the others).

Host 0 goes first, so that on a shared filesystem it is host 0 that makes (and marks) the workspace and the
marker exists before the others look; the other hosts then go at once.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from mlenv.backends.ssh.facts import Reply, probe, probe_all
from mlenv.backends.ssh.target import SshTarget
from mlenv.errors import OperationError, shown
from mlenv.ui import info, warn

if TYPE_CHECKING:
    from mlenv.backends.ssh.probe import ProbeAnswer, ProbeRequest

MIN_FREE_BYTES = 1 << 30
MIN_PYTHON = (3, 10)
"""What the in-node runtime needs."""
GIB = float(1 << 30)


@dataclass(frozen=True)
class Deployed:
    """What deploy learned: the target with each host's workspace, whether they share it, host 0's address."""

    target: SshTarget
    shared: bool
    master_addr: str


def host_problems(target: SshTarget, ordinal: int, facts: ProbeAnswer) -> list[str]:
    """Why host ``ordinal`` cannot run nodes, from its probe answer (empty when it can)."""
    label = target.label(ordinal)
    problems = [f"{label}: {shown(str(facts['error']))}"] if facts.get("error") else []
    version = tuple(facts["python"])
    if version < MIN_PYTHON:
        problems.append(f"{label}: {shown(target.python)} is Python {'.'.join(map(str, version))}; mlenv's runtime "
                        f"needs {'.'.join(map(str, MIN_PYTHON))} or newer: set ssh.python to a newer one")
    if facts["free_bytes"] < MIN_FREE_BYTES:
        problems.append(f"{label}: only {facts['free_bytes'] / GIB:.2f} GiB free for {shown(facts['workspace'])}; "
                        f"at least {MIN_FREE_BYTES / GIB:.0f} GiB are needed")
    wanted = target.gpus_per_node
    if wanted and facts.get("gpu_error"):
        problems.append(f"{label}: gpus.per_node is {wanted} but {shown(str(facts['gpu_error']))}")
    elif wanted and facts.get("gpus", 0) < wanted:
        problems.append(f"{label}: nvidia-smi -L lists {facts.get('gpus', 0)} GPUs, gpus.per_node is {wanted}")
    return problems


def _summary(target: SshTarget, ordinal: int, facts: ProbeAnswer) -> str:
    gpus = f"{facts['gpus']} GPUs" if "gpus" in facts else "GPUs not checked (gpus.per_node: 0)"
    rsync = "rsync" if facts["rsync"] else "no rsync (sync copies everything with tar)"
    made = "made" if facts.get("created") else "already there"
    spare = " (spare)" if ordinal >= len(target.hosts) else ""
    return (f"{target.label(ordinal)}{spare} ({shown(str(facts['hostname']))}): Python "
            f"{'.'.join(map(str, facts['python']))}, {gpus}, {facts['free_bytes'] / GIB:.1f} GiB free, {rsync}; "
            f"workspace {shown(str(facts['workspace']))} ({made})")


def _request(target: SshTarget) -> ProbeRequest:
    return {"workdir": target.workdir, "make": True, "owner": target.owner, "gpus": target.gpus_per_node > 0}


def deploy(target: SshTarget) -> Deployed:
    """Check and prepare every host and spare; OperationError listing every host's problem at once."""
    token = secrets.token_hex(8)
    first, *others = target.machines
    several = bool(others)
    order = "host 0 first, then the others at once; " if several else ""
    spares = f" and {len(target.spares)} spare{'s' if len(target.spares) > 1 else ''}" if target.spares else ""
    info(f"checking {len(target.hosts)} host{'s' if len(target.hosts) > 1 else ''}{spares} over ssh ({order}each "
         f"gets {target.transport.connect_timeout} s to answer, ssh.connect_timeout)")
    replies = {0: probe(target.transport, first, target.python,
                        {**_request(target), "marker_write": token if several else None})}
    replies.update(probe_all(target.transport, target.python,
                             {i: (host, {**_request(target), "marker_look": token})
                              for i, host in enumerate(target.machines) if i}))
    if several and replies[0].facts is not None:
        probe(target.transport, first, target.python, {"workdir": target.workdir, "marker_remove": token})
    problems = _report(target, replies)
    if problems:
        raise OperationError(f"deploy failed on {len(problems)} of {len(target.machines)} hosts:\n"
                             + "\n".join(line for found in problems.values() for line in found))
    facts = {i: r.facts for i, r in replies.items() if r.facts is not None}
    seen = [bool(facts[i].get("marker_seen")) for i in range(1, len(target.machines))]
    shared = several and all(seen)
    if several:
        _say_shared(target, shared, seen)
    deployed = replace(target, workspaces=tuple(str(facts[i]["workspace"]) for i in range(len(target.machines))))
    return Deployed(deployed, shared, str(facts[0].get("address") or first.host))


def _report(target: SshTarget, replies: Mapping[int, Reply]) -> dict[int, list[str]]:
    """Print each host's summary; the problems of the hosts that have some."""
    problems: dict[int, list[str]] = {}
    for ordinal, answer in sorted(replies.items()):
        if answer.note:
            info(answer.note)
        found = (host_problems(target, ordinal, answer.facts) if answer.facts is not None
                 else [answer.error or f"{target.label(ordinal)}: no answer"])
        if found:
            problems[ordinal] = found
        elif answer.facts is not None:
            info(_summary(target, ordinal, answer.facts))
            if not answer.facts["rsync"]:
                warn(f"{target.label(ordinal)} has no rsync: sync copies the whole workspace every time "
                     "(install rsync there)")
    return problems


def _say_shared(target: SshTarget, shared: bool, seen: list[bool]) -> None:
    if shared:
        info("the hosts share the workspace (a file written through host 0 is seen by every host): sync copies "
             "once, and every host names its files (logs, PID records) by its node rank")
    elif any(seen):
        sharing = ", ".join(target.label(i + 1) for i, flag in enumerate(seen) if flag)
        warn(f"{sharing} share(s) host 0's workspace but not every host does: sync copies to every host")
    else:
        info("each host has its own workspace: sync copies to every host")
