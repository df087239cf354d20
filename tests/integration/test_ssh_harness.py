"""The ssh test machines themselves: real sshd per machine, real ssh and rsync against them, and the failures the
ssh backend must report (changed host key, refused, silent, hung, stopped machine)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests._prereq import require

if TYPE_CHECKING:  # imported at run time as a plugin, so that pytest rewrites its asserts
    from tests.integration.ssh_hosts import SshCluster, SshHostsFactory

pytest_plugins = ["tests.integration.ssh_hosts"]

CHANGED = "REMOTE HOST IDENTIFICATION HAS CHANGED"

# Runs on one machine: listen on its address, say which port, tell the first caller this machine's hostname.
SERVE_HOSTNAME = """\
import socket, sys
server = socket.create_server((sys.argv[1], 0))
server.settimeout(20)
print(server.getsockname()[1], flush=True)
connection, _ = server.accept()
connection.sendall(socket.gethostname().encode())
connection.close()
"""

CALL = """\
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as s:
    print(s.recv(100).decode())
"""


@pytest.fixture(params=["shared", "separate"])
def cluster(request: pytest.FixtureRequest, ssh_hosts: SshHostsFactory) -> SshCluster:
    """Two machines, sharing this machine's files or each with its own workdir."""
    return ssh_hosts(2, separate=request.param == "separate")


def _timed(cluster: SshCluster, target: str, connect_timeout: int) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    result = cluster.ssh(target, "true", extra=("-o", f"ConnectTimeout={connect_timeout}"), timeout=30)
    return result, time.monotonic() - start


def test_each_machine_runs_commands_as_itself(cluster: SshCluster) -> None:
    for host in cluster.hosts:
        result = cluster.ssh(host, "sh", "-c", 'hostname; id -u; echo "$SSH_CONNECTION"')
        assert result.returncode == 0, result.stderr
        name, uid, connection = result.stdout.splitlines()
        assert (name, uid, connection.split()[2:]) == (host.name, "0", [host.address, str(host.port)])


def test_arguments_arrive_verbatim(ssh_hosts: SshHostsFactory) -> None:
    cluster = ssh_hosts(1)
    arguments = ["a b", "$HOME", "it's", "*", "-n", "", "x;touch y"]
    result = cluster.ssh(cluster.hosts[0], "printf", "[%s]", *arguments)
    assert result.stdout == "".join(f"[{argument}]" for argument in arguments), result.stderr


def test_rsync_to_each_machine(cluster: SshCluster, tmp_path: Path) -> None:
    require("rsync")
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "train.py").write_text("print('hi')\n")
    for host in cluster.hosts:
        result = subprocess.run(["rsync", "-a", "-e", cluster.rsync_shell(), f"{source}/",
                                 f"{host.name}:{cluster.workdir}/code/"], capture_output=True, text=True, timeout=60,
                                check=False)
        assert result.returncode == 0, result.stderr
        assert (host.files / "code" / "pkg" / "train.py").read_text() == "print('hi')\n"
        assert cluster.ssh(host, "cat", f"{cluster.workdir}/code/pkg/train.py").stdout == "print('hi')\n"


def test_first_contact_records_the_host_key(ssh_hosts: SshHostsFactory) -> None:
    cluster = ssh_hosts(1)
    host = cluster.hosts[0]
    assert not cluster.known_hosts.exists()
    result = cluster.ssh(host, "true")
    assert result.returncode == 0, result.stderr
    assert f"Permanently added '{host.known_hosts_name}' (ED25519) to the list of known hosts" in result.stderr
    recorded = subprocess.run(["ssh-keygen", "-F", host.known_hosts_name, "-f", str(cluster.known_hosts)],
                              capture_output=True, text=True, timeout=10, check=True).stdout
    assert host.host_key.with_suffix(".pub").read_text().split()[1] in recorded


def test_changed_host_key_is_refused(ssh_hosts: SshHostsFactory) -> None:
    cluster = ssh_hosts(1)
    host = cluster.hosts[0]
    assert cluster.ssh(host, "true").returncode == 0
    known = cluster.known_hosts.read_text()
    cluster.change_host_key(host)
    result = cluster.ssh(host, "touch", f"{cluster.workdir}/ran")
    assert result.returncode == 255
    assert CHANGED in result.stderr and "Host key verification failed." in result.stderr
    assert not (host.files / "ran").exists()
    assert cluster.known_hosts.read_text() == known  # accept-new adds keys, it never replaces one


