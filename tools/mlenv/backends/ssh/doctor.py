"""Preflight checks of plain hosts for ``mlenv doctor``: ssh and rsync here; on each host and spare host: reachable,
host key known or new, Python, rsync, workdir writable, free disk, GPUs (``nvidia-smi -L`` when gpus.per_node > 0);
and host 0, the master, reachable from every other host on a free port, as the rendezvous will be. Changes nothing
but known_hosts (accept-new records a new host's key, as the first deploy would)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import threading
from typing import TYPE_CHECKING

from mlenv.backends.ssh.deploy import GIB, MIN_FREE_BYTES, MIN_PYTHON
from mlenv.backends.ssh.diagnose import DEFAULT_KNOWN_HOSTS, keygen, needs_passphrase
from mlenv.backends.ssh.facts import Reply, answers, parallel, probe_all, probe_argv
from mlenv.backends.ssh.target import SshTarget
from mlenv.backends.sshlink.hosts import HostSpec, resolve
from mlenv.core.capabilities import Check
from mlenv.errors import MlenvError, shown

if TYPE_CHECKING:
    from mlenv.backends.ssh.probe import ProbeAnswer, ProbeRequest

LISTEN_SECONDS = 15
CONNECT_SECONDS = 5


def _local() -> list[Check]:
    checks = []
    for tool, package in (("ssh", "openssh-client"), ("ssh-keygen", "openssh-client"), ("rsync", "rsync")):
        found = shutil.which(tool)
        checks.append(Check(f"local {tool}", "PASS" if found else "FAIL", found or f"{tool} not found on PATH",
                            None if found else f"apt-get install {package}"))
    return checks


def _identity(key: str) -> Check:
    if not os.path.isfile(os.path.expanduser(key)):
        return Check("identity file", "FAIL", f"{shown(key)} does not exist",
                     f"set ssh.identity_file to your private key, or make one: ssh-keygen -t ed25519 -f {key}")
    if needs_passphrase(key):
        return Check("identity file", "WARN", f"{shown(key)} needs a passphrase: it works only from an ssh-agent",
                     f"ssh-add {shlex.quote(key)}")
    return Check("identity file", "PASS", f"{shown(key)} can be used without a passphrase")


def _host_key(target: SshTarget, host: HostSpec) -> Check:
    """Whether ``host``'s key is already known, before anything connects to it."""
    name = f"{host.display(target.transport.user)}: host key"
    resolved = resolve(target.transport.ssh_base(host), host.destination(target.transport.user))
    if resolved is None:
        return Check(name, "WARN", "ssh -G cannot say how the host is reached")
    files = [target.transport.known_hosts] if target.transport.known_hosts else list(resolved.known_hosts)
    for path in (os.path.expanduser(p) for p in files or [DEFAULT_KNOWN_HOSTS]):
        found = keygen("-F", resolved.known_hosts_name, "-f", path)
        if found is not None and found.returncode == 0 and found.stdout.strip():
            return Check(name, "PASS", f"{resolved.known_hosts_name} is known in {shown(path)}")
    return Check(name, "WARN", f"{resolved.known_hosts_name} is new: its key is accepted at first contact "
                               "(accept-new) and its fingerprint printed", "compare that fingerprint with the "
                                                                            "host's admin")


