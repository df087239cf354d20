"""Where Slurm's commands run: on this machine, or over ssh on the cluster's login host (``slurm.login``).

Remote calls go through the ssh backend's transport: argv lists, BatchMode, ConnectTimeout, accept-new host keys
and one multiplexed connection (so polling squeue pays the handshake once); the remote command is one
shlex-quoted string for the login shell.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from mlenv.backends.sshlink.fields import DEFAULT_CONNECT_TIMEOUT
from mlenv.backends.sshlink.transport import SSH_FAILED
from mlenv.core.capabilities import CopyTarget
from mlenv.errors import OperationError, shown

if TYPE_CHECKING:
    from mlenv.backends.slurm.settings import SlurmSettings
    from mlenv.backends.sshlink.hosts import HostSpec
    from mlenv.backends.sshlink.transport import Transport

CALL_TIMEOUT = 60.0
"""Seconds a Slurm command (or a file read) may take."""


@dataclass(frozen=True)
class Login:
    """This machine (``destination`` None) or the login host ``[user@]host[:port]``, reached as ``slurm.ssh``
    says (key, known_hosts, ProxyJump, connect timeout; None leaves each to ssh's own configuration)."""

    destination: str | None
    identity_file: str | None = None
    known_hosts: str | None = None
    jump: str | None = None
    connect_timeout: int = DEFAULT_CONNECT_TIMEOUT

    @classmethod
    def of(cls, settings: SlurmSettings) -> Login:
        """Where the cluster file's Slurm commands run."""
        return cls(settings.login, settings.login_identity_file, settings.login_known_hosts, settings.login_jump,
                   settings.login_connect_timeout or DEFAULT_CONNECT_TIMEOUT)

    @property
    def where(self) -> str:
        """How messages name it."""
        return f"the login host {shown(self.destination)}" if self.destination else "this machine"

    @cached_property
    def _ssh(self) -> tuple[Transport, HostSpec]:
        # lazy for the cold start of mlenv render of a Slurm file (ipaddress, urllib.parse: 5 ms): only ssh needs them
        from mlenv.backends.sshlink.hosts import parse_host
        from mlenv.backends.sshlink.transport import Transport, control_dir

        transport = Transport(connect_timeout=self.connect_timeout, control_dir=control_dir(os.getuid()),
                              identity_file=self.identity_file, known_hosts=self.known_hosts, jump=self.jump)
        transport.write_config()
        return transport, parse_host(self.destination)

    def argv(self, command: Sequence[str], *, tty: bool = False) -> list[str]:
        """A local command line that runs ``command`` (an argv) there."""
        if self.destination is None:
            return list(command)
        transport, host = self._ssh
        return transport.ssh_argv(host, command, tty=tty)

    def copy_target(self, path: str) -> CopyTarget:
        """rsync's destination for ``path`` there (over ssh for a login host)."""
        if self.destination is None:
            return CopyTarget(destination=path.rstrip("/") + "/")
        transport, host = self._ssh
        return CopyTarget(destination=transport.destination(host, path), rsh=transport.ssh_base(host))

    def run(self, command: Sequence[str], *, stdin: bytes | None = None,
            timeout: float = CALL_TIMEOUT) -> subprocess.CompletedProcess[bytes]:
        """Run ``command`` there and wait; OperationError when it cannot start, the login host cannot be
        reached, or it takes longer than ``timeout``."""
        argv = self.argv(command)
        try:
            if stdin is None:
                result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                                        check=False)
            else:
                result = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout, check=False)
        except FileNotFoundError:
            raise OperationError(f"{argv[0]} not found on this machine: install the Slurm client tools (sbatch, "
                                 "squeue, srun), or set slurm.login to run them on the cluster's login host"
                                 ) from None
        except subprocess.TimeoutExpired:
            raise OperationError(f"{shlex.join(command)} on {self.where} took longer than {timeout:.0f}s") from None
        if self.destination is not None and result.returncode == SSH_FAILED:
            raise OperationError(f"cannot reach {self.where}: {last_line(result.stderr) or 'ssh failed'}; check "
                                 f"that `ssh {self.destination}` works without a password (ssh-agent)")
        return result

    def ok(self, command: Sequence[str], *, stdin: bytes | None = None, timeout: float = CALL_TIMEOUT) -> str:
        """Run ``command`` there; its stdout, or OperationError with its own message when it fails."""
        result = self.run(command, stdin=stdin, timeout=timeout)
        if result.returncode != 0:
            message = result.stderr.decode(errors="replace").strip() or f"exit code {result.returncode}"
            raise OperationError(f"{shlex.join(command)} failed on {self.where}:\n{message}")
        return result.stdout.decode(errors="replace")

    def size(self, path: str) -> int:
        """The size of the file ``path`` there (0 while it does not exist)."""
        if self.destination is None:
            try:
                return Path(path).stat().st_size
            except FileNotFoundError:
                return 0
            except OSError as exc:
                raise OperationError(f"cannot read {shown(path)}: {exc.strerror}") from None
        result = self.run(["sh", "-c", 'if test -e "$1"; then wc -c < "$1"; else echo 0; fi', "sh", path])
        if result.returncode != 0 or not result.stdout.strip().isdigit():
            raise OperationError(f"cannot read {shown(path)} on {self.where}: {last_line(result.stderr)}")
        return int(result.stdout)

    def read(self, path: str, offset: int) -> bytes:
        """The bytes of the file ``path`` there from ``offset`` on (nothing while it does not exist)."""
        if self.destination is None:
            try:
                with Path(path).open("rb") as handle:
                    handle.seek(offset)
                    return handle.read()
            except FileNotFoundError:
                return b""
            except OSError as exc:
                raise OperationError(f"cannot read {shown(path)}: {exc.strerror}") from None
        result = self.run(["sh", "-c", 'test ! -e "$2" || exec tail -c "+$1" -- "$2"', "sh", str(offset + 1), path])
        if result.returncode != 0:
            raise OperationError(f"cannot read {shown(path)} on {self.where}: {last_line(result.stderr)}")
        return result.stdout


def last_line(stderr: bytes) -> str:
    """The last non-empty line of a command's error output."""
    lines = [line for line in stderr.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""