def test_control_master_carries_later_commands(ssh_hosts: SshHostsFactory) -> None:
    cluster = ssh_hosts(1)
    host = cluster.hosts[0]
    first, second = (cluster.ssh(host, "sh", "-c", 'echo "$SSH_CONNECTION"').stdout for _ in range(2))
    assert first and first == second  # the same TCP connection, client port included
    check = subprocess.run(cluster.ssh_argv(host, extra=("-O", "check")), capture_output=True, text=True,
                           timeout=10, check=False)
    assert check.returncode == 0 and "Master running" in check.stderr


# (kind, ConnectTimeout, what ssh says, seconds it takes): refused long before the timeout, the others at it.
UNANSWERED = [
    ("refused", 10, "Connection refused", (0, 5)),
    ("silent", 1, "Connection timed out", (0.9, 5)),
    ("hung", 1, "Connection timed out during banner exchange", (0.9, 5)),
]


@pytest.mark.parametrize(("kind", "connect_timeout", "message", "seconds"), UNANSWERED)
def test_unanswered_addresses_fail_clearly_and_in_time(ssh_hosts: SshHostsFactory, kind: str, connect_timeout: int,
                                                        message: str, seconds: tuple[float, float]) -> None:
    cluster = ssh_hosts(1)
    spec = {"refused": cluster.refused_address, "silent": cluster.silent_address,
            "hung": cluster.hung_address}[kind]()
    result, elapsed = _timed(cluster, f"ssh://{spec}", connect_timeout)  # ssh takes user@host:port only as a URI
    assert result.returncode == 255 and message in result.stderr, result.stderr
    assert seconds[0] <= elapsed < seconds[1]


def test_stopped_machine_is_gone_with_its_processes(ssh_hosts: SshHostsFactory) -> None:
    cluster = ssh_hosts(2)
    down, up = cluster.hosts
    marker = "297.5"  # a sleep this machine's job runs: nothing else on this box sleeps that long
    assert cluster.ssh(down, "sh", "-c", f"sleep {marker} >/dev/null 2>&1 &").returncode == 0
    assert _sleeping(marker)
    cluster.stop(down)
    assert not _sleeping(marker)
    result, elapsed = _timed(cluster, down.name, connect_timeout=10)
    assert result.returncode == 255 and "Connection refused" in result.stderr and elapsed < 5
    assert cluster.ssh(up, "true").returncode == 0


def test_separate_machines_see_their_own_files_at_one_path(ssh_hosts: SshHostsFactory) -> None:
    shared, separate = ssh_hosts(2), ssh_hosts(2, separate=True)
    (shared.workdir / "marker").write_text("shared")
    for host in separate.hosts:
        (host.files / "marker").write_text(host.name)
    seen = {host.name: shared.ssh(host, "cat", f"{shared.workdir}/marker").stdout for host in shared.hosts}
    assert seen == {"node0": "shared", "node1": "shared"}
    seen = {host.name: separate.ssh(host, "cat", f"{separate.workdir}/marker").stdout for host in separate.hosts}
    assert seen == {"node0": "node0", "node1": "node1"}
    assert not (separate.workdir / "marker").exists()  # this machine's view of the path is a third one
    assert [host.address for host in shared.hosts + separate.hosts] == [f"127.0.0.{i}" for i in (2, 3, 4, 5)]


def test_port_on_one_machine_is_reachable_from_another(ssh_hosts: SshHostsFactory) -> None:
    cluster = ssh_hosts(2)
    master, worker = cluster.hosts
    with subprocess.Popen(cluster.ssh_argv(master, sys.executable, "-c", SERVE_HOSTNAME, master.address),
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True) as server:
        assert server.stdout is not None
        port = server.stdout.readline().strip()  # bounded: the server gives up accepting after 20 s
        result = cluster.ssh(worker, sys.executable, "-c", CALL, master.address, port)
        assert server.wait(timeout=30) == 0
    assert result.returncode == 0 and result.stdout == "node0\n", result.stderr


def test_proxy_jump_reaches_a_machine_through_another(ssh_hosts: SshHostsFactory) -> None:
    cluster = ssh_hosts(2)
    jump, target = cluster.hosts
    result = cluster.ssh(target, "hostname", extra=("-J", jump.name))
    assert result.returncode == 0 and result.stdout == f"{target.name}\n", result.stderr


def _sleeping(seconds: str) -> bool:
    """Whether a ``sleep seconds`` runs anywhere on this box (processes in namespaces included)."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if cmdline.read_bytes() == f"sleep\0{seconds}\0".encode():
                return True
        except OSError:
            continue
    return False
