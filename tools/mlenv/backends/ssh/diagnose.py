"""ssh's failures (exit 255 and its stderr) as one message naming the host, with the fix where there is one: a
changed host key (``ssh-keygen -R``), a key that needs a passphrase (ssh-agent), refused, silent or unknown hosts.
Also what first contact with a host printed: the fingerprint of the key that accept-new recorded."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass

from mlenv.backends.sshlink.hosts import HostSpec, Resolved, resolve
from mlenv.backends.sshlink.transport import Transport
from mlenv.errors import shown

CHANGED = "REMOTE HOST IDENTIFICATION HAS CHANGED"
ADDED = "Permanently added"
KEYGEN_TIMEOUT = 10.0
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


@dataclass(frozen=True)
class SshFailure:
    """Why a host could not be reached, in one line that names it, and the command that fixes it where there is
    one."""

    message: str
    fix: str | None = None


def _lines(stderr: str) -> list[str]:
    """ssh's own lines, without the banner of @ signs and the notes on keys it recorded."""
    return [line.strip() for line in stderr.splitlines()
            if line.strip() and not line.startswith("@") and ADDED not in line]


def _known_hosts(transport: Transport, resolved: Resolved | None) -> str:
    if transport.known_hosts:
        return transport.known_hosts
    return resolved.known_hosts[0] if resolved and resolved.known_hosts else DEFAULT_KNOWN_HOSTS


def keygen(*args: str) -> subprocess.CompletedProcess[str] | None:
    """``ssh-keygen ARGS`` (bounded); None when it cannot run."""
    try:
        return subprocess.run(["ssh-keygen", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=KEYGEN_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def needs_passphrase(key: str) -> bool:
    """Whether the private key file ``key`` is encrypted (``ssh-keygen -y -P ''`` cannot read it)."""
    path = os.path.expanduser(key)
    if not os.path.isfile(path):
        return False
    result = keygen("-y", "-P", "", "-f", path)
    return result is not None and result.returncode != 0 and "passphrase" in result.stderr


def _locked_key(transport: Transport, resolved: Resolved | None) -> str | None:
    """The first key ssh would offer that needs a passphrase; None when none does."""
    keys = [transport.identity_file] if transport.identity_file else list(resolved.identity_files if resolved else [])
    return next((key for key in keys if needs_passphrase(key)), None)


def failure(transport: Transport, host: HostSpec, stderr: str) -> SshFailure:
    """What went wrong reaching ``host``, in one line that names it, with its fix where there is one."""
    label = host.display(transport.user)
    lines = _lines(stderr)
    last = shown(lines[-1]) if lines else "no message from ssh"
    if CHANGED in stderr:
        resolved = resolve(transport.ssh_base(host), host.destination(transport.user))
        name = resolved.known_hosts_name if resolved else host.display()
        known = os.path.expanduser(_known_hosts(transport, resolved))
        fix = f"ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(known)}"
        return SshFailure(f"{label}: its host key has changed ({CHANGED}): ssh refuses to connect, as someone could "
                          f"be in between. If the machine was reinstalled, check its new key with its admin, then "
                          f"remove the old one and try again: {fix}", fix)
    if "Permission denied" in stderr:
        locked = _locked_key(transport, resolve(transport.ssh_base(host), host.destination(transport.user)))
        if locked is None:
            return SshFailure(f"{label}: login refused ({last})")
        fix = f"ssh-add {shlex.quote(locked)}"
        return SshFailure(f"{label}: login refused ({last}); the key {shown(locked)} needs a passphrase, which ssh "
                          f"cannot ask for here (BatchMode): load it into an ssh-agent first (eval \"$(ssh-agent)\"; "
                          f"{fix}) and run mlenv from that shell", fix)
    if "Host key verification failed" in stderr:
        return SshFailure(f"{label}: host key verification failed ({last}); compare the host's key with your "
                          "known_hosts")
    if "Connection refused" in stderr:
        return SshFailure(f"{label}: connection refused: no ssh server listens there ({last})")
    if "timed out" in stderr:
        return SshFailure(f"{label}: no answer within {transport.connect_timeout} s (ssh.connect_timeout): the "
                          f"machine is down, or a firewall drops the connection ({last})")
    if transport.jump and ("UNKNOWN port 65535" in stderr or "kex_exchange_identification" in stderr):
        return SshFailure(f"{label}: the connection through the jump host failed ({last}); check that "
                          f"ssh {shlex.quote(transport.jump)} works from here (ssh.jump)")
    if "Could not resolve hostname" in stderr:
        return SshFailure(f"{label}: unknown host name ({last}); a typo, or an alias missing from ~/.ssh/config?")
    return SshFailure(f"{label}: ssh failed: {last}")


def first_contact(transport: Transport, host: HostSpec, stderr: str) -> str | None:
    """When ssh recorded ``host``'s key just now (accept-new), which key: to compare with what its admin says."""
    if ADDED not in stderr:
        return None
    resolved = resolve(transport.ssh_base(host), host.destination(transport.user))
    known = os.path.expanduser(_known_hosts(transport, resolved))
    name = resolved.known_hosts_name if resolved else host.display()
    found = keygen("-l", "-F", name, "-f", known)
    prints = [line.split(maxsplit=1)[1] for line in (found.stdout.splitlines() if found else [])
              if line and not line.startswith("#") and len(line.split()) > 1]
    what = ", ".join(prints) or "its key"
    return f"{host.display(transport.user)}: first contact: recorded {what} in {shown(known)}"
