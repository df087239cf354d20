"""Real sshd "machines" for the ssh-backend tests, started and stopped by the ``ssh_hosts`` fixture factory.

Each machine is one ``sshd -D -e`` on its own loopback address (127.0.0.2, 127.0.0.3, ...) and a free port, run
under ``unshare`` in its own PID, UTS and mount namespace: it has its own hostname (its ssh alias), and stopping
it ends every process that ran on it, as powering off a machine would. Machines either share this machine's
filesystem (as NFS homes do) or, with ``separate=True``, each has its own directory bind-mounted over the shared
``workdir`` path, so the same path holds different files on each. The loopback network is shared: a port opened
on one machine is reachable from the others.

The client side is what a user would configure: a per-run key pair, a per-run known_hosts with
``StrictHostKeyChecking=accept-new``, BatchMode, ConnectTimeout and ControlMaster multiplexing, both as an
ssh_config file with one ``Host`` alias per machine and as a list of ``-o`` options.

Use it from a test module with ``pytest_plugins = ["tests.integration.ssh_hosts"]``::

    def test_something(ssh_hosts: SshHostsFactory) -> None:
        cluster = ssh_hosts(2, separate=True)
        host = cluster.hosts[0]
        assert cluster.ssh(host, "hostname").stdout == "node0\\n"
        cluster.change_host_key(host)       # the next ssh to it fails: REMOTE HOST IDENTIFICATION HAS CHANGED
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import ipaddress
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pytest

from tests._prereq import require
from tests.helpers import free_port

FIRST_ADDRESS = ipaddress.IPv4Address("127.0.0.2")
SPARE_ADDRESS = "127.0.1.1"  # never given to a machine: for addresses where nobody answers
PRIVSEP_DIR = Path("/run/sshd")  # Debian's sshd refuses to start without it (systemd creates it at boot)
START_TIMEOUT = 10.0
COMMAND_TIMEOUT = 30.0
USER = "root"
PR_SET_PDEATHSIG = 1  # prctl(2)

# Inside the new namespaces: set the hostname, bind this machine's own directory over the workdir (when given),
# then become sshd, so that sshd is the namespace's init and its end is the end of everything it started.
HOST_SCRIPT = 'hostname "$1" && if [ -n "$2" ]; then mount --bind "$2" "$3"; fi && shift 3 && exec "$@"'


@dataclass
class SshHost:
    """One machine: where its sshd listens and, from this side, the files of its workdir."""

    name: str
    address: str
    port: int
    files: Path
    home: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def spec(self) -> str:
        """``user@address:port``, as a cluster file would name the machine."""
        return f"{USER}@{self.address}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """How known_hosts (and ssh's messages) name this machine: ``[address]:port``."""
        return f"[{self.address}]:{self.port}"

    @property
    def host_key(self) -> Path:
        return self.home / "ssh_host_ed25519_key"

    @property
    def log(self) -> Path:
        """sshd's own log (``-e``, LogLevel VERBOSE), appended to across restarts."""
        return self.home / "sshd.log"

    @property
    def sshd_config(self) -> Path:
        return self.home / "sshd_config"


@dataclass
class SshCluster:
    """Machines started together, with one client configuration (keys, known_hosts, control sockets) for all."""

    root: Path
    workdir: Path
    hosts: list[SshHost]
    control_dir: Path
    _listeners: list[socket.socket] = field(default_factory=list, repr=False)

    @property
    def identity(self) -> Path:
        """The client's private key (ed25519, no passphrase); its ``.pub`` is each machine's authorized key."""
        return self.root / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "known_hosts"

    @property
    def config(self) -> Path:
        """ssh_config: one ``Host`` alias per machine, then :attr:`options` for every host."""
        return self.root / "ssh_config"

    @property
    def options(self) -> list[str]:
        """The client options as ``Key=value`` strings, each one ``-o`` argument of ssh."""
        return [
            f"IdentityFile={self.identity}",
            "IdentitiesOnly=yes",
            f"UserKnownHostsFile={self.known_hosts}",
            "StrictHostKeyChecking=accept-new",
            "BatchMode=yes",
            "ConnectTimeout=5",
            "ControlMaster=auto",
            "ControlPersist=60",
            f"ControlPath={self.control_dir}/%C",
            "ServerAliveInterval=5",
            "ServerAliveCountMax=3",
        ]

    def ssh_argv(self, host: SshHost | str, *command: str, extra: tuple[str, ...] = ()) -> list[str]:
        """ssh through :attr:`config` to ``host`` (a machine or any destination), running ``command``.

        ssh hands the remote side one string for its shell, so each argument is quoted here.
        """
        destination = host.name if isinstance(host, SshHost) else host
        return ["ssh", "-F", str(self.config), *extra, "--", destination, *([shlex.join(command)] if command else [])]

    def ssh(self, host: SshHost | str, *command: str, extra: tuple[str, ...] = (), stdin: str = "",
            timeout: float = COMMAND_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """Run ``command`` on ``host``; never raises on failure (look at ``returncode``).

        Not with ``-v`` in ``extra``: a master started by this call keeps a -v client's stderr open, so waiting
        for its end would wait for ControlPersist (``-E FILE`` sends the debug log elsewhere).
        """
        return subprocess.run(self.ssh_argv(host, *command, extra=extra), input=stdin, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def rsync_shell(self) -> str:
        """The ``rsync -e`` value: rsync splits it on spaces itself, honouring quotes as a shell would."""
        return shlex.join(["ssh", "-F", str(self.config)])

    def start(self, host: SshHost) -> None:
        """Start ``host``'s sshd and wait (bounded) until it listens."""
        offset = host.log.stat().st_size if host.log.exists() else 0
        host.process = _spawn(host, None if host.files == self.workdir else self.workdir)
        _wait_listening(host, offset)

    def stop(self, host: SshHost) -> None:
        """Power ``host`` off: every process on it ends, its port refuses connections, its master closes."""
        if host.process is not None:
            _stop(host.process)
            host.process = None
        subprocess.run(self.ssh_argv(host, extra=("-O", "exit")), capture_output=True, timeout=COMMAND_TIMEOUT,
                       check=False)

    def change_host_key(self, host: SshHost) -> None:
        """Restart ``host`` on the same address with a new host key (a reinstalled machine)."""
        self.stop(host)
        host.host_key.unlink()
        host.host_key.with_suffix(".pub").unlink()
        _keygen(host.host_key, host.name)
        self.start(host)

    def refused_address(self) -> str:
        """``user@address:port`` where nothing listens: connecting is refused at once."""
        with socket.socket() as probe:
            probe.bind((SPARE_ADDRESS, 0))
            return f"{USER}@{SPARE_ADDRESS}:{probe.getsockname()[1]}"

    def silent_address(self) -> str:
        """``user@address:port`` that never answers a connection (a machine that is down behind a firewall):
        a listener whose one-slot accept queue is already full, so the kernel drops every new SYN."""
        listener = self._listener(backlog=0)
        self._listeners.append(socket.create_connection(listener.getsockname(), timeout=5))
        return f"{USER}@{SPARE_ADDRESS}:{listener.getsockname()[1]}"

    def hung_address(self) -> str:
        """``user@address:port`` that accepts TCP but never says a word (a hung sshd)."""
        return f"{USER}@{SPARE_ADDRESS}:{self._listener(backlog=64).getsockname()[1]}"

    def close(self) -> None:
        """Stop every machine and forget the control sockets and listeners."""
        for host in self.hosts:
            self.stop(host)
        for listener in self._listeners:
            listener.close()
        shutil.rmtree(self.control_dir, ignore_errors=True)

    def _listener(self, backlog: int) -> socket.socket:
        """A listener that never accepts: the kernel completes up to ``backlog`` + 1 handshakes for it."""
        listener = socket.socket()
        self._listeners.append(listener)
        listener.bind((SPARE_ADDRESS, 0))
        listener.listen(backlog)
        return listener


class SshHostsFactory(Protocol):
    """What the ``ssh_hosts`` fixture yields."""

    def __call__(self, count: int = 2, *, separate: bool = False,
                 env: Mapping[str, str] | None = None) -> SshCluster: ...


@pytest.fixture
def ssh_hosts(tmp_path: Path) -> Iterator[SshHostsFactory]:
    """Factory ``ssh_hosts(count=2, *, separate=False, env=None) -> SshCluster``; ``env`` is set in every ssh
    session (sshd's SetEnv), as a machine's profile would; every machine stops after the test."""
    require_ssh()
    clusters: list[SshCluster] = []

    def start(count: int = 2, *, separate: bool = False, env: Mapping[str, str] | None = None) -> SshCluster:
        first = FIRST_ADDRESS + sum(len(c.hosts) for c in clusters)
        cluster = create_cluster(tmp_path / f"ssh{len(clusters)}", count, separate=separate, first_address=first,
                                 env=env)
        clusters.append(cluster)
        for host in cluster.hosts:
            cluster.start(host)
        return cluster

    yield start
    for cluster in clusters:
        cluster.close()


def require_ssh() -> None:
    """Root (namespaces, /run/sshd, login as root) and OpenSSH; as root on Debian, install openssh-server when
    missing. Skip on a workstation, fail under CI=true."""
    if os.geteuid() != 0:
        message = "the ssh machines need root (mount, PID and UTS namespaces)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    if _sshd() is None and shutil.which("apt-get"):
        _apt_install("openssh-server", "openssh-client")
    require("ssh", "ssh-keygen", "unshare", *([] if _sshd() else ["sshd"]))


def create_cluster(root: Path, count: int, *, separate: bool, first_address: ipaddress.IPv4Address,
                   env: Mapping[str, str] | None = None) -> SshCluster:
    """Keys and configuration of ``count`` machines under ``root`` (nothing started)."""
    workdir = root / "workdir"
    workdir.mkdir(parents=True)
    # Short: a socket path must fit in sun_path (108 bytes on Linux, 104 on macOS) and %C alone is 40 characters.
    cluster = SshCluster(root, workdir, [], Path(tempfile.mkdtemp(prefix="mlenv-ssh-", dir="/tmp")))
    try:
        _keygen(cluster.identity, "mlenv-test-client")
        authorized_keys = root / "authorized_keys"
        shutil.copy(cluster.identity.with_suffix(".pub"), authorized_keys)
        cluster.hosts.extend(_host(root, index, str(first_address + index), separate, authorized_keys, env or {})
                             for index in range(count))
        cluster.config.write_text(_client_config(cluster))
    except BaseException:
        shutil.rmtree(cluster.control_dir)
        raise
    return cluster


def _host(root: Path, index: int, address: str, separate: bool, authorized_keys: Path,
          env: Mapping[str, str]) -> SshHost:
    home = root / "hosts" / f"node{index}"
    home.mkdir(parents=True)
    files = home / "workdir" if separate else root / "workdir"
    files.mkdir(exist_ok=True)
    host = SshHost(f"node{index}", address, free_port(address), files, home)
    _keygen(host.host_key, host.name)
    host.sshd_config.write_text(_sshd_config(host, authorized_keys, env))
    return host


def _sshd_config(host: SshHost, authorized_keys: Path, env: Mapping[str, str]) -> str:
    penalties = "PerSourcePenalties no\n" if _sshd_version() >= (9, 8) else ""  # failure tests must not block
    set_env = "".join(f"SetEnv {name}={value}\n" for name, value in env.items())
    return f"""\
ListenAddress {host.address}:{host.port}
HostKey {host.host_key}
PidFile none
AuthorizedKeysFile {authorized_keys}
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
StrictModes no
LogLevel VERBOSE
PrintMotd no
PrintLastLog no
Subsystem sftp internal-sftp
MaxStartups 64
MaxSessions 64
{penalties}{set_env}"""


def _client_config(cluster: SshCluster) -> str:
    aliases = "".join(f"Host {h.name}\n  HostName {h.address}\n  Port {h.port}\n  User {USER}\n" for h in cluster.hosts)
    return aliases + "Host *\n" + "".join(f"  {option.replace('=', ' ', 1)}\n" for option in cluster.options)


def _spawn(host: SshHost, workdir: Path | None) -> subprocess.Popen[bytes]:
    sshd = _sshd()
    assert sshd is not None
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    bind = [str(host.files), str(workdir)] if workdir else ["", ""]
    argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--propagation", "private",
            "sh", "-c", HOST_SCRIPT, "sh", host.name, *bind, sshd, "-D", "-e", "-f", str(host.sshd_config)]
    with host.log.open("ab") as log:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the test process dies, even unannounced (unshare --kill-child
    then takes sshd and its namespace along), so a killed test run leaves no machine behind."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _wait_listening(host: SshHost, offset: int) -> None:
    """Until sshd logs that it listens (no probe connection: newer sshd penalises those); bounded."""
    assert host.process is not None
    ready = f"Server listening on {host.address} port {host.port}.".encode()
    deadline = time.monotonic() + START_TIMEOUT
    while ready not in (log := host.log.read_bytes()[offset:]):  # bytes: sshd ends its lines with \r\n
        if host.process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sshd of {host.name} ({host.spec}) did not start:\n{log.decode(errors='replace')}")
        time.sleep(0.01)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to sshd (unshare's child, the namespace's init): the kernel then kills the rest of the namespace
    and unshare exits. SIGKILL to unshare if that takes too long (--kill-child takes sshd with it)."""
    with contextlib.suppress(OSError):  # already gone: nothing to signal
        for pid in Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split():
            os.kill(int(pid), signal.SIGTERM)
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def _keygen(path: Path, comment: str) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, capture_output=True, timeout=COMMAND_TIMEOUT)


def _sshd() -> str | None:
    """sshd's absolute path (sshd re-executes itself, so it insists on one); /usr/sbin may be off PATH."""
    return shutil.which("sshd", path=f"{os.environ.get('PATH', '')}{os.pathsep}/usr/sbin")


@functools.cache
def _sshd_version() -> tuple[int, int]:
    sshd = _sshd()
    assert sshd is not None
    banner = subprocess.run([sshd, "-V"], capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    match = re.search(r"OpenSSH_(\d+)\.(\d+)", banner.stderr + banner.stdout)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def _apt_install(*packages: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends",
                                                 *packages]):
        subprocess.run(argv, env=env, capture_output=True, timeout=600, check=False)