def _host_checks(target: SshTarget, ordinal: int, answer: Reply) -> list[Check]:
    label = target.label(ordinal)
    if answer.facts is None:
        return [Check(f"{label}: reachable", "FAIL", answer.error or "no answer", answer.fix)]
    facts = answer.facts
    version = tuple(facts["python"])
    python_ok = version >= MIN_PYTHON
    writable = facts["exists"] or facts["writable"]
    checks = [
        Check(f"{label}: reachable", "PASS", f"logged in to {shown(str(facts['hostname']))} "
                                             f"({facts.get('address') or '?'})"),
        Check(f"{label}: python", "PASS" if python_ok else "FAIL",
              f"{shown(target.python)} is Python {'.'.join(map(str, version))}",
              None if python_ok else "set ssh.python to Python 3.10 or newer"),
        Check(f"{label}: rsync", "PASS" if facts["rsync"] else "WARN",
              "rsync found" if facts["rsync"] else "no rsync: sync copies everything with tar",
              None if facts["rsync"] else "install rsync on the host"),
        Check(f"{label}: workdir", "PASS" if writable else "FAIL",
              f"{shown(str(facts['workspace']))} {'exists' if facts['exists'] else 'can be made'}" if writable
              else f"{shown(str(facts['workspace']))} cannot be made: no write permission",
              None if writable else "set ssh.workdir to a directory the login can write"),
        Check(f"{label}: disk", "PASS" if facts["free_bytes"] >= MIN_FREE_BYTES else "FAIL",
              f"{facts['free_bytes'] / GIB:.1f} GiB free", None if facts["free_bytes"] >= MIN_FREE_BYTES
              else "free some space, or set ssh.workdir to a larger filesystem"),
    ]
    wanted = target.gpus_per_node
    if wanted:
        gpus = facts.get("gpus", 0)
        ok = not facts.get("gpu_error") and gpus >= wanted
        evidence = str(facts.get("gpu_error") or f"nvidia-smi -L lists {gpus} GPUs (gpus.per_node: {wanted})")
        checks.append(Check(f"{label}: GPUs", "PASS" if ok else "FAIL", evidence,
                            None if ok else "install the NVIDIA driver, or lower gpus.per_node"))
    return checks


def _serve(target: SshTarget, count: int) -> tuple[subprocess.Popen[str], int | None]:
    """A listener on host 0 at a free port (it accepts ``count`` connections, then ends); its port."""
    host = target.hosts[0]
    request: ProbeRequest = {"workdir": target.workdir, "listen": {"count": count, "timeout": LISTEN_SECONDS}}
    server = subprocess.Popen(probe_argv(target.transport, host, target.python, request), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    timer = threading.Timer(target.transport.connect_timeout + LISTEN_SECONDS + 10, server.kill)
    timer.daemon = True
    timer.start()
    for line in server.stdout or ():
        found = answers(line)
        if found and "port" in found[0]:
            return server, int(found[0]["port"])
    return server, None


def _rendezvous(target: SshTarget, master: ProbeAnswer, reachable: list[int]) -> list[Check]:
    """Host 0 reachable from every other host and spare on a free port, at the address launch gives them
    (MASTER_ADDR)."""
    address = str(master.get("address") or target.hosts[0].host)
    others = [i for i in reachable if i]
    if not others:
        return []
    server, port = _serve(target, len(others))
    with server:
        if port is None:
            server.kill()
            return [Check("rendezvous", "FAIL", f"could not listen on {target.label(0)}")]
        request: ProbeRequest = {"workdir": target.workdir,
                            "connect": {"address": address, "port": port, "timeout": CONNECT_SECONDS}}
        requests = {i: (target.machines[i], request) for i in others}
        replies = probe_all(target.transport, target.python, requests)
        server.communicate()
    checks = []
    for ordinal, answer in sorted(replies.items()):
        facts = answer.facts or {}
        ok = bool(facts.get("connected"))
        evidence = (f"{target.label(ordinal)} reached {address}:{port} on {target.label(0)}" if ok else
                    str(facts.get("connect_error") or answer.error))
        checks.append(Check(f"{target.label(ordinal)}: master reachable", "PASS" if ok else "FAIL", evidence,
                            None if ok else f"let the hosts reach {address} on TCP ports (the rendezvous port is "
                                            "picked free at launch), or fix host 0's address"))
    return checks


def checks(target: SshTarget) -> list[Check]:
    """Every check of every host and spare host, none stopping the others."""
    found = _local()
    try:
        target.transport.write_config()
    except MlenvError as exc:
        return [*found, Check("ssh config", "FAIL", str(exc))]
    if target.transport.identity_file:
        found.append(_identity(target.transport.identity_file))
    keys = parallel(lambda host: _host_key(target, host), dict(enumerate(target.machines)))
    request: ProbeRequest = {"workdir": target.workdir, "gpus": target.gpus_per_node > 0}
    replies = probe_all(target.transport, target.python, {i: (h, request) for i, h in enumerate(target.machines)})
    for ordinal in range(len(target.machines)):
        found += [keys[ordinal], *_host_checks(target, ordinal, replies[ordinal])]
    master = replies[0].facts
    if master is not None:
        found += _rendezvous(target, master, [i for i, r in replies.items() if r.facts is not None])
    return found

