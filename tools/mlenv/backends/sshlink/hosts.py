"""How a cluster file names a machine: ``host``, ``user@host``, ``host:port``, ``user@host:port``,
``ssh://user@host:port``, ``[v6addr]``/``[v6addr]:port`` and aliases from ~/.ssh/config (which ssh itself
resolves). ssh takes none of the ``:port`` forms on its command line: it gets ``-p PORT`` and ``user@host``.

Parsing is pure; :func:`resolve` asks ``ssh -G`` what ssh will really use (HostName, Port, User, known_hosts
files and identity files after ~/.ssh/config), for hints and doctor.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
"""A host name, an alias or an IPv4 address (never starting with '-', which ssh would read as an option)."""
USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
EXAMPLES = "host, user@host, user@host:port, ssh://user@host:port or [v6addr]:port"
RESOLVE_TIMEOUT = 10.0


class HostError(ValueError):
    """A host that is not in one of the accepted forms (the message says what is wrong)."""


@dataclass(frozen=True)
class HostSpec:
    """One machine as the cluster file names it."""

    host: str
    """A name, an alias from ~/.ssh/config, an IPv4 address or an IPv6 address (without brackets)."""
    user: str | None = None
    port: int | None = None

    @property
    def ipv6(self) -> bool:
        return ":" in self.host

    def destination(self, default_user: str | None = None) -> str:
        """``user@host`` (or ``host``) as ssh's destination argument."""
        user = self.user or default_user
        return f"{user}@{self.host}" if user else self.host

    def rsync_host(self, default_user: str | None = None) -> str:
        """The host part of an rsync destination (``user@[v6addr]`` keeps its brackets there)."""
        user = self.user or default_user
        host = f"[{self.host}]" if self.ipv6 else self.host
        return f"{user}@{host}" if user else host

    def display(self, default_user: str | None = None) -> str:
        """``user@host:port`` with what is known, as messages name the machine."""
        return self.rsync_host(default_user) + (f":{self.port}" if self.port else "")


def parse_host(text: object) -> HostSpec:
    """The machine named by ``text`` in one of the accepted forms; HostError saying why not."""
    if not isinstance(text, str) or not text:
        raise HostError(f"expected {EXAMPLES}")
    if any(char.isspace() or not char.isprintable() for char in text):
        raise HostError("a host cannot contain spaces or control characters")
    if text.startswith("-"):
        raise HostError("a host cannot start with '-' (ssh would read it as an option)")
    if "://" in text and not text.startswith("ssh://"):
        raise HostError(f"only ssh:// URLs are understood; expected {EXAMPLES}")
    bare = text.removeprefix("ssh://")
    address = bare.rpartition("@")[2]
    if not address.startswith("[") and address.count(":") > 1:
        raise HostError(f"write an IPv6 address in brackets: [{address}] or [{address}]:22")
    try:
        parts = urlsplit(f"ssh://{bare}")
    except ValueError as exc:  # unbalanced brackets, not an address in them
        raise HostError(f"{exc}; expected {EXAMPLES}") from None
    try:
        port = parts.port
    except ValueError:
        raise HostError(f"expected a port 1-65535 after ':', got {bare.rpartition(':')[2]!r}") from None
    if parts.path.strip("/") or parts.query or parts.fragment or "?" in bare or "#" in bare:
        raise HostError(f"unexpected path or query after the host; expected {EXAMPLES}")
    if parts.password is not None:
        raise HostError("a password in the host is not supported: ssh logs in with keys (BatchMode)")
    hostport = parts.netloc.rpartition("@")[2]
    host = _host(hostport)
    if port == 0 or hostport.endswith(":"):
        raise HostError("expected a port 1-65535 after ':'")
    return HostSpec(host=host, user=_user(parts.netloc), port=port)


def _user(netloc: str) -> str | None:
    if "@" not in netloc:
        return None
    user = netloc.rpartition("@")[0]
    if not USER.fullmatch(user):
        raise HostError(f"expected a user name of letters, digits, '.', '_' or '-' before '@', got {user!r}")
    return user


def _host(hostport: str) -> str:
    """The host of ``host``, ``host:port``, ``[v6]`` or ``[v6]:port``, brackets removed and case kept."""
    if hostport.startswith("["):
        address, _, rest = hostport[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise HostError(f"unexpected {rest!r} after ']'; expected [v6addr] or [v6addr]:port")
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            raise HostError(f"{address!r} in brackets is not an IPv6 address") from None
        return address
    host = hostport.rpartition(":")[0] if ":" in hostport else hostport
    if not NAME.fullmatch(host):
        raise HostError(f"expected a host name, alias or address of letters, digits, '.', '_' or '-', got {host!r}")
    return host


@dataclass(frozen=True)
class Resolved:
    """What ssh will use for a destination after every config file (``ssh -G``)."""

    hostname: str
    port: int
    user: str
    known_hosts: tuple[str, ...]
    identity_files: tuple[str, ...]

    @property
    def known_hosts_name(self) -> str:
        """How known_hosts (and ``ssh-keygen -R``) name the host: ``host``, or ``[host]:port`` off port 22."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def resolve(ssh_base: Sequence[str], destination: str) -> Resolved | None:
    """``ssh -G``'s answer for ``destination`` with the options of ``ssh_base`` (``ssh -F FILE -p PORT``);
    None when ssh cannot say (it then fails the same way when connecting)."""
    try:
        result = subprocess.run([*ssh_base, "-G", "--", destination], capture_output=True, text=True,
                                stdin=subprocess.DEVNULL, timeout=RESOLVE_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    values: dict[str, list[str]] = {}
    for line in result.stdout.splitlines():
        key, _, value = line.partition(" ")
        values.setdefault(key.lower(), []).append(value)
    try:
        return Resolved(values["hostname"][0], int(values["port"][0]), values["user"][0],
                        tuple(" ".join(values.get("userknownhostsfile", [])).split()),
                        tuple(values.get("identityfile", [])))
    except (KeyError, IndexError, ValueError):
        return None
