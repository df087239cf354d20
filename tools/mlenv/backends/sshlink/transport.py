"""Every ssh and rsync command line of the backend, as argv lists.

The options live in an ssh_config file passed with ``-F`` (options given with ``-o`` do not reach ProxyJump hosts;
a config file does): BatchMode, ConnectTimeout, ``StrictHostKeyChecking accept-new`` (never ``no``), the configured
known_hosts and key, and one multiplexed connection per host (ControlMaster/ControlPersist, ControlPath ``%C``
under a short private directory: socket paths are limited to 104-108 bytes). ssh takes the first value it reads
for an option, so these come first and the user's ~/.ssh/config (aliases, users, keys, ProxyJump per host) and the
system's config, which ``-F`` would otherwise skip, are included after them. The file is named after a digest of
its content, so deployments never overwrite each other's.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlenv.backends.sshlink.hosts import HostSpec
from mlenv.errors import OperationError, shown
from mlenv.runtime.records.jsonvalue import JsonObject

SSH_FAILED = 255
"""ssh's exit code for its own failure (connection, authentication), not the remote command's."""

CONTROL_ROOT = "/tmp"  # noqa: S108 - a private directory per user is made there and checked (owner, mode, no link)
CONTROL_PERSIST = 300
SERVER_ALIVE_INTERVAL = 10
SERVER_ALIVE_COUNT = 3
USER_CONFIGS = ("~/.ssh/config", "/etc/ssh/ssh_config")


def control_dir(uid: int) -> str:
    """Where the control sockets go: short, so ``<dir>/%C`` (40 characters) fits in a socket path."""
    return f"{CONTROL_ROOT}/mlenv-ssh-{uid}"


def _quoted(path: str) -> str:
    """A path as an ssh_config value: in double quotes, ``%`` escaped (ssh expands %-tokens in these)."""
    return '"' + path.replace("%", "%%") + '"'


@dataclass(frozen=True)
class Transport:
    """How every host of a deployment is reached: what goes into the ssh_config file, and the command lines."""

    connect_timeout: int
    control_dir: str
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    jump: str | None = None

    def to_data(self) -> JsonObject:
        """The handle's record of it."""
        return asdict(self)

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Transport:
        """Inverse of ``to_data``; TypeError/KeyError on a record of another shape."""
        transport = cls(**data)
        if not isinstance(transport.connect_timeout, int) or not isinstance(transport.control_dir, str):
            raise TypeError("transport fields have the wrong types")
        return transport

    @property
    def config_text(self) -> str:
        """The ssh_config file: mlenv's options first (ssh keeps the first value), then the user's own."""
        lines = ["# Written by mlenv for its ssh backend; passed to every ssh and rsync with -F.",
                 "BatchMode yes",
                 f"ConnectTimeout {self.connect_timeout}",
                 "StrictHostKeyChecking accept-new"]
        if self.known_hosts:
            lines.append(f"UserKnownHostsFile {_quoted(self.known_hosts)}")
        if self.identity_file:
            lines += [f"IdentityFile {_quoted(self.identity_file)}", "IdentitiesOnly yes"]
        lines += ["ControlMaster auto",
                  f"ControlPath {self.control_dir}/%C",
                  f"ControlPersist {CONTROL_PERSIST}",
                  f"ServerAliveInterval {SERVER_ALIVE_INTERVAL}",
                  f"ServerAliveCountMax {SERVER_ALIVE_COUNT}",
                  *(f"Include {path}" for path in USER_CONFIGS)]
        return "\n".join(lines) + "\n"

    @property
    def config_path(self) -> str:
        """Where the file is written: the control directory (ssh splices this path unquoted into the command
        line of ProxyJump, so it must not hold spaces), named by the content's digest."""
        digest = hashlib.sha256(self.config_text.encode()).hexdigest()[:16]
        return f"{self.control_dir}/{digest}.conf"

    def write_config(self) -> str:
        """Make the private control directory and the config file (when missing or different); its path."""
        _private_dir(self.control_dir)
        path = Path(self.config_path)
        text = self.config_text
        try:
            current = path.read_text()
        except OSError:
            current = None
        if current != text:
            temporary = path.with_name(f".{path.name}.{os.getpid()}")
            temporary.write_text(text)
            temporary.replace(path)
        return str(path)

    def ssh_base(self, host: HostSpec) -> list[str]:
        """``ssh -F CONFIG [-p PORT] [-J JUMP]``: what every call to ``host`` starts with (also rsync's ``-e``)."""
        return ["ssh", "-F", self.config_path, *(["-p", str(host.port)] if host.port else []),
                *(["-J", self.jump] if self.jump else [])]

    def ssh_argv(self, host: HostSpec, remote: Sequence[str], *, tty: bool = False) -> list[str]:
        """Run ``remote`` (an argv) on ``host``. The remote side gets one string for its login shell, so every
        argument is quoted here."""
        return [*self.ssh_base(host), "-t" if tty else "-T", "--", host.destination(self.user), shlex.join(remote)]

    def destination(self, host: HostSpec, path: str) -> str:
        """``user@host:path/`` for rsync."""
        return f"{host.rsync_host(self.user)}:{path.rstrip('/')}/"


def _private_dir(path: str) -> None:
    """``path`` as a directory only this user can use; OperationError when it is someone else's or a link."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise OperationError(f"cannot make the ssh control directory {shown(path)}: {exc.strerror}") from None
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise OperationError(f"{shown(path)} must be a directory of yours that only you can use (ssh keeps its "
                             f"connections there): remove it, or fix it with chmod 700 {shlex.quote(path)}")
