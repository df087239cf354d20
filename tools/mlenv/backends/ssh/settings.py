"""The ``ssh:`` section of a cluster file (schema: ``mlenv/backends/ssh.schema.json``), parsed for the ssh backend.
Imported at validate time for files with ``backend: ssh``, so it imports nothing heavy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlenv.backends.sshlink.fields import DEFAULT_CONNECT_TIMEOUT, jump_hosts, local_file, plain_text
from mlenv.backends.sshlink.hosts import HostError, HostSpec, parse_host
from mlenv.errors import show_value

if TYPE_CHECKING:
    from mlenv.config.reader import ClusterReader

DEFAULT_WORKDIR = "~/mlenv/workspace"
DEFAULT_PYTHON = "python3"


@dataclass(frozen=True)
class SshSettings:
    """How the ssh backend reaches and uses the machines."""

    hosts: tuple[HostSpec, ...]
    """Node rank = position; host 0 is the master."""
    user: str | None
    """Login for hosts written without ``user@`` (else ssh's own default)."""
    identity_file: str | None
    jump: str | None
    """ProxyJump host(s), ``ssh -J`` syntax."""
    known_hosts: str | None
    """UserKnownHostsFile (default: ssh's, the user's own)."""
    workdir: str
    """The workspace on every host: absolute, or relative to the login's home (``~/...``)."""
    python: str
    connect_timeout: int
    spares: tuple[HostSpec, ...] = ()
    """Hosts prepared like the others that take an excluded node's place (its node rank), in this order."""


def _hosts(reader: ClusterReader) -> tuple[tuple[HostSpec, ...], tuple[HostSpec, ...]]:
    """ssh.hosts and ssh.spares, each machine listed once across both."""
    seen: dict[tuple[str, int | None, str | None], str] = {}
    default_user = reader.get("ssh", "user")

    def listed(field: str) -> tuple[HostSpec, ...]:
        hosts: list[HostSpec] = []
        for index, text in enumerate(reader.get("ssh", field, default=[])):
            try:
                spec = parse_host(text)
            except HostError as exc:
                reader.problem(("ssh", field, index), f"{exc}, got {show_value(text)}")
                continue
            key = (spec.host, spec.port, spec.user or default_user)
            if key in seen:
                reader.problem(("ssh", field, index), f"{show_value(text)} is listed twice (first as {seen[key]});"
                                                      " one node runs per host, so list each host once")
            seen.setdefault(key, f"{field}[{index}]")
            hosts.append(spec)
        return tuple(hosts)

    return listed("hosts"), listed("spares")


def _workdir(reader: ClusterReader) -> str:
    value = reader.get("ssh", "workdir", default=DEFAULT_WORKDIR)
    if not plain_text(value) or (value.startswith("~") and value != "~" and not value.startswith("~/")):
        reader.problem(("ssh", "workdir"), f"expected a directory path (absolute, or ~/... in the login's home), "
                                           f"got {show_value(value)}")
        return DEFAULT_WORKDIR
    return str(value)


def _python(reader: ClusterReader) -> str:
    value = reader.get("ssh", "python", default=DEFAULT_PYTHON)
    if not plain_text(value) or value.startswith("-") or any(c.isspace() for c in value):
        reader.problem(("ssh", "python"), f"expected a command or an absolute path like /opt/conda/bin/python3, got "
                                          f"{show_value(value)}")
        return DEFAULT_PYTHON
    return str(value)


def _check_nodes(reader: ClusterReader, hosts: tuple[HostSpec, ...]) -> None:
    """Every node is a host: gpus.default_nodes (default: all of them) may use fewer, never more."""
    nodes = reader.get("gpus", "default_nodes")
    if nodes is not None and str(nodes).isdigit() and int(nodes) > len(hosts):
        reader.problem(("gpus", "default_nodes"), f"{nodes} nodes but ssh.hosts lists {len(hosts)}: one node runs "
                                                  "per host; list more hosts or lower gpus.default_nodes")


def parse(reader: ClusterReader) -> SshSettings:
    """The ssh backend's settings (BackendInfo.settings of ``ssh``)."""
    hosts, spares = _hosts(reader)
    if reader.get("ssh") is None:
        reader.problem(("ssh",), "backend ssh needs an ssh: section with its hosts (see clusters/lab.yaml)")
    else:
        _check_nodes(reader, hosts)
    return SshSettings(
        hosts=hosts,
        user=reader.get("ssh", "user"),
        identity_file=local_file(reader, "ssh", "identity_file"),
        jump=jump_hosts(reader, "ssh", "jump"),
        known_hosts=local_file(reader, "ssh", "known_hosts"),
        workdir=_workdir(reader),
        python=_python(reader),
        connect_timeout=reader.integer("ssh", "connect_timeout", default=DEFAULT_CONNECT_TIMEOUT, minimum=1,
                                       maximum=300) or DEFAULT_CONNECT_TIMEOUT,
        spares=spares,
    )
