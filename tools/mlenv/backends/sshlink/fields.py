"""Cluster-file fields that every backend reaching machines over ssh reads alike (``ssh:``, ``slurm.ssh:``): the
local files ssh is handed and the jump hosts. Imported at validate time, so it imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlenv.backends.sshlink.hosts import HostError, parse_host
from mlenv.errors import show_value

if TYPE_CHECKING:
    from mlenv.config.reader import ClusterReader

DEFAULT_CONNECT_TIMEOUT = 10
"""Seconds ssh waits for a connection (ConnectTimeout) unless the file says otherwise."""


def plain_text(value: object) -> bool:
    """A non-empty printable string without a double quote (ssh_config quotes values with them)."""
    return isinstance(value, str) and bool(value) and all(c.isprintable() and c != '"' for c in value)


def local_file(reader: ClusterReader, *path: str) -> str | None:
    """A local file for ssh (identity_file, known_hosts): absolute or ``~/``, printable, no double quote
    (ssh_config quotes values with them)."""
    value = reader.get(*path)
    if value is None:
        return None
    if not plain_text(value) or not (value.startswith(("/", "~/"))):
        reader.problem(path, f"expected an absolute path or one starting with ~/, got {show_value(value)}")
        return None
    return str(value)


def jump_hosts(reader: ClusterReader, *path: str) -> str | None:
    """ProxyJump host(s), ``ssh -J`` syntax: each hop a host ssh can parse."""
    value = reader.get(*path)
    if value is None:
        return None
    for hop in str(value).split(","):
        try:
            parse_host(hop)
        except HostError as exc:
            reader.problem(path, f"{exc}, got {show_value(value)} (several hops: a,b)")
            return None
    return str(value)
